"""Distillation in stages, the teacher's bill included: top-k logit KD and SFT on teacher text.

The seed paper (an energy accounting framework for distillation pipelines, ICML 2026 list; no
code found) measures every stage of a distillation pipeline — the teacher's logit caching or data
generation, the student's training, evaluation — and shows that the teacher-side stages, which
studies usually leave out, change which method looks cheapest. Its two methods are the ones here:

- ``distill_kd``: the teacher runs once over windows of the training corpus and its top-k logits
  are cached; the student then trains on those windows with CE + α·τ²·KL(teacher ‖ student) over
  the teacher's top-k tokens (Hinton et al.'s τ² scaling). Ours: the teacher's top-k logits are
  renormalised over the k tokens at temperature τ; the student's log-probabilities are its full
  softmax at τ read at those k ids, so student mass outside the teacher's top-k is penalised
  (the KL is ≥ 0 and 0 only when the student puts exactly the teacher's renormalised top-k
  distribution there). Guessed: k, τ, α (the paper's settings are not in its abstract).
- ``distill_sft``: the teacher continues prompts cut from the training corpus (seeded sampling at
  ``temperature``); prompt + continuation are packed into one stream and cut into windows the
  student trains on with plain CE. Ours: the packing and prompt length.

Each is a stage of its own (``transform`` loads the teacher, runs it, frees it, and attaches a
training hook that carries only the cached tensors), so the trial's energy meter puts the
teacher's energy, time and FLOPs in that stage and nowhere else; the ``train`` stage after it
consumes the cache for as many passes as its token budget asks and never calls the teacher. The
``stage_energy`` measure (:mod:`paretolab.plugins.stage_energy`) reads the stages back as metrics.
The windows are drawn from the corpus with the stage's own ``seed`` (fixed across train seeds);
the ``none`` baseline is the plain ``train`` stage on the same corpus and token budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.training.batches import corpus_token_ids, tokenizer_fingerprint
from paretolab.training.flops import ATTENTION_FORMULAS
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("Energy accounting of distillation pipelines: teacher-side stages counted (ICML 2026 list)", "ICML 2026", "")
_EPOCH_STREAM = 1_000_003


@dataclass(frozen=True)
class TeacherOptions:
    teacher: str = "smollm2-135m"  # a model with the student's tokenizer
    corpus: str = option("pystdlib-train", data="corpus")  # the text the teacher reads (the train stage's corpus)
    tokens: int = option(8192, low=2)  # tokens of teacher data: KD scores this many positions; SFT writes this many (prompts included)
    seq_len: int = option(64, low=2, high=32768)  # window length: must equal the train stage's seq_len
    batch: int = option(16, low=1)  # teacher forward / generation batch
    seed: int = option(0, low=0)  # draws the corpus windows (and SFT's sampling); fixed across train seeds


@dataclass(frozen=True)
class KDOptions(TeacherOptions):
    top_k: int = option(32, low=1)  # teacher logits kept per position
    tau: float = option(2.0, low=0.01, high=100.0)  # distillation temperature
    alpha: float = option(1.0, low=0.0, high=100.0)  # weight of the τ²·KL term beside the CE


@dataclass(frozen=True)
class SFTOptions(TeacherOptions):
    prompt_tokens: int = option(8, low=1)  # corpus tokens the teacher continues
    new_tokens: int = option(24, low=1)  # tokens the teacher writes per prompt
    temperature: float = option(1.0, low=0.0, high=10.0)  # sampling temperature (0: greedy)


def kd_loss(logits: torch.Tensor, targets: torch.Tensor, values: torch.Tensor, indices: torch.Tensor, *, tau: float, alpha: float) -> torch.Tensor:
    """CE(student, targets) + α·τ²·KL(p_T ‖ q_S) over the teacher's top-k ids (see the module docstring).

    ``logits`` (..., V) are the student's; ``values``/``indices`` (..., k) the teacher's top-k logits and their ids.
    """
    logits = logits.float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    log_p = torch.log_softmax(values.float() / tau, dim=-1)
    log_q = torch.log_softmax(logits / tau, dim=-1).gather(-1, indices)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    return ce + alpha * tau**2 * kl


class WindowSet:
    """Fixed training windows (n, seq_len + 1), served in a fresh seeded order each pass; ``rows`` names the last batch's windows."""

    def __init__(self, windows: torch.Tensor) -> None:
        self.windows = windows
        self.rows = torch.empty(0, dtype=torch.long, device="cpu")
        self.passes = 0.0

    @property
    def tokens(self) -> int:
        return int(self.windows.shape[0] * (self.windows.shape[1] - 1))

    def batches(self, *, batch: int, seed: int, device: torch.device) -> Iterator[torch.Tensor]:
        n = self.windows.shape[0]
        generator = torch.Generator(device="cpu").manual_seed(seed * _EPOCH_STREAM + 1)
        queue = torch.empty(0, dtype=torch.long, device="cpu")
        while True:
            while queue.numel() < batch:  # a batch may straddle two passes
                queue = torch.cat([queue, torch.randperm(n, generator=generator, device="cpu")])
            self.rows, queue = queue[:batch], queue[batch:]
            self.passes += batch / n
            yield self.windows[self.rows].to(device)


