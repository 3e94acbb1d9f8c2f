"""``paretolab.apply``: one method (or a chain) on any Hugging Face causal LM, outside a study.

    import paretolab
    out = paretolab.apply(model, "wanda", tokenizer=tok, sparsity=0.5, calibration="pydoc")
    out = paretolab.apply(model, ["wanda", ("rtn", {"bits": 4})], tokenizer=tok)
    out.model, out.costs   # the transformed model; size_bytes, seconds per stage, what each method reports

The stages run through the same code as a study's trial (``study.trial.apply_plan``): parameters are
checked as a pipeline's are (names, types, the method's search space), defaults filled in, and the
randomness seeded by ``seed``, so ``apply`` with a trial's parameters and seed gives the trial's model.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject
from paretolab.records import StagePlan

Stage = str | tuple[str, dict[str, Any]] | dict[str, Any]  # a dict may add "layers": {group: {param: value} | "keep"}
CALIBRATION_PARAM = "calib_corpus"  # the parameter every calibrating method takes its text from


@dataclass
class Applied:
    """What ``apply`` returns: the transformed model, the stages as run, and the method's reported costs."""

    model: torch.nn.Module
    subject: Subject
    stages: list[StagePlan]
    costs: dict[str, float] = field(default_factory=dict)  # size_bytes, param_count, transform_s(.<method>), the methods' own
    cost_is: dict[str, str] = field(default_factory=dict)  # method -> "real" (a stored format, a kernel) or "simulated"
    info: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        chain = " → ".join(f"{s.method}({', '.join(f'{k}={v!r}' for k, v in sorted(s.params.items()))})" for s in self.stages)
        from paretolab.plugin_api.numbers import metric_value

        costs = ", ".join(f"{k}={metric_value(k, v)}" for k, v in sorted(self.costs.items()))
        return f"Applied({chain}; {costs}; cost_is={self.cost_is})"


def apply(model: Any, method: str | list[Stage], *, tokenizer: Any = None, calibration: str | list[str] | None = None,
          seed: int = 0, inplace: bool = False, **params: Any) -> Applied:
    """Apply ``method`` (a name with ``**params``, or a list of stages) to ``model`` and return an :class:`Applied`.

    ``model``: a Hugging Face causal LM (with ``tokenizer`` where a method reads text), a :class:`Subject`,
    or a model name ``paretolab models list`` knows (``"smollm2-135m"``, ``"tiny-llama"``). The model is
    copied first unless ``inplace=True``. ``calibration``: a corpus name (``pydoc``, ``wikitext2``), a text
    file's path, or a list of texts, for every stage whose method calibrates (its ``calib_corpus``).
    A stage in a list is ``"name"``, ``("name", {params})`` or ``{"method": name, "params": {...}}``, the last
    with ``"layers": {"attention": {"bits": 8}, "0-9 mlp": {"bits": 3}}`` for a per-layer setting (a pipeline's
    ``layers:``, each group one value; see the pipeline reference).
    """
    from paretolab.plugin_api.manager import registries
    from paretolab.study.fields import lookup
    from paretolab.study.stages import fixed_layers, fixed_params
    from paretolab.study.trial import apply_plan

    if not isinstance(method, (str, list, tuple)):
        raise ConfigError(f"apply: method must be a method name or a list of stages, got {type(method).__name__}")
    if not isinstance(method, str) and params:
        raise ConfigError(f"apply: with a list of stages give each stage its own params, not keyword arguments ({', '.join(sorted(params))})")
    stages = [(method, params, None)] if isinstance(method, str) else [_stage(s, i) for i, s in enumerate(method)]
    if not stages:
        raise ConfigError("apply: the list of stages is empty; give at least one method name")
    methods = registries().methods
    original = _as_subject(model, tokenizer)
    private = not inplace and not isinstance(model, str)  # a model loaded by name is ours to change
    subject = _private_copy(original) if private else original
    with tempfile.TemporaryDirectory(prefix="paretolab-apply-") as tmp:
        corpus = _calibration(calibration, Path(tmp))
        plan = []
        for i, (name, given, layers) in enumerate(stages):
            where = f"apply stage {i} ({name!r})"
            found = lookup(methods, name, f"{where}.method")
            if corpus is not None and CALIBRATION_PARAM in found.defaults() and CALIBRATION_PARAM not in given:
                given = {**given, CALIBRATION_PARAM: corpus}
            plan.append(StagePlan(stage=f"s{i}", method=found.name, params=fixed_params(found, given, where),
                                  layers=fixed_layers(found, layers, f"{where}.layers") if layers is not None else {}))
        if corpus is not None and not any(CALIBRATION_PARAM in methods.get(s.method).defaults() for s in plan):
            raise ConfigError(f"apply: calibration= was given but none of {', '.join(s.method for s in plan)} calibrates; drop it")
        if subject.tokenizer is None and any(CALIBRATION_PARAM in methods.get(s.method).defaults() for s in plan):
            raise ConfigError("apply: a calibrating method reads text; pass tokenizer= (the model's Hugging Face tokenizer)")
        ctx = TrialContext(seed=seed, workdir=Path(tmp) / "work", device=subject.device, base=original if private else None)
        stage_s: dict[str, float] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            subject, ran = apply_plan(subject, plan, ctx, stage_s)
            subject.model.eval()
            costs = _costs(subject, ctx, ran)
    costs["transform_s"] = sum(stage_s.values())
    for i, stage in enumerate(plan):  # per method; a method that runs twice gets #2
        earlier = sum(1 for s in plan[:i] if s.method == stage.method)
        costs[f"transform_s.{stage.method}" + (f"#{earlier + 1}" if earlier else "")] = stage_s[f"transform:{stage.stage}"]
    return Applied(model=subject.model, subject=subject, stages=plan, costs=costs,
                   cost_is={m.name: m.cost_is for m in ran}, info={k: v for k, v in subject.info.items() if isinstance(v, (str, int, float, bool))})


