"""Models to train from scratch: seeded random-init LLaMA-style presets on the pystdlib BPE tokenizer.

``scratch-1m`` / ``scratch-5m`` / ``scratch-15m`` grow in width and depth; ``scratch-deep`` is
scratch-1m's width at 16 layers (for checks that depend on depth, e.g. hidden-state variance).
All are ``transformers.LlamaForCausalLM`` (SwiGLU MLP, RoPE, RMSNorm, tied embeddings, SDPA
attention) in fp32, so every task, measure and method that works on a Hugging Face Llama works
on them. Trained checkpoints saved by the ``train`` stage come back as model sources too
(:mod:`paretolab.training.checkpoints`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from paretolab.models import ModelSource, seeded
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.subject import Subject
from paretolab.training.tokenizer import VOCAB_SIZE, pystdlib_tokenizer, tokenizer_path


@dataclass(frozen=True)
class Shape:
    """The architecture of a preset (head_dim = hidden / heads)."""

    hidden: int
    layers: int
    heads: int
    intermediate: int  # SwiGLU inner width
    kv_heads: int | None = None  # None: as many as heads (multi-head attention)

    def config(self, tokenizer: object, vocab_size: int = VOCAB_SIZE) -> object:
        from transformers import LlamaConfig

        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads or self.heads,
            hidden_act="silu",
            max_position_embeddings=2048,
            rope_theta=10000.0,
            rms_norm_eps=1e-5,
            initializer_range=0.02,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,  # type: ignore[attr-defined]
            eos_token_id=tokenizer.eos_token_id,  # type: ignore[attr-defined]
            pad_token_id=tokenizer.pad_token_id,  # type: ignore[attr-defined]
            attn_implementation="sdpa",
            dtype="float32",
        )
        return config


class ScratchModel(ModelSource):
    """A seeded random-init Llama of a fixed shape on the pystdlib BPE tokenizer; ``pull`` trains the tokenizer once."""

    weights = "random init"
    vocab_size = VOCAB_SIZE

    def __init__(self, name: str, shape: Shape, params: int, note: str = "", *, seed: int = 0) -> None:
        self.name, self.shape, self.params, self.seed = name, shape, params, seed
        s = shape
        self.description = (
            f"{params:,} parameters: random-init Llama ({s.layers} layers, hidden {s.hidden}, {s.heads} heads, "
            f"SwiGLU {s.intermediate}, tied embeddings, vocab {VOCAB_SIZE} byte-level BPE trained on pystdlib-train), "
            f"seeded {seed}, fp32{note}"
        )

    def is_cached(self) -> bool:
        return tokenizer_path().is_file()

    def pull(self) -> str:
        pystdlib_tokenizer()
        return str(tokenizer_path())

    def load(self) -> Subject:
        from transformers import LlamaForCausalLM

        tokenizer = pystdlib_tokenizer()
        with seeded(self.seed):
            model = LlamaForCausalLM(self.shape.config(tokenizer))
        model.eval()
        return Subject(model=model, tokenizer=tokenizer, model_name=self.name)


# name -> (shape, exact parameter count with tied embeddings, note); tests check the counts
PRESETS: dict[str, tuple[Shape, int, str]] = {
    "scratch-1m": (Shape(hidden=128, layers=3, heads=4, intermediate=288), 1_053_568, "; for tests"),
    "scratch-5m": (Shape(hidden=256, layers=5, heads=4, intermediate=704), 5_065_472, ""),
    "scratch-15m": (Shape(hidden=384, layers=8, heads=6, intermediate=960), 15_145_344, ""),
    "scratch-deep": (Shape(hidden=128, layers=16, heads=4, intermediate=288), 3_346_560, "; thin and deep (scratch-1m's width)"),
}


class SmolVocabScratch(ScratchModel):
    """A random-init Llama on SmolLM2-135M's tokenizer (49,152 tokens), so that a SmolLM2 teacher's logits index the student's vocabulary.

    With so large a vocabulary the tied embedding dominates a small model: scratch-smol is scratch-1m's
    body (0.53 M parameters) under a 6.29 M-parameter embedding, and its LM head costs more per token than its layers.
    """

    def __init__(self, name: str, shape: Shape, params: int, note: str = "", *, seed: int = 0) -> None:
        super().__init__(name, shape, params, note, seed=seed)
        self.vocab_size = SMOL_VOCAB_SIZE
        s = shape
        self.description = (
            f"{params:,} parameters: random-init Llama ({s.layers} layers, hidden {s.hidden}, {s.heads} heads, SwiGLU {s.intermediate}, "
            f"tied embeddings) on SmolLM2-135M's tokenizer (vocab {SMOL_VOCAB_SIZE:,}; the embedding is {SMOL_VOCAB_SIZE * s.hidden:,} of the "
            f"parameters), seeded {seed}, fp32{note}"
        )

    def _teacher(self) -> ModelSource:
        from paretolab.models import SmolLM2

        return SmolLM2()

    def is_cached(self) -> bool:
        return self._teacher().is_cached()

    def check(self) -> None:
        self._teacher().check()

    def pull(self) -> str:
        return self._teacher().pull()

    def load(self) -> Subject:
        from transformers import AutoTokenizer, LlamaForCausalLM

        tokenizer = AutoTokenizer.from_pretrained(self.pull())
        with seeded(self.seed):
            model = LlamaForCausalLM(self.shape.config(tokenizer, vocab_size=len(tokenizer)))
        model.eval()
        return Subject(model=model, tokenizer=tokenizer, model_name=self.name)


SMOL_VOCAB_SIZE = 49_152
# name -> (shape, exact parameter count with tied embeddings, note): students of a SmolLM2-135M teacher
SMOL_PRESETS: dict[str, tuple[Shape, int, str]] = {
    "scratch-smol": (Shape(hidden=128, layers=3, heads=4, intermediate=288), 6_820_736, "; a distillation student of smollm2-135m"),
}


def presets() -> list[ScratchModel]:
    return [ScratchModel(name, shape, params, note) for name, (shape, params, note) in PRESETS.items()] + [
        SmolVocabScratch(name, shape, params, note) for name, (shape, params, note) in SMOL_PRESETS.items()
    ]


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    from paretolab.training.checkpoints import trained_sources

    for source in presets():
        register(source)
    for trained in trained_sources():  # save_as refuses the names above; a hand-made folder of one is a duplicate error
        register(trained)