class _WindowHook(TrainingHook):
    """Replaces the train stage's data with the teacher stage's windows; checks the stage agrees on seq_len."""

    replaces: tuple[str, ...] = ("data",)

    def __init__(self, windows: WindowSet, corpus: str) -> None:
        self.windows, self.corpus = windows, corpus

    def data(self, state: Any) -> Iterator[torch.Tensor]:
        seq_len = self.windows.windows.shape[1] - 1
        if state.params.corpus != self.corpus:
            raise ConfigError(f"train.corpus: {state.params.corpus!r} differs from {self.method}.corpus {self.corpus!r}; give both stages the same "
                              "corpus (the student trains on the teacher's windows, the no-teacher baseline on the train stage's corpus)")
        if state.params.seq_len != seq_len:
            raise ConfigError(f"train.seq_len: {state.params.seq_len} differs from {self.method}.seq_len {seq_len}; "
                              "give both stages the same seq_len (the teacher's windows are the student's)")
        return self.windows.batches(batch=state.params.batch, seed=state.params.seed, device=state.device)

    def end_of_training(self, state: Any) -> None:
        state.subject.info["teacher_data_passes"] = round(self.windows.passes, 3)


class KDHook(_WindowHook):
    """Trains on the cached windows with CE + α·τ²·KL against the cached top-k teacher logits; never runs the teacher."""

    replaces = ("loss", "data")

    def __init__(self, windows: WindowSet, values: torch.Tensor, indices: torch.Tensor, corpus: str, *, tau: float, alpha: float) -> None:
        super().__init__(windows, corpus)
        self.values, self.indices, self.tau, self.alpha = values, indices, tau, alpha

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor:
        rows = self.windows.rows
        logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        values = self.values[rows].to(batch.device)
        indices = self.indices[rows].to(batch.device)
        return kd_loss(logits, batch[:, 1:], values, indices, tau=self.tau, alpha=self.alpha)


def load_teacher(name: str, student: Subject, device: torch.device, *, where: str) -> Subject:
    """The teacher on ``device``, refused (naming the fix) unless its tokenizer gives the student's ids."""
    from paretolab.models import resolve_model

    with torch.device(device):
        teacher = resolve_model(name).load()
    teacher.model.to(device).eval()
    if tokenizer_fingerprint(teacher.tokenizer) != tokenizer_fingerprint(student.tokenizer):
        raise ConfigError(f"{where}.teacher: {name!r} has another tokenizer than the student {student.model_name!r}, so its logits do not "
                          "index the student's vocabulary; use a student on the teacher's tokenizer (e.g. scratch-smol for smollm2-135m)")
    return teacher


def draw_windows(ids: torch.Tensor, *, n: int, width: int, seed: int) -> torch.Tensor:
    """``n`` windows of ``width`` tokens at seeded uniform starts (CPU)."""
    span = ids.numel() - width
    if span < 1:
        raise ConfigError(f"seq_len: the corpus has {ids.numel()} tokens, too few for windows of {width}; lower seq_len")
    starts = torch.randint(0, span + 1, (n,), generator=torch.Generator(device="cpu").manual_seed(seed), device="cpu")
    return ids[starts[:, None] + torch.arange(width, device="cpu")]


