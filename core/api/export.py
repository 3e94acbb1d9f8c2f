"""``paretolab export STUDY TRIAL --out DIR``: the model a trial measured, as a directory ``transformers`` loads.

The trial is run again (``study.trial.run_trial``, the worker's code) on its base model with its
parameters, seed and task, so the exported model is the one the trial measured; its quality metric
is compared with the recorded one (within the recorded interval, or by how much it differs). The
directory holds ``model.safetensors`` + ``config.json`` (``AutoModelForCausalLM.from_pretrained``),
the tokenizer, ``paretolab.json`` (pipeline, stages, params, metrics, provenance, sizes) and, where
a method has a compact format, ``compact/`` (see :mod:`paretolab.api.compact`). It is written under
``DIR.partial`` and renamed into place (exchanged with an earlier export in one step): a failed or killed export
leaves nothing half-written at ``DIR``. Its files get the user's umask, and ``paretolab.json`` lists each with its size and
sha256: ``--force`` replaces only a directory whose record lists exactly the files it holds.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from paretolab.api import compact
from paretolab.data.fidelity import logit_gap, probe_logits, quiet, reload
from paretolab.data.outputs import check_export_dir, follow_umask, manifest, replace_dir, write_atomic, writing
from paretolab.errors import ConfigError
from paretolab.plugin_api import artifacts
from paretolab.plugin_api.numbers import number
from paretolab.plugin_api.storage import unique_parameters
from paretolab.plugin_api.subject import Subject
from paretolab.stores.locations import Stores

RECORD = "paretolab.json"
ARTIFACT_DIR = "artifact"  # the method's own artefact, as its library wrote it (a GGUF, a compressed-tensors checkpoint)
SERVE_HINTS = {"gguf": "serve: python -m llama_cpp.server --model {path}",
               "compressed-tensors": "serve: vllm serve {path}; load: AutoModelForCausalLM.from_pretrained('{path}')"}
LOGIT_TOLERANCE = 1e-4  # relative: the reloaded directory must compute what the trial's model computed


class ExportError(ConfigError):
    """An export refused: a failed trial, a missing base, an existing output, a method with no export path."""


@dataclass
class Exported:
    """What ``export`` wrote and what it checked."""

    out: Path
    study: str
    trial: int
    metric: str = ""
    recorded: float | None = None
    reproduced: float | None = None
    interval: tuple[float, float] | None = None
    within: bool | None = None
    exact: bool = False  # the re-applied value equals the recorded one (to 1e-6 relative)
    sizes: dict[str, float] = field(default_factory=dict)  # bytes: dense on disk, compact on disk, dense fp16, the trial's size_bytes
    compact: dict[str, str] = field(default_factory=dict)  # tensor -> format written in compact/
    simulated_by: list[str] = field(default_factory=list)
    logit_gap: dict[str, float] = field(default_factory=dict)  # "dense" / "compact": reloaded vs the trial's model, relative
    saved_as: str = ""
    compact_fallback: str = ""  # why compact/ is paretolab's own layout, not compressed-tensors ("" when it is not a fallback)
    artifact: dict[str, Any] = field(default_factory=dict)  # the method's own artefact under artifact/ (artifacts.artifact_info)

    def lines(self) -> list[str]:
        """What the CLI prints."""
        out = [f"exported trial {self.trial} of {self.study!r} to {self.out}"]
        if self.recorded is not None and self.reproduced is not None:
            span = f" (recorded 95 % interval [{number(self.interval[0], digits=6)}, {number(self.interval[1], digits=6)}])" if self.interval else ""
            delta = number(self.reproduced - self.recorded, signed=True)
            verdict = "reproduced exactly" if self.exact else f"reproduced within the interval (Δ {delta})" if self.within else f"DIFFERS by {delta}"
            out.append(f"  {self.metric}: re-applied {number(self.reproduced, digits=6)} vs recorded {number(self.recorded, digits=6)}{span}: {verdict}")
        out.append("  sizes: " + ", ".join(f"{k} {number(v, 'bytes')}" for k, v in self.sizes.items()))  # decimal MB, as every surface
        if self.compact:
            kinds = sorted(set(self.compact.values()))
            how = (f"AutoModelForCausalLM.from_pretrained('{self.out / 'compact'}') with compressed-tensors installed"
                   if any("pack-quantized" in k for k in kinds) else "paretolab.api.compact.load_compact")
            out.append(f"  compact/: {len(self.compact)} tensor(s) as {', '.join(kinds)}, logits within {number(self.logit_gap.get('compact', 0), digits=2)} "
                       f"(relative) of the trial's model (load: {how})")
            if self.compact_fallback:
                out.append(f"  compact/ is paretolab's own layout, not compressed-tensors: {self.compact_fallback}")
        if self.simulated_by:
            out.append(f"  simulated saving ({', '.join(self.simulated_by)}): the dense weights hold the method's values in full "
                       "precision; the trial's size_bytes counts the format" + (" compact/ writes" if self.compact else " no file here has"))
        if self.artifact.get(artifacts.PATH):
            path = self.out / ARTIFACT_DIR / Path(self.artifact[artifacts.PATH]).name
            serve = SERVE_HINTS.get(self.artifact.get(artifacts.KIND, ""), "")
            out.append(f"  {ARTIFACT_DIR}/: {self.artifact.get(artifacts.BY)}'s own {self.artifact.get(artifacts.KIND)} artefact as its library "
                       f"wrote it: {path}" + (f" ({serve.format(path=path)})" if serve else ""))
        elif self.artifact.get(artifacts.DROPPED):
            out.append(f"  no {ARTIFACT_DIR}/: {self.artifact[artifacts.DROPPED]}")
        if self.saved_as:
            out.append(f"  saved as model {self.saved_as!r}: use it as `model: {self.saved_as}` in a pipeline")
        return out


def export(study: str, trial: int, out: str | Path, *, stores: Stores | None = None, force: bool = False,
           save_as: str | None = None, progress: Any = print, card: Any = None) -> Exported:
    """Re-apply trial ``trial`` of ``study`` and write its model to ``out`` (see the module's docstring).

    ``save_as``: also keep it as a model source of that name (``paretolab models list``), usable as a base.
    ``card``: ``Exported -> str``, the directory's README.md (``pick --export`` writes the decision's model card there).
    """
    from paretolab.stores.locations import resolve_stores

    stores = stores or resolve_stores(create=False)
    out = check_export_dir(out, force=force, record=RECORD)  # before the ~minute of work, not after it
    if save_as:
        from paretolab.training.checkpoints import check_save_name

        check_save_name(save_as, where="--save-as")
    with writing(out):
        return _export(study, trial, out, stores, force, save_as, progress, card)


def _export(study: str, trial: int, out: Path, stores: Stores, force: bool, save_as: str | None, progress: Any,
            card: Any = None) -> Exported:
    from paretolab.models import check_model, load_subject
    from paretolab.study.spec import parse_spec

    frozen, record = _complete_trial(study, trial, stores)
    model = str(record["pipeline"].get("model", "")) if isinstance(record["pipeline"], dict) else ""
    try:
        check_model(model)
    except Exception as exc:
        raise ExportError(f"study {study!r}: its base model {model!r} is missing here ({exc}); pull or train it again "
                          f"(paretolab models pull {model}, or the pipeline that saved it)") from None
    spec = parse_spec(record["pipeline"], source=f"study {study!r}'s stored pipeline")
    progress(f"re-applying trial {trial} of {study!r} on {spec.model} ...")
    base = load_subject(spec.model)
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)  # a killed export's
    try:
        subject, result, plan = rerun(spec, frozen, base, hold=staging / ARTIFACT_DIR)
        exported = Exported(out=out, study=study, trial=trial, simulated_by=list(subject.simulated_by))
        exported.artifact = artifacts.artifact_info(subject)
        _compare(exported, record["metrics"], result.metrics, spec.task)
        progress(f"writing {out} ...")
        with quiet():
            _write(subject, staging, exported, record, result.metrics, [s.method for s in plan if s.method != "none"], result.history, card)
        if out.exists() or out.is_symlink():  # checked again: --force replaces an earlier export only, even one that changed meanwhile
            check_export_dir(out, force=force, record=RECORD)
        replace_dir(staging, out)  # one rename (or one exchange with the earlier export): never a half directory at --out
    except OSError as exc:
        raise ExportError(f"--out {out}: writing it failed ({exc.strerror or exc}); nothing was left half-written there: "
                          "free some space or pick another directory") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if save_as:
        from paretolab.training.checkpoints import save_trained

        try:
            with quiet():
                save_trained(subject, save_as, {"exported_from": f"{study}#{trial}", "params": record["params"], "metrics": record["metrics"]})
        except OSError as exc:
            raise ExportError(f"--save-as {save_as}: saving the model source failed ({exc.strerror or exc}); the export at {out} is complete") from None
        exported.saved_as = save_as
    return exported


def _complete_trial(study: str, number: int, stores: Stores) -> tuple[Any, dict[str, Any]]:
    """The Optuna trial and its record (pipeline, params, MLflow metrics); refuses a trial that is not complete."""
    import optuna

    from paretolab.results.read import failure_reasons, load_study

    loaded = load_study(study, stores)
    trials = {t.number: t for t in loaded.get_trials(deepcopy=False)}
    if number not in trials:
        raise ExportError(f"study {study!r} has no trial {number} (trials 0..{max(trials, default=-1)}); `paretolab frontier {study}` lists the good ones")
    frozen = trials[number]
    if frozen.state != optuna.trial.TrialState.COMPLETE:
        why = failure_reasons([frozen])
        reason = f": {why[0][0]}" if why else ""
        raise ExportError(f"trial {number} of {study!r} is {frozen.state.name.lower()}{reason}; export a complete trial (`paretolab frontier {study}`)")
    pipeline = loaded.user_attrs.get("pipeline")
    if not pipeline:
        raise ExportError(f"study {study!r} has no stored pipeline (written by an older paretolab); run it again to export its trials")
    metrics = dict(zip([m for m, _ in loaded.user_attrs.get("objectives", [])], frozen.values or []))
    metrics.update(_mlflow_metrics(stores, str(frozen.user_attrs.get("mlflow_run_id", ""))))
    return frozen, {"pipeline": pipeline, "params": dict(frozen.params), "metrics": metrics,
                    "model": loaded.user_attrs.get("model", ""), "code_version": loaded.user_attrs.get("code_version", "")}


def _mlflow_metrics(stores: Stores, run_id: str) -> dict[str, float]:
    if not run_id:
        return {}
    from mlflow.tracking import MlflowClient

    try:
        return dict(MlflowClient(tracking_uri=stores.tracking_uri).get_run(run_id).data.metrics)
    except Exception:  # the MLflow store moved or lost the run: the Optuna values are all we have
        return {}


def rerun(spec: Any, frozen: Any, base: Subject, hold: Path | None = None, part: str = "search") -> tuple[Subject, Any, list[Any]]:
    """Run the trial as its worker did (same plan, seed, task) and keep the transformed subject; ``hold``: where the
    method's own artefact (a GGUF, a compressed-tensors checkpoint) is copied before the trial's folder goes; ``part``:
    under a pipeline's ``confirm:`` split, the part its task scores (the search's own, or ``confirm`` for ``pick``)."""
    import optuna

    from paretolab.measure.timing import torch_threads
    from paretolab.records import TrialSettings
    from paretolab.study.search import plan_trial
    from paretolab.study.trial import run_trial
    from paretolab.study.worker import load_roles

    plan = plan_trial(optuna.trial.FixedTrial(dict(frozen.params)), spec)
    # a train stage's save_as would overwrite the checkpoint the study saved: the export saves where it is told instead
    plan = [replace(s, params={**s.params, "save_as": ""}) if s.params.get("save_as") else s for s in plan]
    settings = TrialSettings(spec.name, spec.task, spec.task_options, {"size": {}, "params": {}}, spec.search.seed,
                             cpus=spec.resources.cpus, timeout_s=0.0, models=dict(spec.models), prices=dict(spec.prices),
                             split={**spec.confirm, "part": part} if spec.confirm else None)
    kept: list[Subject] = []

    def keep(subject: Subject) -> None:
        kept.append(subject)
        copy = artifacts.copy_artifact(subject, hold) if hold is not None else None
        if copy is not None:
            subject.info[artifacts.PATH] = str(copy)
    threads = max(1, int(spec.resources.cpus)) if spec.resources.cpus else 0  # Ray ran the trial with OMP_NUM_THREADS = its cpus
    with torch_threads(threads):  # a different thread count sums in another order: training-like methods drift from it
        result = run_trial(base, plan, settings, frozen.number, roles=load_roles(spec.models, spec.model, base), keep=keep)
    if result.error or not kept:
        raise ExportError(f"re-applying trial {frozen.number} failed: {result.error or 'no model came back'}")
    return kept[0], result, plan


def _compare(exported: Exported, recorded: dict[str, float], now: dict[str, float], task: str) -> None:
    """The task's first quality metric, recorded vs re-applied, judged against the recorded interval."""
    from paretolab.plugin_api.manager import registries

    names = [m for m in registries().tasks.get(task).metrics if m in recorded and m in now and not m.endswith(("_ci_low", "_ci_high"))]
    if not names:
        return
    metric = names[0]
    exported.metric, exported.recorded, exported.reproduced = metric, recorded[metric], now[metric]
    low, high = recorded.get(f"{metric}_ci_low"), recorded.get(f"{metric}_ci_high")
    exported.interval = (low, high) if low is not None and high is not None else None
    exported.exact = abs(now[metric] - recorded[metric]) <= 1e-6 * max(1.0, abs(recorded[metric]))
    exported.within = exported.exact or (exported.interval is not None and low <= now[metric] <= high)


