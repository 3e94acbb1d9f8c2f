"""What an EAGLE draft trains on: the target's hidden states and greedy tokens, cached in resumable chunks.

Two sources (``TrainOptions.data``):

- ``self`` (default; EAGLE-3 / SpecForge regenerate their training responses with the target):
  prompts from the training parts of the prompt sets (``corpus.prompt_set``, interleaved) are
  continued greedily by the target itself (batched, ``new_tokens`` each, stopping at the end of
  sequence), then the target runs once over prompt + continuation. Only the continuation's
  positions are trained on: at inference the draft only ever predicts the target's own greedy
  text, so that is what it learns;
- ``corpus``: the target runs over windows of a corpus's training part (teacher forcing on
  human text); every position is trained on.

A chunk file holds ``tokens`` (B, T), ``features`` (B, T, 3D) fp16 (the target's low, middle and
high layer outputs), ``labels`` (B, T) (the target's greedy token after each position) and
``mask`` (B, T) (which labels are trained on). Generated continuations are cached too, so an
interrupted run redoes at most one batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from paretolab.errors import ConfigError
from paretolab.generation import BatchedGenerator
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.speculative.corpus import available_sets, prompt_set, training_sequences
from paretolab.plugins.speculative.eagle import EagleConfig
from paretolab.plugins.speculative.generator import TargetFeatures

if TYPE_CHECKING:
    from paretolab.plugins.speculative.train import TrainOptions

SOURCES = ("self", "corpus")
DEFAULT_SETS = ("gsm8k", "wikitext2", "arithmetic", "pydoc")  # the ones whose files are missing are left out
CHUNK = 16  # sequences per feature file
FEATURE_BATCH = 8  # sequences per target forward when caching features
Progress = Callable[[str, int, int], None]


def data_folder(root: Path, options: TrainOptions, sets: list[str]) -> Path:
    if options.data == "corpus":
        return root / f"features-{Path(options.corpus).name}-T{options.seq_len}-N{options.max_tokens}"
    return root / f"self-{'+'.join(sets)}-P{options.prompts}-G{options.new_tokens}-T{options.seq_len}"


def resolve_sets(options: TrainOptions) -> list[str]:
    """The prompt sets a self-distilled draft trains on: the asked ones, or every default one with its data here."""
    if options.data not in SOURCES:
        raise ConfigError(f"draft training data must be one of {', '.join(SOURCES)}, got {options.data!r}")
    if options.data == "corpus":
        return []
    if options.prompt_sets:
        return list(options.prompt_sets)
    sets = available_sets(DEFAULT_SETS)
    if not sets:
        raise ConfigError("no prompt set to train the draft on; pass prompt sets explicitly (e.g. arithmetic,pydoc)")
    return sets


def cache_training_data(subject: Subject, options: TrainOptions, root: Path, progress: Progress | None = None) -> tuple[Path, list[str]]:
    """Write the chunk files of ``options.data`` under ``root`` (once; a rerun resumes); returns the folder and the sets."""
    sets = resolve_sets(options)
    folder = data_folder(root, options, sets)
    folder.mkdir(parents=True, exist_ok=True)
    if options.data == "corpus":
        ids = training_sequences(subject.tokenizer, corpus=options.corpus, seq_len=options.seq_len, max_tokens=options.max_tokens)
        rows = [(row.tolist(), 0) for row in ids]  # (sequence, first trained label position)
    else:
        rows = _self_sequences(subject, options, sets, folder, progress)
    _cache_features(subject, rows, options.seq_len, folder, progress)
    return folder, sets


def _interleaved_prompts(subject: Subject, sets: list[str], n: int, length: int) -> list[list[int]]:
    per_set = [prompt_set(subject.tokenizer, name, "train", -(-n // len(sets)), length=length) for name in sets]
    out = [prompts[i] for i in range(len(per_set[0])) for prompts in per_set if i < len(prompts)]
    return out[:n]


def _self_sequences(subject: Subject, options: TrainOptions, sets: list[str], folder: Path, progress: Progress | None) -> list[tuple[list[int], int]]:
    """(prompt + greedy continuation, len(prompt)) for every training prompt; continuations cached per batch."""
    prompts = _interleaved_prompts(subject, sets, options.prompts, options.prompt_tokens)
    eos = getattr(subject.tokenizer, "eos_token_id", None)
    stop = [eos] if eos is not None else []
    batches = [prompts[i : i + options.gen_batch] for i in range(0, len(prompts), options.gen_batch)]
    rows: list[tuple[list[int], int]] = []
    for index, batch in enumerate(batches):
        path = folder / f"generated_{index:04d}.pt"
        if path.is_file():
            continuations = torch.load(path, weights_only=True)["continuations"]
        else:
            out = BatchedGenerator(batch_size=len(batch)).generate(subject, batch, max_new_tokens=options.new_tokens, stop_ids=stop)
            continuations = out.sequences
            _save_atomic({"continuations": continuations}, path)
        rows += [(list(prompt) + list(cont), len(prompt)) for prompt, cont in zip(batch, continuations, strict=True)]
        if progress:
            progress("target's greedy continuations", index + 1, len(batches))
    return rows


def _cache_features(subject: Subject, rows: list[tuple[list[int], int]], seq_len: int, folder: Path, progress: Progress | None) -> None:
    """Chunk files of (tokens, features, labels, mask); a row is cut to its last ``seq_len`` tokens."""
    config = EagleConfig.for_target(subject.model)
    model = subject.model.eval()
    chunks = [rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)]
    with TargetFeatures(model, config.feature_layers) as watch, torch.no_grad():
        for index, chunk in enumerate(chunks):
            path = folder / f"chunk_{index:04d}.pt"
            if not path.is_file():
                parts = [_features(model, watch, config, chunk[i : i + FEATURE_BATCH], seq_len, subject.device) for i in range(0, len(chunk), FEATURE_BATCH)]
                _save_atomic({key: torch.cat([p[key] for p in parts]) for key in parts[0]}, path)
            if progress:
                progress("target features", index + 1, len(chunks))


def _features(model: Any, watch: TargetFeatures, config: EagleConfig, rows: list[tuple[list[int], int]], seq_len: int,
              device: torch.device) -> dict[str, torch.Tensor]:
    cut = [(ids[-seq_len:], max(0, first - max(0, len(ids) - seq_len))) for ids, first in rows]
    width = seq_len  # one width for every chunk: training batches stack rows of different chunks
    tokens = torch.zeros((len(cut), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(cut), width), dtype=torch.bool, device=device)
    for i, (ids, first) in enumerate(cut):  # right padding: causal attention keeps it out of the real positions
        tokens[i, : len(ids)] = torch.tensor(ids, dtype=torch.long, device=device)
        mask[i, first : len(ids)] = True  # label j (the token after position j) is trained on for continuation positions
    logits = model(input_ids=tokens, use_cache=False).logits
    features = torch.cat([watch.outputs[i] for i in config.feature_layers], dim=-1)
    return {"tokens": tokens.int().cpu(), "features": features.half().cpu(), "labels": logits.argmax(-1).int().cpu(), "mask": mask.cpu()}


def _save_atomic(payload: dict[str, Any], path: Path) -> None:
    tmp = path.with_suffix(".part")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_chunks(folder: Path) -> list[dict[str, torch.Tensor]]:
    """Every chunk of a data folder, in order; chunks of the old corpus format get an all-true mask."""
    chunks = []
    for path in sorted(folder.glob("chunk_*.pt")):
        chunk = torch.load(path, weights_only=True)
        chunk.setdefault("mask", torch.ones_like(chunk["labels"], dtype=torch.bool))
        chunks.append(chunk)
    return chunks
