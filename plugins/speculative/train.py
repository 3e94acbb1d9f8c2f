"""Train an EAGLE draft on CPU from cached target hidden states; save and load it under the cache dir.

Two phases, each resumable:
1. features: the target runs once over training windows of the corpus; the outputs of its low,
   middle and high layers and its greedy next tokens are written in chunks
   (``<cache>/drafts/<model>/features-<corpus>-T<len>/``), so a rerun picks up where it stopped;
2. training: the draft learns the target's greedy tokens with a training-time-test rollout of
   ``ttt_steps`` steps, for a wall-clock budget; the checkpoint (``eagle.pt``) is replaced
   atomically every minute and at the end, and a later run continues from it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from paretolab.data import cache_dir
from paretolab.errors import ConfigError, first_line
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.speculative.corpus import training_sequences
from paretolab.plugins.speculative.eagle import (
    EagleConfig,
    EagleDraft,
    LoadedDraft,
    init_scale,
    ttt_mask,
)
from paretolab.plugins.speculative.generator import TargetFeatures

CHUNK = 4  # sequences per feature file
STEP_WEIGHT = 0.8  # EAGLE-3's per-step loss decay


@dataclass(frozen=True)
class TrainOptions:
    budget_min: float = 15.0  # wall-clock minutes of optimisation in this run (features not included)
    corpus: str = "pydoc"  # training part only (see corpus.py); never the held-out prompts
    max_tokens: int = 32768  # target tokens whose hidden states are cached
    seq_len: int = 256
    vocab: int = 4096  # draft vocabulary: the target's most frequent greedy tokens on the corpus
    ttt_steps: int = 3  # training-time-test rollout length
    batch: int = 2  # sequences per optimiser step
    lr: float = 1e-3
    seed: int = 0
    fresh: bool = False  # ignore an existing checkpoint


def draft_dir(model_name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    return cache_dir() / "drafts" / safe


def draft_path(model_name: str) -> Path:
    """Where the EAGLE draft for ``model_name`` is kept."""
    return draft_dir(model_name) / "eagle.pt"


def missing_draft_message(model_name: str) -> str:
    return (
        f"no EAGLE draft for model {model_name!r} at {draft_path(model_name)}; train one with "
        f"`paretolab draft train --model {model_name}` (about 15 minutes on a CPU), or use speculative.draft=self"
    )


def load_draft(model_name: str, target: torch.nn.Module) -> LoadedDraft:
    """The cached draft for ``model_name``, checked against the target's shape."""
    path = draft_path(model_name)
    if not path.is_file():
        raise ConfigError(missing_draft_message(model_name))
    saved = _load_checkpoint(path)
    config = EagleConfig(**{**saved["config"], "feature_layers": tuple(saved["config"]["feature_layers"])})
    expected = EagleConfig.for_target(target)
    if (config.hidden, config.feature_layers) != (expected.hidden, expected.feature_layers):
        raise ConfigError(
            f"the draft at {path} was trained for width {config.hidden} and layers {config.feature_layers}, but model "
            f"{model_name!r} has {expected.hidden} and {expected.feature_layers}; retrain it with `paretolab draft train --model {model_name} --fresh`"
        )
    device = next(target.parameters()).device
    with torch.device(device):  # built where the target runs, not on the CPU and copied
        draft = EagleDraft(config)
    draft.load_state_dict(saved["state"])
    return LoadedDraft(draft, saved["vocab"].to(device), saved["meta"])


def _load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint's tensors and plain data, read with ``weights_only=True``: a crafted file cannot run code here."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = first_line(exc)
        raise ConfigError(
            f"the draft at {path} holds more than tensors and plain data, so it is not loaded ({reason}); "
            "delete it or retrain with `paretolab draft train --fresh`"
        ) from None


