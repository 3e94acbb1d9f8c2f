"""The training loop of the ``train`` stage: AdamW, warm-up + cosine decay, clipping, budgets, evaluation points.

One call of :func:`train` is one ``train`` stage. It stops at the first of: the token budget, the
FLOP budget, ``max_minutes``, and the trial's deadline (less a reserve for evaluating and
measuring). Attached hooks (:mod:`paretolab.training.hooks`) are called at every event in stage
order, ``end_of_training`` in reverse. The data order and (for ``init: auto|reinit``) the initial
weights come from the stage's ``seed`` alone, through CPU generators, so two runs with the same seed
give the same losses bit for bit on CPU, whatever the trial seed or torch's global RNG.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.measure.timing import torch_threads
from paretolab.training.batches import corpus_token_ids, heldout_windows, random_batches
from paretolab.training.flops import StepFlops
from paretolab.training.hooks import Training, TrainingHook, training_of
from paretolab.training.memory import saved_activations, state_mb

log = logging.getLogger("paretolab.training")

BETAS = (0.9, 0.95)
DEADLINE_RESERVE = 0.2  # the share of the time left at the start of a stage kept for evaluating and measuring after it
_STAGE_STREAM = 1_000_003  # separates the data order of a trial's later train stages from its first


@dataclass
class TrainState:
    """The loop's live state, handed to every hook."""

    model: torch.nn.Module
    params: Any  # the stage's TrainOptions
    ctx: Any  # the TrialContext
    subject: Any
    device: torch.device
    training: Training
    optimizer: torch.optim.Optimizer | None = None
    step: int = 0  # optimizer steps taken in this stage
    max_steps: int = 0  # the schedule's length (from the token/FLOP budget)
    tokens: int = 0  # cumulative over the trial's train stages
    flops: float = 0.0  # cumulative over the trial's train stages
    stage_tokens: int = 0
    stage_flops: float = 0.0
    last_loss: float = float("nan")
    lr: float = 0.0
    stopped_by: str = ""
    last_eval: tuple[float, int] = (0.0, 0)  # (held-out nll, tokens) of the last evaluation point
    rebuild_optimizer: bool = False  # set by a hook in before_step after it changed the model's parameters: the loop rebuilds AdamW before the step
    extra: dict[str, Any] = field(default_factory=dict)  # for hooks to share facts within a stage