def _stage(raw: Any, index: int) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
    if isinstance(raw, str):
        return raw, {}, None
    if isinstance(raw, tuple) and len(raw) == 2 and isinstance(raw[0], str) and isinstance(raw[1], dict):
        return raw[0], dict(raw[1]), None
    if isinstance(raw, dict) and isinstance(raw.get("method"), str) and set(raw) <= {"method", "params", "layers"}:
        return raw["method"], dict(raw.get("params") or {}), raw.get("layers")
    raise ConfigError(f"apply stage {index}: expected 'name', ('name', {{params}}) or {{'method': name, 'params': {{...}}, "
                      f"'layers': {{group: {{...}}}}}}, got {raw!r}")


def _as_subject(model: Any, tokenizer: Any) -> Subject:
    if isinstance(model, Subject):
        return model
    if isinstance(model, str):
        from paretolab.models import load_subject

        return load_subject(model)
    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"apply: model must be a Hugging Face causal LM, a paretolab Subject or a model name, got {type(model).__name__}")
    name = str(getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__)
    return Subject(model=model, tokenizer=tokenizer, model_name=name)


def _private_copy(subject: Subject) -> Subject:
    """A copy to transform, so the caller's model and tokenizer stay as they were."""
    twin = subject.copy()
    twin.tokenizer = copy.deepcopy(subject.tokenizer) if subject.tokenizer is not None else None  # the caller keeps theirs
    return twin


def _calibration(calibration: str | list[str] | None, tmp: Path) -> str | None:
    """The ``calib_corpus`` value for ``calibration``: a corpus name or path as given, a list of texts written to a file."""
    if calibration is None or isinstance(calibration, str):
        if isinstance(calibration, str):
            from paretolab.data.corpora import load_corpus

            try:
                load_corpus(calibration)
            except Exception as exc:
                raise ConfigError(f"apply: calibration={calibration!r}: {exc}") from None
        return calibration
    if isinstance(calibration, (list, tuple)) and calibration and all(isinstance(t, str) for t in calibration):
        path = tmp / "calibration.txt"
        path.write_text("\n\n".join(calibration), encoding="utf-8")
        return str(path)
    raise ConfigError("apply: calibration= takes a corpus name, a text file's path or a non-empty list of texts")


def _costs(subject: Subject, ctx: TrialContext, ran: list[Any]) -> dict[str, float]:
    """The built-in size and parameter counts, then what each method's ``measure`` reports, then role-model costs."""
    from paretolab.measure.measures import NoOptions, ParamCount, Size

    costs = {**Size().measure(subject, NoOptions(), ctx), **ParamCount().measure(subject, NoOptions(), ctx)}
    for method in ran:
        costs.update({k: float(v) for k, v in method.measure(subject, ctx).items()})
    costs.update(ctx.costs.metrics())
    return costs