@torch.no_grad()
def cache_topk(model: torch.nn.Module, windows: torch.Tensor, *, top_k: int, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k logits (values float32, ids int64; (n, seq_len, k), CPU) at every position of ``windows``."""
    values, indices = [], []
    for chunk in windows.split(batch):
        logits = model(input_ids=chunk[:, :-1].to(device), use_cache=False).logits.float()
        v, i = logits.topk(min(top_k, logits.shape[-1]), dim=-1)
        values.append(v.cpu())
        indices.append(i.cpu())
    return torch.cat(values), torch.cat(indices)


class _TeacherStage(Method):
    """What both teacher stages share: load the teacher once, run it under the FLOP counter, free it, record what it did."""

    kind = "training"
    paper = PAPER
    cost_is = "real"
    options: type = TeacherOptions

    def defaults(self) -> dict[str, Any]:
        return asdict(self.options())

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        where = f"stages.{ctx.stage or self.name}.{self.name}.params"
        opts = parse_options(self.options, params, where=where)
        device = subject.device
        started = time.perf_counter()
        teacher = load_teacher(opts.teacher, subject, device, where=where)
        load_s = time.perf_counter() - started
        ids = corpus_token_ids(subject.tokenizer, opts.corpus)
        with FlopCounterMode(display=False, custom_mapping=ATTENTION_FORMULAS) as counter:
            hook, tokens = self.run_teacher(teacher, ids, opts, device)
        del teacher  # the teacher's weights go now (nothing else holds them): the train stage cannot run it
        training_of(subject).attach(hook, method=self.name)
        subject.info.update({"teacher": opts.teacher, "teacher_tokens": tokens, "teacher_flops": float(counter.get_total_flops()),
                             "teacher_load_s": load_s, "teacher_windows": int(hook.windows.windows.shape[0])})
        return subject

    def run_teacher(self, teacher: Subject, ids: torch.Tensor, opts: Any, device: torch.device) -> tuple[_WindowHook, int]:
        """(the hook that trains on the teacher's output, tokens the teacher processed)."""
        raise NotImplementedError


class DistillKD(_TeacherStage):
    """Teacher inference that caches top-k logits over corpus windows; the train stage after it distils with CE + α·τ²·KL."""

    name = "distill_kd"
    options = KDOptions

    def run_teacher(self, teacher: Subject, ids: torch.Tensor, opts: KDOptions, device: torch.device) -> tuple[_WindowHook, int]:
        n = max(1, opts.tokens // opts.seq_len)
        windows = draw_windows(ids, n=n, width=opts.seq_len + 1, seed=opts.seed)
        values, indices = cache_topk(teacher.model, windows, top_k=opts.top_k, batch=opts.batch, device=device)
        hook = KDHook(WindowSet(windows), values, indices, opts.corpus, tau=opts.tau, alpha=opts.alpha)
        return hook, n * opts.seq_len


class DistillSFT(_TeacherStage):
    """Teacher generation: continuations of corpus prompts, packed into windows the train stage fits with plain CE."""

    name = "distill_sft"
    options = SFTOptions

    def run_teacher(self, teacher: Subject, ids: torch.Tensor, opts: SFTOptions, device: torch.device) -> tuple[_WindowHook, int]:
        from paretolab.generation import BatchedGenerator, Sampling

        per_prompt = opts.prompt_tokens + opts.new_tokens
        n = max(1, math.ceil(opts.tokens / per_prompt))
        prompts = draw_windows(ids, n=n, width=opts.prompt_tokens, seed=opts.seed).tolist()
        generator = BatchedGenerator(batch_size=opts.batch, sampling=Sampling(temperature=opts.temperature, seed=opts.seed))
        out = generator.generate(teacher, prompts, max_new_tokens=opts.new_tokens)
        stream = [t for prompt, seq in zip(prompts, out.sequences, strict=True) for t in (*prompt, *seq)]
        width = opts.seq_len + 1
        if len(stream) < width:
            raise ConfigError(f"{self.name}.tokens: the teacher wrote {len(stream)} tokens, fewer than one window of seq_len + 1 = {width}; raise tokens")
        packed = torch.tensor(stream[: len(stream) // width * width], dtype=torch.long, device="cpu").view(-1, width)
        return _WindowHook(WindowSet(packed), opts.corpus), len(stream)


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(DistillKD())
    register(DistillSFT())
