"""Train an EAGLE draft on CPU from cached target hidden states; save and load it under the cache dir.

Two phases, each resumable:
1. data (``train_data.py``): by default the target continues training prompts greedily and runs
   once over prompt + continuation (self-distillation, as EAGLE-3 / SpecForge do); or it runs over
   corpus windows (``data="corpus"``). Hidden states of its low, middle and high layers and its
   greedy next tokens are written in chunks under ``<cache>/drafts/<model>/``;
2. training: the draft learns the target's greedy tokens with a training-time-test rollout of
   ``ttt_steps`` steps, for a wall-clock budget; the checkpoint (``eagle.pt``) is replaced
   atomically every minute and at the end, and a later run continues from it.

At the end of every run the draft is scored on a held-out chunk (never trained on): top-1
agreement with the target at each draft step, and the accepted length a chain of k drafts would
get, for k = 1..``EVAL_STEPS``, exactly as the generator verifies (the rollout replays the
inference chain). Each run appends these, with the training tokens seen so far, to the
checkpoint's ``meta["curve"]``: accepted length against training tokens.
"""

from __future__ import annotations

import math
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
from paretolab.plugins.speculative.eagle import (
    EagleConfig,
    EagleDraft,
    LoadedDraft,
    init_from_target,
    init_scale,
    ttt_mask,
)
from paretolab.plugins.speculative.train_data import cache_training_data, load_chunks

STEP_WEIGHT = 0.8  # EAGLE-3's per-step loss decay
EVAL_STEPS = 6  # draft steps the held-out score covers (chains of k = 1..6)
HELD_OUT_CHUNKS = 2  # chunks at the end of the data never trained on (1 when the data is small)


@dataclass(frozen=True)
class TrainOptions:
    budget_min: float = 15.0  # wall-clock minutes of optimisation in this run (features not included)
    data: str = "self"  # "self": the target's greedy continuations of training prompts; "corpus": corpus windows
    prompt_sets: tuple[str, ...] = ()  # data="self": prompt sets (corpus.prompt_set); () = every default set with data here
    prompts: int = 1024  # data="self": training prompts, spread evenly over the sets
    prompt_tokens: int = 64  # data="self": length of a plain-text prompt (chat prompts are whole questions)
    new_tokens: int = 128  # data="self": greedy tokens the target writes per prompt
    gen_batch: int = 32  # data="self": prompts the target continues at once
    corpus: str = "pydoc"  # data="corpus": training part only (see corpus.py); never the held-out prompts
    max_tokens: int = 32768  # data="corpus": target tokens whose hidden states are cached
    seq_len: int = 256  # tokens per training row (self: prompt + continuation, cut to its last seq_len)
    vocab: int = 4096  # draft vocabulary: the target's most frequent greedy tokens on the corpus
    ttt_steps: int = 3  # training-time-test rollout length
    batch: int = 4  # sequences per optimiser step
    lr: float = 3e-3  # peak; each run decays it to a tenth (cosine), so a continued run restarts the schedule
    init: str = "target"  # "target": the draft's layer starts as the target's last decoder layer; "random"
    seed: int = 0
    fresh: bool = False  # ignore an existing checkpoint


def draft_dir(model_name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model_name)
    return cache_dir() / "drafts" / safe


def draft_path(model_name: str) -> Path:
    """Where the EAGLE draft for ``model_name`` is kept."""
    return draft_dir(model_name) / "eagle.pt"


def draft_finished(model_name: str) -> bool:
    """Whether the draft's checkpoint ended a training run (its held-out score is in ``meta["curve"]``).

    The checkpoint is also written every minute while a run trains: one cut mid-budget has no curve
    yet, and ``draft train --if-missing`` continues it instead of taking it for a finished draft.
    """
    path = draft_path(model_name)
    return path.is_file() and bool(_load_checkpoint(path).get("meta", {}).get("curve"))


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