def lr_factor(step: int, max_steps: int, warmup: float, min_lr_frac: float) -> float:
    """Multiplier of the peak lr at ``step`` (0-based): linear warm-up over ``warmup`` of the steps, then cosine to ``min_lr_frac``."""
    warm = round(warmup * max_steps)
    if step < warm:
        return (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, max_steps - warm))
    return min_lr_frac + (1.0 - min_lr_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(model: torch.nn.Module, *, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """Two AdamW groups: matrices decay; norms, biases and embeddings do not. Each group lists its parameter ``names``."""
    decay: list[tuple[str, torch.nn.Parameter]] = []
    no_decay: list[tuple[str, torch.nn.Parameter]] = []
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or id(p) in embeddings else decay).append((name, p))
    groups = []
    for members, wd in ((decay, weight_decay), (no_decay, 0.0)):
        if members:
            groups.append({"params": [p for _, p in members], "names": [n for n, _ in members], "lr": lr, "weight_decay": wd})
    return groups


def reinitialise(model: torch.nn.Module, seed: int) -> None:
    """Draw fresh weights from ``seed``: HF's ``_init_weights`` for HF/torch modules, ``reset_parameters()`` for modules methods added."""
    init_hf = getattr(model, "_init_weights", None)
    for p in model.parameters():
        if getattr(p, "_is_hf_initialized", False):
            p._is_hf_initialized = False  # transformers' init functions skip tensors flagged as loaded
    devices = sorted({p.device for p in model.parameters() if p.device.type == "cuda"}, key=str)
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        torch.manual_seed(seed)
        for name, module in model.named_modules():
            if not any(True for _ in module.parameters(recurse=False)):
                continue
            origin = type(module).__module__
            if init_hf is not None and origin.startswith(("transformers.", "torch.nn.")):
                init_hf(module)
            elif hasattr(module, "reset_parameters"):
                module.reset_parameters()
            else:
                raise ConfigError(
                    f"train.init: module {name!r} ({type(module).__name__} from {origin}) cannot be re-initialised; "
                    "the method that added it must give it a reset_parameters() method, or set train.init: keep"
                )


def _default_loss(model: torch.nn.Module, batch: torch.Tensor, state: TrainState) -> torch.Tensor:
    """Next-token cross-entropy over the window (no KV cache: training has no later step to serve, and a method that
    swaps attention, UPipe's head chunks say, hands forwards with a cache back to the model's own attention)."""
    logits = model(input_ids=batch[:, :-1], use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_nll(model: torch.nn.Module, windows: torch.Tensor, *, batch: int, device: torch.device) -> tuple[float, int]:
    """(summed NLL in nats, predicted tokens) of ``windows`` under ``model`` in eval mode."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        chunk = windows[i : i + batch].to(device)
        logits = model(input_ids=chunk[:, :-1], use_cache=False).logits.float()
        total += float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1), reduction="sum"))
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total, count


def _data(hooks: list[TrainingHook], owner: TrainingHook | None, ids: torch.Tensor | None, state: TrainState,
          generator: torch.Generator) -> Iterator[torch.Tensor]:
    if owner is not None:
        source = owner.data(state)
        if source is None:
            raise ConfigError(f"method {owner.method!r}: its training hook replaces the data but data() returned None")
        return iter(source)
    assert ids is not None
    return random_batches(ids, batch=state.params.batch, seq_len=state.params.seq_len, generator=generator, device=state.device)


def train(subject: Any, opts: Any, ctx: Any, *, val_corpus: str) -> dict[str, float]:
    """Run one ``train`` stage on ``subject.model`` in place; record tokens, FLOPs, curve and metrics in ``training_of(subject)``."""
    record = training_of(subject)
    device = subject.device
    if opts.init == "reinit" or opts.init == "auto" and record.stages_run == 0 and subject.info.get("weights") == "random init":
        reinitialise(subject.model, opts.seed)
        record.optimizer_state = {}  # moments of other weights mean nothing now
    state = TrainState(model=subject.model, params=opts, ctx=ctx, subject=subject, device=device, training=record,
                       tokens=record.tokens, flops=record.flops)
    hooks = list(record.hooks)
    for hook in hooks:
        converted = hook.convert_model(state.model, state)
        if converted is not None:
            state.model = subject.model = converted
    model = state.model
    device = state.device = subject.device

    state.optimizer = optimizer = _build_optimizer(model, hooks, state, record.optimizer_state)

    loss_owner, data_owner = record.owner("loss"), record.owner("data")
    ids = None if data_owner is not None else corpus_token_ids(subject.tokenizer, opts.corpus)
    val_windows, val_bytes = heldout_windows(subject.tokenizer, val_corpus, tokens=opts.eval_tokens, seq_len=opts.seq_len)
    generator = torch.Generator(device="cpu").manual_seed(opts.seed + _STAGE_STREAM * record.stages_run)
    data = _data(hooks, data_owner, ids, state, generator)

    tokens_per_step = opts.batch * opts.seq_len
    steps_by_tokens = opts.tokens // tokens_per_step if opts.tokens is not None else None
    if steps_by_tokens == 0:
        raise ConfigError(f"train.tokens: {opts.tokens} is less than one step of batch × seq_len = {tokens_per_step} tokens; raise tokens or lower batch/seq_len")
    counter = StepFlops()
    start = time.perf_counter()
    wall = (start + opts.max_minutes * 60.0, "max_minutes")
    deadline = getattr(ctx, "deadline", None)
    if deadline is not None:  # ctx.deadline is wall-clock (time.time()); keep a share of what is left for evaluate/measure
        wall = min(wall, (start + (deadline - time.time()) * (1.0 - DEADLINE_RESERVE), "trial_timeout"))
    step_s = 0.0
    since_eval: list[float] = []
    peak_act_mb = mem_mb = 0.0
    threads = math.ceil(ctx.cpus) if getattr(ctx, "cpus", 0) else 0
    bar = _progress(opts)
    model.train()
    with torch_threads(threads):
        while True:
            for hook in hooks:
                hook.before_step(state)
            if state.rebuild_optimizer:  # a hook changed the parameters (e.g. grew the model): new groups, old moments by name
                state.optimizer = optimizer = _build_optimizer(model, hooks, state, _named_optimizer_state(model, optimizer))
                state.rebuild_optimizer = False
            batch = next(data)
            key = (tuple(batch.shape), tuple(hook.step_signature(state) for hook in hooks))
            t0 = time.perf_counter()
            first = state.step == 0
            new_shape = counter.get(key) is None  # the first step of each distinct compute (a hook may grow the model): weigh it
            with counter.counting(key), saved_activations(model) if new_shape else _nothing() as acts:
                loss = loss_owner.loss(model, batch, state) if loss_owner is not None else _default_loss(model, batch, state)
                if loss is None:
                    raise ConfigError(f"method {loss_owner.method!r}: its training hook replaces the loss but loss() returned None")
                loss.backward()
            if new_shape:
                peak_act_mb = max(peak_act_mb, acts.mb)
            if first:
                state.max_steps = _max_steps(opts, steps_by_tokens, counter.get(key) or 0.0)
            for hook in hooks:
                hook.after_backward(state)
            if opts.clip > 0:
                torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], opts.clip)
            factor = lr_factor(state.step, state.max_steps, opts.warmup, opts.min_lr_frac)
            state.lr = opts.lr * factor
            for group in optimizer.param_groups:
                group["lr"] = group["peak_lr"] * factor
            optimizer.step()
            if new_shape:
                mem_mb = max(mem_mb, state_mb(model, optimizer) + acts.mb)
            optimizer.zero_grad(set_to_none=True)
            state.last_loss = float(loss.detach())
            step_flops = counter.get(key) or 0.0
            state.step += 1
            state.stage_tokens += batch[:, 1:].numel()
            state.tokens += batch[:, 1:].numel()
            state.stage_flops += step_flops
            state.flops += step_flops
            step_s += time.perf_counter() - t0
            since_eval.append(state.last_loss)
            for hook in hooks:
                hook.after_step(state)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{state.last_loss:.3f}")
            state.stopped_by = _stop(state, opts, wall, batch[:, 1:].numel(), step_flops)
            if state.step % opts.eval_every == 0 or state.stopped_by:
                _eval_point(state, record, val_windows, since_eval, start)
                since_eval = []
            if state.stopped_by:
                break
    if bar is not None:
        bar.close()
    for hook in reversed(hooks):
        hook.end_of_training(state)
    model = subject.model
    model.eval()

    if state.stopped_by == "pruned":  # the last evaluation point was this very step: no second pass over the held-out windows
        nll, count = state.last_eval
    else:
        nll, count = heldout_nll(model, val_windows, batch=opts.batch, device=device)
    elapsed = time.perf_counter() - start
    record.optimizer_state = _named_optimizer_state(model, optimizer)
    record.stages_run += 1
    record.tokens, record.flops = state.tokens, state.flops
    previous = record.metrics
    record.metrics = {
        "val_loss": nll / count,
        "val_bpb": nll / math.log(2) / val_bytes,
        "train_flops": state.flops,
        "train_tokens": float(state.tokens),
        "train_tok_s": state.stage_tokens / step_s if step_s > 0 else 0.0,
        "train_s": previous.get("train_s", 0.0) + elapsed,
        "peak_act_mb": max(peak_act_mb, previous.get("peak_act_mb", 0.0)),
        "train_mem_mb": max(mem_mb, previous.get("train_mem_mb", 0.0)),
        "train_steps": previous.get("train_steps", 0.0) + state.step,
    }
    subject.info["train_stopped_by"] = state.stopped_by
    subject.info["train_flop_shapes"] = len(counter)
    return record.metrics


def _max_steps(opts: Any, steps_by_tokens: int | None, first_step_flops: float) -> int:
    """The schedule's length: the token budget's steps, or the FLOP budget's at the first step's cost, whichever is fewer."""
    candidates = [s for s in (steps_by_tokens,) if s is not None]
    if opts.flops is not None:
        if first_step_flops > opts.flops:
            raise ConfigError(f"train.flops: {opts.flops:g} is less than one step ({first_step_flops:g} FLOPs); raise flops or lower batch/seq_len")
        candidates.append(int(opts.flops // first_step_flops) if first_step_flops > 0 else 1 << 62)
    return max(1, min(candidates))


def _stop(state: TrainState, opts: Any, wall: tuple[float, str], step_tokens: int, step_flops: float) -> str:
    """Why to stop after this step ("" to go on): the next step would pass a budget, or time is up."""
    if opts.tokens is not None and state.stage_tokens + step_tokens > opts.tokens:
        return "tokens"
    if opts.flops is not None and (state.stage_flops + step_flops > opts.flops or state.step >= state.max_steps):
        return "flops"
    if time.perf_counter() >= wall[0]:
        return wall[1]
    return ""


def _eval_point(state: TrainState, record: Training, windows: torch.Tensor, losses: list[float], start: float) -> None:
    nll, count = heldout_nll(state.model, windows, batch=state.params.batch, device=state.device)
    row = {
        "stage": state.ctx.stage,
        "step": state.step,
        "tokens": state.tokens,
        "flops": state.flops,
        "train_loss": sum(losses) / len(losses),
        "val_loss": nll / count,
        "lr": state.lr,
        "s": record.metrics.get("train_s", 0.0) + time.perf_counter() - start,
    }
    record.curve.append(row)
    state.last_eval = (nll, count)
    report = getattr(state.ctx, "report", None)  # the study's pruner (search.pruner), told while the stage goes on
    step = int(record.metrics.get("train_steps", 0)) + state.step  # optimizer steps over the trial's train stages
    if not state.stopped_by and report is not None and report(step, {"val_loss": row["val_loss"], "train_loss": row["train_loss"]}):
        state.stopped_by = "pruned"
    log.info("train %s step %d tokens %d: train_loss %.4f val_loss %.4f", row["stage"], row["step"], row["tokens"], row["train_loss"], row["val_loss"])


def _build_optimizer(model: torch.nn.Module, hooks: list[TrainingHook], state: TrainState,
                     saved: dict[str, dict[str, torch.Tensor]]) -> torch.optim.Optimizer:
    """AdamW over the model's parameter groups (as the hooks change them), with the moments in ``saved`` carried by name."""
    opts = state.params
    groups = param_groups(model, lr=opts.lr, weight_decay=opts.weight_decay)
    for hook in hooks:
        changed = hook.param_groups(groups, state)
        if changed is not None:
            groups = changed
    for group in groups:
        group.setdefault("lr", opts.lr)
        group["peak_lr"] = group["lr"]  # the schedule scales each group's own lr (μP gives groups different ones)
    optimizer = torch.optim.AdamW(groups, lr=opts.lr, betas=BETAS, weight_decay=opts.weight_decay, foreach=False)
    _carry_optimizer_state(model, optimizer, saved, state.device)
    return optimizer


def _carry_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, dict[str, torch.Tensor]],
                           device: torch.device) -> None:
    """Load AdamW moments saved by name by an earlier stage (or transformed by a method) where the shapes still match."""
    if not saved:
        return
    names = {id(p): n for n, p in model.named_parameters()}  # by the model, not the groups: a hook may drop their "names"
    for group in optimizer.param_groups:
        for p in group["params"]:
            entry = saved.get(names.get(id(p), ""))
            if entry and entry.get("exp_avg") is not None and entry["exp_avg"].shape == p.shape:
                optimizer.state[p] = {k: v.detach().clone().to(device if k != "step" else v.device) for k, v in entry.items()}


def _named_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, dict[str, torch.Tensor]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: v.detach().clone() for k, v in s.items()} for p, s in optimizer.state.items() if id(p) in names}


class _nothing:
    """A context manager yielding None (the activation meter runs on the first step of each distinct step shape only)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _progress(opts: Any) -> Any:
    """A tqdm bar on an interactive terminal only (workers log their eval points instead)."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(desc="train", unit="step", leave=False)