def cache_features(subject: Subject, options: TrainOptions, progress: Callable[[int, int], None] | None = None) -> Path:
    """Write (tokens, features, greedy labels) of the target on the training windows, in resumable chunks."""
    config = EagleConfig.for_target(subject.model)
    folder = draft_dir(subject.model_name) / f"features-{Path(options.corpus).name}-T{options.seq_len}-N{options.max_tokens}"
    folder.mkdir(parents=True, exist_ok=True)
    sequences = training_sequences(subject.tokenizer, corpus=options.corpus, seq_len=options.seq_len, max_tokens=options.max_tokens)
    chunks = sequences.split(CHUNK)
    model = subject.model.eval()
    with TargetFeatures(model, config.feature_layers) as watch, torch.no_grad():
        for index, ids in enumerate(chunks):
            path = folder / f"chunk_{index:04d}.pt"
            if not path.is_file():
                logits = model(input_ids=ids.to(subject.device), use_cache=False).logits
                features = torch.cat([watch.outputs[i] for i in config.feature_layers], dim=-1)
                payload = {"tokens": ids.int(), "features": features.half().cpu(), "labels": logits.argmax(-1).int().cpu()}
                tmp = path.with_suffix(".part")
                torch.save(payload, tmp)
                os.replace(tmp, path)
            if progress:
                progress(index + 1, len(chunks))
    return folder


def _load_chunks(folder: Path, count: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(folder / f"chunk_{i:04d}.pt", weights_only=True) for i in range(count)]


