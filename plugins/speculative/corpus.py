"""Text for the draft: training text and held-out prompts never overlap.

A corpus (the built-in pydoc, wikitext2, any text file) is split by characters: the first 90%
trains drafts, the last 10% gives the prompts on which speculative decoding is measured.

Prompt sets (:func:`prompt_set`) name what a draft is trained on and measured on, each with a
``train`` and an ``eval`` part that share nothing:

- ``gsm8k``: GSM8K questions in the tokenizer's chat template (the model answers with its own
  worked arithmetic); rows 0-999 train, rows 1000- evaluate. Needs the data file.
- ``arithmetic``: the arithmetic task's generated problems (levels 3-5) in the chat template,
  from different seeds for train and eval; needs no files.
- any corpus name (``pydoc``, ``wikitext2``, a path): plain-text windows of ``length`` tokens to
  continue, from the corpus's training or held-out part.
"""

from __future__ import annotations

import random
from typing import Any

import torch

from paretolab.data import encode, load_corpus, read_jsonl
from paretolab.errors import ConfigError

TRAIN_FRACTION = 0.9
SPLITS = ("train", "eval")
GSM8K_TRAIN_ROWS = 1000  # rows [0, 1000) train drafts, the rest evaluate them
ARITHMETIC_LEVELS = (3, 4, 5)
CHAT_SETS = ("gsm8k", "arithmetic")


def split_corpus(corpus: str) -> tuple[str, str]:
    """(training text, held-out text) of a corpus (built-in name or path)."""
    text, _ = load_corpus(corpus)
    cut = int(len(text) * TRAIN_FRACTION)
    return text[:cut], text[cut:]


def heldout_prompts(tokenizer: Any, *, corpus: str = "pydoc", n: int = 4, length: int = 64) -> list[list[int]]:
    """``n`` prompts of ``length`` tokens cut at evenly spaced offsets from the held-out part of ``corpus``."""
    return prompt_set(tokenizer, corpus, "eval", n, length=length)


def training_sequences(tokenizer: Any, *, corpus: str = "pydoc", seq_len: int = 256, max_tokens: int = 32768) -> torch.Tensor:
    """(N, seq_len) consecutive windows of the training part of ``corpus``, at most ``max_tokens`` tokens in all."""
    ids = torch.tensor(encode(tokenizer, split_corpus(corpus)[0]), dtype=torch.long, device="cpu")  # callers move batches
    n = min(len(ids) // seq_len, max(1, max_tokens // seq_len))
    if n < 1:
        raise ValueError(f"corpus {corpus!r} has {len(ids)} training tokens, fewer than seq_len={seq_len}")
    # windows spread over the whole text, not just its beginning
    starts = torch.linspace(0, len(ids) - seq_len, n, device="cpu").long()
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])


def prompt_set(tokenizer: Any, name: str, split: str, n: int, *, length: int = 64) -> list[list[int]]:
    """``n`` prompts of set ``name`` from its ``split`` ("train" or "eval"); see the module docstring."""
    if split not in SPLITS:
        raise ConfigError(f"prompt split must be one of {', '.join(SPLITS)}, got {split!r}")
    if n < 1:
        raise ConfigError(f"a prompt set needs n >= 1 prompts, got {n}")
    if name in CHAT_SETS:
        return [_chat(tokenizer, question) for question in _questions(name, split, n)]
    text = split_corpus(name)[0 if split == "train" else 1]
    ids = encode(tokenizer, text)
    if len(ids) < n * length:
        raise ConfigError(f"the {split} part of corpus {name!r} has {len(ids)} tokens, fewer than {n} prompts x {length}")
    step = len(ids) // n
    return [ids[i * step : i * step + length] for i in range(n)]


def _questions(name: str, split: str, n: int) -> list[str]:
    if name == "gsm8k":
        rows = read_jsonl("gsm8k", folder="gsm8k")
        part = rows[:GSM8K_TRAIN_ROWS] if split == "train" else rows[GSM8K_TRAIN_ROWS:]
        if len(part) < n:
            raise ConfigError(f"prompt set gsm8k has {len(part)} {split} rows, fewer than the {n} asked for")
        return [row["question"] for row in part[:n]]
    from paretolab.tasks.generation import arithmetic_problem

    rng = random.Random(f"speculative-{split}")
    return [arithmetic_problem(rng, ARITHMETIC_LEVELS[i % len(ARITHMETIC_LEVELS)]).question for i in range(n)]


def _chat(tokenizer: Any, question: str) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):  # a base model: a plain question/answer frame
        return encode(tokenizer, f"Question: {question}\nAnswer:")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids)


def available_sets(names: tuple[str, ...]) -> list[str]:
    """The sets among ``names`` whose data can be found here (gsm8k and wikitext2 need files)."""
    out = []
    for name in names:
        try:
            if name == "gsm8k":
                read_jsonl("gsm8k", folder="gsm8k")
            elif name not in CHAT_SETS:
                load_corpus(name)
        except (ConfigError, OSError):
            continue
        out.append(name)
    return out
