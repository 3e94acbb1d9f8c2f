"""The ``train`` stage as a built-in method plugin, its options, its metrics and its learning-curve artifact."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.method import Method, Paper
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option, parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.training.hooks import training_of

CURVE_ARTIFACT = "learning_curve.json"
DEFAULT_VAL_CORPUS = "pystdlib-val"


@dataclass(frozen=True)
class TrainOptions:
    tokens: int | None = option(200_000, low=1)  # training tokens of this stage (budget; whichever of tokens/flops comes first)
    flops: float | None = option(None, low=1.0)  # training FLOPs of this stage (forward + backward, attention counted)
    max_minutes: float = option(8.0, low=0.01, high=24 * 60.0)  # wall-time cap of this stage (the trial timeout caps it too)
    seq_len: int = option(128, low=2, high=32768)
    batch: int = option(16, low=1, high=65536)
    lr: float = option(3.0e-3, low=0.0, high=10.0)  # peak learning rate
    warmup: float = option(0.05, low=0.0, high=1.0)  # fraction of the steps spent warming up linearly
    min_lr_frac: float = option(0.1, low=0.0, high=1.0)  # the cosine decay's floor, as a fraction of lr
    weight_decay: float = option(0.1, low=0.0, high=10.0)  # AdamW decay of matrices (norms, biases, embeddings: none)
    clip: float = option(1.0, low=0.0)  # max global gradient norm (0: no clipping)
    eval_every: int = option(50, low=1)  # steps between evaluation points of the curve
    eval_tokens: int = option(16384, low=2)  # held-out tokens behind val_loss / val_bpb
    seed: int = option(0, low=0)  # fixes data order and (init auto|reinit) the initial weights; independent of the trial seed
    corpus: str = option("pystdlib-train", data="corpus")  # the training text
    init: str = option("auto", one_of=("auto", "keep", "reinit"))  # auto: re-initialise a `random init` model before its first train stage
    save_as: str = ""  # save the trained model as a model source under this name ({seed}, {trial} are filled in)


TRAIN_METRICS: tuple[Metric, ...] = (
    Metric("val_loss", "nats/token", "minimize", "train stage: mean next-token loss on eval_tokens held-out tokens after training"),
    Metric("val_bpb", "bits/byte", "minimize", "train stage: held-out loss in bits per UTF-8 byte (total NLL / ln 2 / bytes), comparable across tokenizers"),
    Metric("train_flops", "FLOPs", "minimize", "train stage: training FLOPs, all train stages (FlopCounterMode forward + backward per distinct step shape; CPU attention counted)"),
    Metric("train_tokens", "tokens", "minimize", "train stage: training tokens (predicted positions), all train stages"),
    Metric("train_tok_s", "tokens/s", "maximize", "train stage: training tokens per second of optimizer steps (evaluation points left out), last train stage"),
    Metric("train_s", "s", "minimize", "train stage: wall time of the train stages, evaluation points included"),
    Metric("peak_act_mb", "MiB", "minimize", "train stage: activations saved for backward over one step, the largest over each distinct step shape (saved-tensor hooks, unique storages, weights left out)", exact=True),
    Metric("train_mem_mb", "MiB", "minimize", "train stage: parameters + gradients + AdamW state + peak_act_mb (a model of the footprint, not an allocator reading)"),
    Metric("train_steps", "steps", "minimize", "train stage: optimizer steps, all train stages"),
)


class Train(Method):
    """Train ``subject.model`` on a corpus (see :mod:`paretolab.training.loop`); training-time methods before it attach hooks."""

    name = "train"
    kind = "training"
    paper = Paper("AdamW with linear warm-up and cosine decay (standard practice)", "", "https://arxiv.org/abs/1711.05101")
    cost_is = "real"
    requires = ()
    metrics = tuple(m.name for m in TRAIN_METRICS)

    def defaults(self) -> dict[str, Any]:
        return {f.name: f.default for f in dataclasses.fields(TrainOptions)}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        from paretolab.training.loop import train

        opts = parse_train_options(params, where=f"stages.{ctx.stage or 'train'}.train.params")
        if opts.tokens is None and opts.flops is None:
            raise ConfigError("train: give a budget, tokens and/or flops (both are null)")
        evaluated = _task_corpus(ctx)
        check_not_evaluation_corpus(opts.corpus, evaluated, where=f"stages.{ctx.stage or 'train'}.train.params.corpus")
        val_corpus = evaluated or held_out_corpus(opts.corpus)
        subject.info["val_corpus"] = val_corpus
        train(subject, opts, ctx, val_corpus=val_corpus)
        record = training_of(subject)
        ctx.add_artifact(CURVE_ARTIFACT, json.dumps({"rows": record.curve, "seed": opts.seed}, indent=1))
        if opts.save_as:
            from paretolab.training.checkpoints import save_trained

            meta = {"tokens": record.tokens, "flops": record.flops, "seed": opts.seed, "corpus": opts.corpus, "val_corpus": val_corpus,
                    "val_loss": record.metrics.get("val_loss"), "val_bpb": record.metrics.get("val_bpb"), "trial": ctx.trial_number,
                    "train_params": dataclasses.asdict(opts)}
            save_trained(subject, opts.save_as.format(seed=opts.seed, trial=ctx.trial_number), meta)
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        metrics = training_of(subject).metrics
        return {k: metrics[k] for k in ("val_loss", "val_bpb") if k in metrics}

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        metrics = training_of(subject).metrics
        return {k: v for k, v in metrics.items() if k not in ("val_loss", "val_bpb")}


def parse_train_options(params: dict[str, Any], *, where: str) -> TrainOptions:
    """TrainOptions from a stage's params; a number YAML read as text (``1e12``, no dot) gets its own hint."""
    for key, value in params.items():
        if key in ("tokens", "flops", "lr") and isinstance(value, str):
            try:
                float(value)
            except ValueError:
                continue
            raise ConfigError(f"{where}.{key}: {value!r} is text, not a number (YAML reads 1e12 without a dot as a string); write it as 1.0e12")
    return parse_options(TrainOptions, params, where=where)