def ttt_loss(draft: EagleDraft, embed: torch.Tensor, head: torch.Tensor, to_draft: torch.Tensor, batch: dict[str, torch.Tensor],
             steps: int) -> tuple[torch.Tensor, list[float]]:
    """EAGLE-3's weighted cross-entropy over the rollout steps, and each step's top-1 agreement with the target.

    Hard labels (the target's greedy tokens). Tried and dropped here: soft labels (the target's
    distribution over the draft vocabulary) plus EAGLE-1's feature regression, held-out top-1 0.38
    against 0.42 for hard labels after 6 minutes of the same recipe on SmolLM2.
    """
    total = torch.zeros((), device=embed.device)
    accuracy: list[float] = []
    for step, (_, logits, target) in enumerate(_rollout(draft, embed, head, to_draft, batch, steps)):
        total = total + STEP_WEIGHT**step * F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100)
        seen = target != -100
        accuracy.append(float((logits.argmax(-1) == target)[seen].float().mean()) if seen.any() else 0.0)
    return total, accuracy


def _rollout(draft: EagleDraft, embed: torch.Tensor, head: torch.Tensor, to_draft: torch.Tensor, batch: dict[str, torch.Tensor],
             steps: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(normed state (B, T', D), logits (B, T', V_d), target (B, T')) of each rollout step; target -100 where nothing is trained on."""
    tokens, labels = batch["tokens"].long(), to_draft[batch["labels"].long()]
    labels = labels.masked_fill(~batch["mask"], -100) if "mask" in batch else labels
    # position t reads the target feature at t and token t+1; its label is the target's greedy token after t+1
    emb, g = embed[tokens[:, 1:]], draft.fc(batch["features"].float()[:, :-1])
    out = []
    for step, (_, normed) in enumerate(ttt_forward(draft, emb, g, steps)):
        target = labels[:, 1:].clone()
        target[:, :step] = -100  # no real chain behind these rows
        out.append((normed, normed @ head.T, target))
    return out


@torch.no_grad()
def chain_scores(draft: EagleDraft, embed: torch.Tensor, head: torch.Tensor, to_draft: torch.Tensor, batch: dict[str, torch.Tensor],
                 steps: int = EVAL_STEPS) -> dict[str, list[float]]:
    """Top-1 agreement per draft step, and the accepted length of a chain of k drafts for k = 1..steps.

    Step s at row t is the s-th draft of the chain that started at row t - s, so the chain from
    row t0 accepts drafts while steps 0, 1, ... agree with the target at rows t0, t0 + 1, ...;
    a verify then emits the accepted drafts plus the target's own token. Chains are counted from
    every trained row whose first ``steps`` rows are all trained on.
    """
    rolled = _rollout(draft, embed, head, to_draft, batch, steps)
    target = rolled[0][2]
    hits = torch.stack([logits.argmax(-1) == target for _, logits, _ in rolled])  # (S, B, T'): step s right at row t
    length = target.shape[1] - steps + 1
    trained = target != -100
    starts = torch.stack([trained[:, s : s + length] for s in range(steps)]).all(0)  # a whole chain's rows are trained on
    run = torch.ones_like(starts)
    accepted = []
    for s in range(steps):
        run = run & hits[s][:, s : s + length]
        accepted.append(run[starts].float().mean().item() if starts.any() else 0.0)
    top1 = [float(hits[s][target != -100].float().mean()) for s in range(steps)]  # row t's step-s draft vs the target, chain or not
    tau = [1.0 + sum(accepted[:k]) for k in range(1, steps + 1)]
    return {"step_top1": [round(a, 4) for a in top1], "accepted_len": [round(t, 4) for t in tau]}


def train_draft(subject: Subject, options: TrainOptions, *, log: Callable[[str], None] = print, show_progress: bool = True) -> Path:
    """Cache the training data (once), then train or continue the draft for ``budget_min`` minutes; returns the checkpoint path."""
    from tqdm import tqdm

    bars: dict[str, Any] = {}

    def data_progress(what: str, done: int, total: int) -> None:
        bar = bars.get(what)
        if bar is None:
            bar = bars[what] = tqdm(total=total, desc=what, unit="batch", disable=not show_progress, dynamic_ncols=True)
        bar.n = done
        bar.refresh()

    folder, sets = cache_training_data(subject, options, draft_dir(subject.model_name), data_progress)
    for bar in bars.values():
        bar.close()
    chunks = load_chunks(folder)
    held = HELD_OUT_CHUNKS if len(chunks) > 2 * HELD_OUT_CHUNKS else (1 if len(chunks) > 1 else 0)
    held_out = {key: torch.cat([c[key] for c in chunks[-held:]]) for key in chunks[0]} if held else None
    train = chunks[:-held] if held else chunks
    model = subject.model
    config = EagleConfig.for_target(model)
    path = draft_path(subject.model_name)
    torch.manual_seed(options.seed)
    with torch.device("cpu"):  # drafts train on the CPU (the embeddings and head are copied there below)
        draft = EagleDraft(config)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=options.lr, weight_decay=0.0)
    data = {"data": options.data, "prompt_sets": sets, "prompts": options.prompts, "new_tokens": options.new_tokens} if options.data == "self" \
        else {"data": options.data, "corpus": options.corpus}
    meta: dict[str, Any] = {"steps": 0, "tokens": 0, "train_s": 0.0, **data, "ttt_steps": options.ttt_steps, "curve": []}
    vocab = None
    if path.is_file() and not options.fresh:
        saved = _load_checkpoint(path)
        draft.load_state_dict(saved["state"])
        optimizer.load_state_dict(saved["optimizer"])
        vocab, meta = saved["vocab"], {"curve": [], **saved["meta"]}
        log(f"continuing the draft at {path} ({meta['steps']} steps, {meta['train_s'] / 60:.1f} min so far)")
    else:
        init_scale(draft)
        if options.init == "target" and not init_from_target(draft, model):
            log("the target's last layer does not fit the draft's shape: the draft starts from random weights")
        final_norm = getattr(getattr(model, "model", None), "norm", None)
        if final_norm is not None and getattr(final_norm, "weight", None) is not None and final_norm.weight.shape == draft.norm.weight.shape:
            with torch.no_grad():  # start with the target's output scale in front of its LM head
                draft.norm.weight.copy_(final_norm.weight)
    if vocab is None:
        trained = torch.cat([c["labels"][c["mask"]].long() for c in train])
        counts = torch.bincount(trained, minlength=model.config.vocab_size)
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
        batch = {key: torch.stack([sequences[i][0][key][sequences[i][1]] for i in pick]) for key in sequences[0][0]}
        warmup = min(1.0, (meta["steps"] + 1) / 50)
        decay = 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (time.perf_counter() - start) / budget_s)))  # cosine to lr/10 over this run
        for group in optimizer.param_groups:
            group["lr"] = options.lr * warmup * decay
        loss, accuracy = ttt_loss(draft, embed, head, to_draft, batch, options.ttt_steps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        meta["steps"] += 1
        meta["tokens"] += int(batch["mask"].sum())  # trained positions (target tokens the draft learnt), repeats counted
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
        scores = chain_scores(draft, embed, head, to_draft, held_out)
        meta["heldout_step_acc"] = scores["step_top1"]
        meta["heldout_accepted_len"] = scores["accepted_len"]
        meta["curve"] = [*meta["curve"], {"tokens": meta["tokens"], "steps": meta["steps"], "train_s": round(meta["train_s"], 1), **scores}]
        log(f"held-out top-1 agreement with the target per draft step: {', '.join(f'{a:.3f}' for a in scores['step_top1'])}")
        log(f"held-out accepted length (tokens per verify) for k = 1..{len(scores['accepted_len'])}: "
            f"{', '.join(f'{a:.2f}' for a in scores['accepted_len'])}")
    meta["vocab_coverage"] = float((to_draft[torch.cat([c["labels"][c["mask"]].long() for c in chunks])] >= 0).float().mean())
    _save(path, draft, optimizer, vocab, config, meta)
    log(f"draft saved to {path}: {meta['steps']} steps, {meta['tokens']} trained tokens, {meta['train_s'] / 60:.1f} min of training in all")
    return path


def _save(path: Path, draft: EagleDraft, optimizer: torch.optim.Optimizer, vocab: torch.Tensor, config: EagleConfig, meta: dict[str, Any]) -> None:
    """Replace the checkpoint atomically: a finished checkpoint is never half-overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    torch.save({"config": config.to_dict(), "state": draft.state_dict(), "optimizer": optimizer.state_dict(), "vocab": vocab, "meta": meta}, tmp)
    os.replace(tmp, path)