def _write(subject: Subject, staging: Path, exported: Exported, record: dict[str, Any], metrics: dict[str, float], methods: list[str],
           history: Any = None, card: Any = None) -> None:
    from paretolab.version import __version__, code_version

    named = ", ".join(methods) or "the unmodified model"
    try:
        plain = compact.dense_twin(subject)
    except TypeError as exc:
        raise ExportError(f"no export path for {named}: {exc}; transformers cannot rebuild this model from a config") from None
    reference = probe_logits(subject.model)
    plain.save_pretrained(staging, safe_serialization=True)
    if subject.tokenizer is not None:
        subject.tokenizer.save_pretrained(staging)
    exported.logit_gap["dense"] = logit_gap(reload(staging), reference)
    if exported.logit_gap["dense"] > LOGIT_TOLERANCE:
        raise ExportError(f"no export path for {named}: the saved model's logits differ from the trial's model by "
                          f"{number(exported.logit_gap['dense'], digits=2)} (relative); its forward pass is not what transformers rebuilds")
    fallback: list[str] = []
    exported.compact = compact.write(subject, plain, staging / "compact", fallback)
    exported.compact_fallback = "; ".join(fallback)
    if exported.compact:
        exported.logit_gap["compact"] = logit_gap(compact.load_compact(staging), reference)
    params = [t for _, t in unique_parameters(plain)]
    exported.sizes = {"dense on disk": float(_bytes(staging, "*.safetensors")), "dense fp16": float(2 * sum(t.numel() for t in params))}
    if exported.compact:
        exported.sizes["compact on disk"] = float(_bytes(staging / "compact", "*"))
    if "size_bytes" in record["metrics"]:
        exported.sizes["trial size_bytes"] = float(record["metrics"]["size_bytes"])
    info = {
        "study": exported.study, "trial": exported.trial, "pipeline": record["pipeline"], "params": record["params"],
        "metrics": record["metrics"], "reapplied_metrics": metrics, **({"training_curve": history} if history else {}),
        "reproduced": {"metric": exported.metric, "recorded": exported.recorded, "reapplied": exported.reproduced,
                       "interval": exported.interval, "within": exported.within},
        "base": {"model": subject.model_name, "study_code_version": record["code_version"]},
        "paretolab": {"version": __version__, "code_version": code_version()},
        "sizes_bytes": exported.sizes, "compact": exported.compact, "compact_fallback": exported.compact_fallback,
        "artifact": {**exported.artifact, **({artifacts.PATH: f"{ARTIFACT_DIR}/{Path(exported.artifact[artifacts.PATH]).name}"} if exported.artifact.get(artifacts.PATH) else {})},
        "logit_gap": exported.logit_gap, "simulated_by": exported.simulated_by,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if card is not None:
        write_atomic(staging / "README.md", card(exported))
    follow_umask(staging)  # safetensors and tokenizers write some files private (0600); the user's umask decides
    info["files"] = manifest(staging, skip=RECORD)  # what --force checks before it replaces this directory
    write_atomic(staging / RECORD, json.dumps(info, indent=1, default=str))


def _bytes(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.glob(pattern) if p.is_file())