def _task_corpus(ctx: TrialContext) -> str | None:
    """The corpus the trial's task scores on, if it has one (held out from training: the same one is refused)."""
    if not ctx.task.get("name"):
        return None
    from paretolab.tasks.held_out import evaluation_corpus

    options = {k: v for k, v in ctx.task.items() if k != "name"}
    try:
        return evaluation_corpus(str(ctx.task["name"]), options)
    except KeyError:
        return None


def held_out_corpus(train_corpus: str) -> str:
    """Where val_loss is measured when the task has no corpus: ``pystdlib-val``, or ``pydoc`` where that is not installed."""
    from paretolab.data import load_corpus
    from paretolab.data.corpora import corpus_identity

    try:
        load_corpus(DEFAULT_VAL_CORPUS)
        return DEFAULT_VAL_CORPUS
    except ConfigError:
        if corpus_identity(train_corpus) == corpus_identity("pydoc"):
            raise ConfigError(f"train: no held-out corpus: {DEFAULT_VAL_CORPUS!r} is not installed and the stage trains on 'pydoc'; "
                              "give the task a corpus to evaluate on") from None
        return "pydoc"


def check_not_evaluation_corpus(train_corpus: str, evaluated: str | None, *, where: str) -> None:
    """Refuse training on the text the task evaluates on (its scores would be on seen tokens)."""
    from paretolab.data.corpora import corpus_identity

    if evaluated is not None and corpus_identity(train_corpus) == corpus_identity(evaluated):
        raise ConfigError(
            f"{where}: {train_corpus!r} is the corpus task.corpus evaluates on ({evaluated!r}); a model trained on its test text "
            f"is scored on tokens it has seen. Train on another corpus (e.g. pystdlib-train) or evaluate on a held-out one (e.g. pystdlib-val)"
        )


def check_train_stages(stages: Any, task_name: str, task_options: dict[str, Any]) -> None:
    """At parse time: every fixed or listed value of a ``train`` stage is in range, and no train corpus is the task's corpus."""
    from paretolab.tasks.held_out import evaluation_corpus

    evaluated = evaluation_corpus(task_name, task_options)
    for stage in stages:
        for opt in stage.options:
            if opt.method != Train.name:
                continue
            where = f"stages.{stage.id}.train.params"
            spec = opt.params.get("corpus")
            corpora = [Train().defaults()["corpus"]] if spec is None else list(getattr(spec, "values", None) or [getattr(spec, "value", None)])
            for corpus in corpora:
                check_not_evaluation_corpus(str(corpus), evaluated, where=f"{where}.corpus")
                for key, given in opt.params.items():
                    for value in list(getattr(given, "values", None) or [getattr(given, "value", None)]):
                        if value is not None:
                            parse_train_options({"corpus": corpus, key: value}, where=where)
            for name in list(getattr(opt.params.get("save_as"), "values", None) or [getattr(opt.params.get("save_as"), "value", None)]):
                if name:
                    check_save_as(str(name), where=f"{where}.save_as")


def check_save_as(template: str, *, where: str) -> None:
    """Refuse a ``save_as`` whose filled-in name cannot be a model source (before any trial trains)."""
    from paretolab.training.checkpoints import check_save_name

    try:
        name = template.format(seed=0, trial=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"{where}: {template!r} has a placeholder other than {{seed}} and {{trial}} ({exc})") from None
    check_save_name(name, where=where)


def curve_history(subject: Subject) -> dict[str, list[tuple[int, float]]]:
    """The curve as MLflow metric histories (step = cumulative training tokens); empty when nothing was trained."""
    if subject.training is None or not subject.training.curve:
        return {}
    rows = subject.training.curve
    return {f"curve.{key}": [(int(r["tokens"]), float(r[key])) for r in rows] for key in ("train_loss", "val_loss")}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Train())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in TRAIN_METRICS:
        register(metric)
