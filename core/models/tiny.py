"""The tiny random-initialised Llama of tests and smoke runs, and the byte-level tokenizer it uses."""

from __future__ import annotations

from typing import Any

import torch

from paretolab.models.source import ModelSource
from paretolab.plugin_api.subject import Subject


class TinyLlama(ModelSource):
    """A random-initialised 2-layer Llama with a byte-level tokenizer, seeded: for tests and smoke runs."""

    name = "tiny-llama"
    description = "random-init Llama (2 layers, hidden 64, byte vocabulary), seeded; for tests and smoke runs"
    weights = "random init"
    vocab_size = 258  # len(byte_tokenizer()): the 256 byte symbols, bos and eos

    def __init__(self, *, seed: int = 0, layers: int = 2, hidden: int = 64) -> None:
        self.seed, self.layers, self.hidden = seed, layers, hidden

    def load(self) -> Subject:
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = byte_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden,
            intermediate_size=self.hidden * 2,
            num_hidden_layers=self.layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=True,
        )
        with seeded(self.seed):
            model = LlamaForCausalLM(config)
        model.eval()
        return Subject(model=model, tokenizer=tokenizer, model_name=self.name)


def byte_tokenizer() -> Any:
    """A real HF fast tokenizer over the 256 bytes (+ bos/eos), needing no files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_map = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_map))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    return tokenizer


class seeded:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.random.set_rng_state(self.state)