def ttt_forward(draft: EagleDraft, emb: torch.Tensor, g: torch.Tensor, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(hidden, normed) of each training-time-test step over a batch (B, T, D).

    Step 0 reads the target's projected features ``g``; step s reads the step s-1 output of the
    previous position, and attends through ``ttt_mask`` to what the inference chain would hold.
    """
    positions = torch.arange(emb.shape[-2], device=emb.device)
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    out = []
    for step in range(steps):
        residual, q, k, v = draft.keys_values(draft.inputs(emb, g), positions)
        keys.append(k)
        values.append(v)
        hidden, normed = draft.finish(residual, q, torch.cat(keys, -2), torch.cat(values, -2), ttt_mask(emb.shape[-2], step))
        out.append((hidden, normed))
        g = torch.cat([torch.zeros_like(hidden[..., :1, :]), hidden[..., :-1, :]], dim=-2)
    return out


def ttt_loss(draft: EagleDraft, embed: torch.Tensor, head: torch.Tensor, to_draft: torch.Tensor, batch: dict[str, torch.Tensor], steps: int) -> tuple[torch.Tensor, list[float]]:
    """EAGLE-3's weighted cross-entropy over the rollout steps, and each step's top-1 agreement with the target."""
    tokens, labels = batch["tokens"].long(), to_draft[batch["labels"].long()]
    # position t reads the target feature at t and token t+1; its label is the target's greedy token after t+1
    emb, g = embed[tokens[:, 1:]], draft.fc(batch["features"].float()[:, :-1])
    target = labels[:, 1:]  # (B, T')
    total = torch.zeros((), device=embed.device)
    accuracy: list[float] = []
    for step, (_, normed) in enumerate(ttt_forward(draft, emb, g, steps)):
        logits = normed @ head.T  # (B, T', V_d)
        valid = target.clone()
        valid[:, :step] = -100  # no real chain behind these rows
        total = total + STEP_WEIGHT**step * F.cross_entropy(logits.flatten(0, 1), valid.flatten(), ignore_index=-100)
        seen = valid != -100
        accuracy.append(float((logits.argmax(-1) == valid)[seen].float().mean()) if seen.any() else 0.0)
    return total, accuracy


def train_draft(subject: Subject, options: TrainOptions, *, log: Callable[[str], None] = print, show_progress: bool = True) -> Path:
    """Cache features (once), then train or continue the draft for ``budget_min`` minutes; returns the checkpoint path."""
    from tqdm import tqdm

    bar = tqdm(total=None, desc="target features", unit="chunk", disable=not show_progress, dynamic_ncols=True)

    def feature_progress(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    folder = cache_features(subject, options, feature_progress)
    bar.close()
    count = len(list(folder.glob("chunk_*.pt")))
    chunks = _load_chunks(folder, count)
    held_out = chunks[-1] if count > 1 else None
    train = chunks[:-1] if count > 1 else chunks
    model = subject.model
    config = EagleConfig.for_target(model)
    path = draft_path(subject.model_name)
    torch.manual_seed(options.seed)
    with torch.device("cpu"):  # drafts train on the CPU (the embeddings and head are copied there below)
        draft = EagleDraft(config)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=options.lr, weight_decay=0.0)
    meta: dict[str, Any] = {"steps": 0, "tokens": 0, "train_s": 0.0, "corpus": options.corpus, "ttt_steps": options.ttt_steps}
    vocab = None
    if path.is_file() and not options.fresh:
        saved = _load_checkpoint(path)
        draft.load_state_dict(saved["state"])
        optimizer.load_state_dict(saved["optimizer"])
        vocab, meta = saved["vocab"], saved["meta"]
        log(f"continuing the draft at {path} ({meta['steps']} steps, {meta['train_s'] / 60:.1f} min so far)")
    else:
        init_scale(draft)
        final_norm = getattr(getattr(model, "model", None), "norm", None)
        if final_norm is not None and getattr(final_norm, "weight", None) is not None and final_norm.weight.shape == draft.norm.weight.shape:
            with torch.no_grad():  # start with the target's output scale in front of its LM head
                draft.norm.weight.copy_(final_norm.weight)
    if vocab is None:
        counts = torch.bincount(torch.cat([c["labels"].flatten().long() for c in train]), minlength=model.config.vocab_size)
        vocab = torch.argsort(counts, descending=True)[: min(options.vocab, int((counts > 0).sum()))].sort().values
    to_draft = torch.full((model.config.vocab_size,), -100, dtype=torch.long, device="cpu")  # training runs on the CPU
    to_draft[vocab] = torch.arange(len(vocab), device="cpu")
    embed = model.get_input_embeddings().weight.detach().float().cpu()
    head = model.get_output_embeddings().weight.detach().float().cpu()[vocab]
    sequences = [(c, i) for c in train for i in range(c["tokens"].shape[0])]
    generator = torch.Generator().manual_seed(options.seed + meta["steps"])
    budget_s = options.budget_min * 60
    start = last_save = time.perf_counter()
    bar = tqdm(total=int(budget_s), desc="draft training", unit="s", disable=not show_progress, dynamic_ncols=True)
    draft.train()
    running: list[float] = []
    while time.perf_counter() - start < budget_s:
        pick = torch.randint(len(sequences), (options.batch,), generator=generator, device="cpu").tolist()
        batch = {key: torch.stack([sequences[i][0][key][sequences[i][1]] for i in pick]) for key in ("tokens", "features", "labels")}
        warmup = min(1.0, (meta["steps"] + 1) / 20)
        for group in optimizer.param_groups:
            group["lr"] = options.lr * warmup
        loss, accuracy = ttt_loss(draft, embed, head, to_draft, batch, options.ttt_steps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        meta["steps"] += 1
        meta["tokens"] += int(batch["tokens"].numel())
        running = (running + [accuracy[0]])[-20:]
        elapsed = time.perf_counter() - start
        bar.n = min(int(elapsed), bar.total)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", acc0=f"{sum(running) / len(running):.2f}", steps=meta["steps"])
        if time.perf_counter() - last_save > 60:
            _save(path, draft, optimizer, vocab, config, {**meta, "train_s": meta["train_s"] + elapsed})
            last_save = time.perf_counter()
    bar.close()
    meta["train_s"] += time.perf_counter() - start
    if held_out is not None:
        draft.eval()
        with torch.no_grad():
            _, accuracy = ttt_loss(draft, embed, head, to_draft, held_out, options.ttt_steps)
        meta["heldout_step_acc"] = [round(a, 4) for a in accuracy]
        log(f"held-out top-1 agreement with the target per draft step: {', '.join(f'{a:.3f}' for a in accuracy)}")
    meta["vocab_coverage"] = float((to_draft[torch.cat([c['labels'].flatten().long() for c in chunks])] >= 0).float().mean())
    _save(path, draft, optimizer, vocab, config, meta)
    log(f"draft saved to {path}: {meta['steps']} steps, {meta['tokens']} tokens, {meta['train_s'] / 60:.1f} min of training in all")
    return path


def _save(path: Path, draft: EagleDraft, optimizer: torch.optim.Optimizer, vocab: torch.Tensor, config: EagleConfig, meta: dict[str, Any]) -> None:
    """Replace the checkpoint atomically: a finished checkpoint is never half-overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    torch.save({"config": config.to_dict(), "state": draft.state_dict(), "optimizer": optimizer.state_dict(), "vocab": vocab, "meta": meta}, tmp)
    os.replace(tmp, path)


