"""Training the learned selector end to end through the frozen LM, through a relaxed top-k mask.

One step, for a batch of LAMBADA train rows (context capped to its last ``train_context`` tokens,
the target word's tokens appended and always kept):

1. the selector scores each context's tokens; the hard mask keeps the budget exactly as inference
   does (:func:`.selection.top_kept`: the last ``protect_last`` and the top-scoring rest, k in all);
2. the soft relaxation is ``σ((z - t) / tau)`` of the row's standardised scores ``z`` around ``t``,
   the midpoint between the last kept and the first dropped candidate (protected, target and
   padding positions are constants 1 or 0). ``estimator`` says which mask the LM sees:
   ``relaxed`` (the default): the soft values themselves, forward and backward;
   ``straight_through``: ``hard + soft - soft.detach()``, hard values forward, the soft gradient
   backward (OmniSIFT's estimator);
3. the masked forward (:func:`.masking.masked_hidden`: the mask multiplies every layer's attention
   probabilities over keys, positions renumbered as the hard mask's compressed prompt) gives the
   NLL of the target tokens; Adam updates the selector only (the LM's weights stay frozen).

Why ``relaxed`` is the default, measured (2026-12-04, SmolLM2-135M, the pipeline's recipe of 80
steps of 4 rows at Adam 0.02, seed 0; hard-mask NLL of LAMBADA eval rows 200..263, which the
study never scores): untrained (a keep-recent prior) 7.69 nats, ``straight_through`` 7.45,
``relaxed`` 5.65 (random keep 8.42, the full context 3.02). At a 0/1 mask the straight-through
gradient of a dropped token is a first-order guess at letting it in, and against the true change
of the loss from flipping each token it correlates ~0 (-0.05 to +0.08, six train rows), while for
kept tokens it correlates +0.40 to +0.86: three quarters of the gradient carries no signal.
Evaluated at soft values the relaxation is a smooth function whose gradient is its own.

Batches are padded to a multiple of 16 tokens (padding is masked out), so few distinct shapes
exist and :class:`paretolab.training.flops.StepFlops` counts each once. A trained selector is
cached under ``$PARETOLAB_CACHE/omnisift_text/`` keyed by the model's fingerprint, the settings
and the seed (written to a temporary file and renamed into place); ``PARETOLAB_RECORD_ANEW=1`` trains anew.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from paretolab.data import cache_dir, encode
from paretolab.plugins.omnisift_text.masking import masked_hidden
from paretolab.plugins.omnisift_text.network import TokenSelector, token_features
from paretolab.plugins.omnisift_text.selection import budget, top_kept
from paretolab.tasks.lambada import split_rows, target_ids
from paretolab.training.flops import StepFlops

VERSION = 2  # bump when training changes what it produces: older cached selectors are then not reused
PAD_TO = 16
ESTIMATORS = ("relaxed", "straight_through")
ANEW_ENV = "PARETOLAB_RECORD_ANEW"  # set (the contract's device check): train again, whatever the cache holds


@dataclass(frozen=True)
class TrainSettings:
    keep: float
    protect_last: int
    steps: int
    batch: int
    lr: float
    hidden: int
    tau: float
    train_context: int
    max_train_s: float
    source: str  # which LAMBADA source's train split
    seed: int
    estimator: str = "relaxed"  # or "straight_through" (see the module's docstring)


@dataclass
class Trained:
    net: TokenSelector
    meta: dict[str, Any]  # train_s, train_flops, steps, first_loss, last_loss, losses (per step), cached


def training_mask(scores: torch.Tensor, k: int, protect_last: int, tau: float, estimator: str = "relaxed") -> tuple[torch.Tensor, torch.Tensor]:
    """(the mask the LM sees in training, hard 0/1 mask) for one context's scores (L,); see the module's docstring."""
    if estimator not in ESTIMATORS:
        raise ValueError(f"omnisift_text estimator {estimator!r} is not known; use one of {', '.join(ESTIMATORS)}")
    length = scores.shape[0]
    hard = torch.zeros(length, device=scores.device)
    hard[top_kept(scores.detach(), k, protect_last)] = 1.0
    protected = min(protect_last, k, length)
    candidates, free = length - protected, min(k, length) - protected
    if free <= 0 or free >= candidates:  # nothing to choose: no gradient
        return hard, hard
    z = scores[:candidates]
    z = (z - z.mean()) / z.std().clamp_min(1e-6)
    ranked = torch.sort(z.detach(), descending=True).values
    threshold = (ranked[free - 1] + ranked[free]) / 2
    soft = torch.sigmoid((z - threshold) / tau)
    chosen = soft if estimator == "relaxed" else hard[:candidates] + soft - soft.detach()
    return torch.cat([chosen, hard[candidates:]]), hard


def train_selector(model: torch.nn.Module, tokenizer: Any, settings: TrainSettings, *, model_key: str) -> Trained:
    """The trained selector for ``settings`` on ``model``: from the cache when it is there, else trained now and cached."""
    device = next(model.parameters()).device
    d_model = model.get_input_embeddings().weight.shape[1]
    net = TokenSelector(d_model, settings.hidden, seed=settings.seed, device=device)
    path = cache_path(model_key, settings)
    if path.is_file() and not os.environ.get(ANEW_ENV):
        stored = torch.load(path, map_location=device, weights_only=True)
        net.load_state_dict(stored["state"])
        return Trained(net.eval(), {**json.loads(stored["meta"]), "cached": 1.0})
    meta = _train(net, model, tokenizer, settings)
    _save(path, net, meta)
    return Trained(net.eval(), {**meta, "cached": 0.0})


def _train(net: TokenSelector, model: torch.nn.Module, tokenizer: Any, settings: TrainSettings) -> dict[str, Any]:
    device = next(model.parameters()).device
    rows = split_rows(settings.source, "train")
    g = torch.Generator(device="cpu").manual_seed(settings.seed + 1)
    order = torch.randperm(len(rows), generator=g, device="cpu").tolist()
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in frozen:
        p.requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
    counter, flops, losses = StepFlops(), 0.0, []
    net.train()
    start = time.perf_counter()
    try:
        for step in range(settings.steps):
            picked = [rows[order[(step * settings.batch + i) % len(rows)]] for i in range(settings.batch)]
            examples = [(encode(tokenizer, r["context"].rstrip())[-settings.train_context :], target_ids(tokenizer, r["continuation"]))
                        for r in picked]
            width = -(-max(len(c) + len(t) for c, t in examples) // PAD_TO) * PAD_TO
            with counter.counting((len(examples), width)):
                loss = _step_loss(net, model, examples, width, settings, device)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            opt.step()
            flops += counter.get((len(examples), width)) or 0.0
            losses.append(float(loss.detach()))
            if time.perf_counter() - start > settings.max_train_s:
                break
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    net.eval()
    return {"train_s": time.perf_counter() - start, "train_flops": flops, "steps": len(losses),
            "first_loss": losses[0], "last_loss": sum(losses[-5:]) / len(losses[-5:]), "losses": [round(v, 4) for v in losses]}


def _step_loss(net: TokenSelector, model: torch.nn.Module, examples: list[tuple[list[int], list[int]]], width: int,
               settings: TrainSettings, device: torch.device) -> torch.Tensor:
    """Mean NLL of the target tokens under the training mask's forward of the batch (``settings.estimator``)."""
    embed = model.get_input_embeddings()
    ids = torch.zeros(len(examples), width, dtype=torch.long, device=device)
    masks, hards, where, targets = [], [], [], []
    for row, (context, target) in enumerate(examples):
        c = torch.tensor(context, dtype=torch.long, device=device)
        t = torch.tensor(target, dtype=torch.long, device=device)
        ids[row, : len(context)] = c
        ids[row, len(context) : len(context) + len(target)] = t
        scores = net(embed(c)[None].float(), token_features(c)[None])[0]
        mask, hard = training_mask(scores, budget(len(context), settings.keep), settings.protect_last, settings.tau,
                                   settings.estimator)
        tail = torch.zeros(width - len(context), device=device)
        tail[: len(target)] = 1.0
        masks.append(torch.cat([mask, tail]))
        hards.append(torch.cat([hard, tail]))
        where += [(row, len(context) - 1 + i) for i in range(len(target))]  # the position that predicts target token i
        targets.append(t)
    hidden = masked_hidden(model, ids, torch.stack(masks), torch.stack(hards))
    rows = torch.tensor([r for r, _ in where], dtype=torch.long, device=device)
    cols = torch.tensor([c for _, c in where], dtype=torch.long, device=device)
    logits = model.get_output_embeddings()(hidden[rows, cols]).float()
    return F.cross_entropy(logits, torch.cat(targets))


def model_fingerprint(model: torch.nn.Module, name: str) -> str:
    """The model's name, config and a few of its embedding rows: what a cached selector was trained against."""
    config = model.config.to_json_string(use_diff=False) if hasattr(model, "config") else ""
    rows = model.get_input_embeddings().weight[:4].detach().float().cpu().numpy().tobytes()
    return hashlib.sha256(name.encode() + config.encode() + rows).hexdigest()


def cache_path(model_key: str, settings: TrainSettings) -> Path:
    key = json.dumps({"model": model_key, "settings": asdict(settings), "version": VERSION}, sort_keys=True)
    return cache_dir() / "omnisift_text" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"


def _save(path: Path, net: TokenSelector, meta: dict[str, Any]) -> None:
    """Write to a temporary file beside ``path`` and rename it into place (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    try:
        torch.save({"state": state, "meta": json.dumps(meta)}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
