"""A decision confirmed on data the search never saw: the choice, its rivals and the rule's baseline re-applied (as
``paretolab export`` re-applies a trial) and scored on the pipeline's confirm part (``confirm:``), the rule judged
again there by the same verdict path (:func:`paretolab.results.claims.judge`).

The trial that looks best among many was partly lucky on the examples that chose it (the winner's curse); its score
on the confirm part is not. How far its effect moved between the parts is the shrinkage the decision record reports.
A calibrated method is re-applied on fresh calibration draws too (each ``calib_seed`` moved by ``FRESH_DRAWS``): its
choice was also partly lucky in the draws that made it.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from paretolab.errors import ConfigError
from paretolab.results.pick import Candidate, Confirmation, Decision, judge_candidate
from paretolab.stores.locations import Stores

FRESH_DRAWS = 1000  # added to every calib_seed of a re-applied trial: draws no trial of the search made


def fresh_draws(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's parameters with every calibration draw replaced by a fresh one (``calib_seed`` + ``FRESH_DRAWS``)."""
    return {k: v + FRESH_DRAWS if k.split(".")[-1] == "calib_seed" and isinstance(v, int) and not isinstance(v, bool) else v
            for k, v in params.items()}


def confirm(decision: Decision, *, stores: Stores | None = None, progress: Any = print) -> Confirmation:
    """Score the decision's choice, rivals and baseline on the confirm part and judge its rule there (kept on the decision)."""
    from paretolab.api.export import _complete_trial, rerun
    from paretolab.models import load_subject
    from paretolab.results.metric_facts import chance_levels, metric_bounds, metric_exact
    from paretolab.stats import ARTIFACT
    from paretolab.stores.locations import resolve_stores
    from paretolab.study.spec import parse_spec

    if decision.choice is None:
        raise ConfigError(f"pick: nothing to confirm: {decision.why}")
    stores = stores or resolve_stores(create=False)
    first = int(decision.choice.trials[0]["trial"])
    _, record = _complete_trial(decision.study, first, stores)
    spec = parse_spec(record["pipeline"], source=f"study {decision.study!r}'s stored pipeline")
    if spec.confirm is None:
        raise ConfigError(f"study {decision.study!r} has no confirm split: add `confirm: {{share: 0.5, seed: 0}}` to its "
                          "pipeline and run it again (the search then scores the other part only)")
    base = load_subject(spec.model)
    wanted = [decision.baseline_config, decision.choice, *decision.rivals]
    scored: dict[int, dict[str, Any]] = {}
    per_example: dict[str, Any] = {}
    refreshed = False
    for cand in [c for c in wanted if c is not None]:
        for trial in cand.trials:
            number = int(trial["trial"])
            if number in scored:
                continue
            frozen, _ = _complete_trial(decision.study, number, stores)
            params = fresh_draws(dict(frozen.params))
            fresh = " on fresh calibration draws" if params != dict(frozen.params) else ""
            refreshed = refreshed or bool(fresh)
            progress(f"confirm part: re-applying trial {number} of {decision.study!r} ({cand.name()}){fresh} ...")
            _, result, _ = rerun(spec, SimpleNamespace(params=params, number=frozen.number), base, part="confirm")
            run_id = f"confirm:{number}"
            scored[number] = {**trial, **result.metrics, "run_id": run_id, "info": dict(result.info)}
            payload = result.artifacts.get(ARTIFACT)
            per_example[run_id] = json.loads(payload) if payload else None
    said = str(next(iter(scored.values()))["info"].get("examples", ""))
    out = Confirmation(examples=said.rsplit(": ", 1)[0], fresh_draws=refreshed)  # "confirm part: 8 of 16 windows (...)", no indices
    baseline = [scored[int(t["trial"])] for t in decision.baseline_config.trials] if decision.baseline_config else []
    for cand in [c for c in wanted[1:] if c is not None]:
        again = Candidate(cand.label, cand.settings, [scored[int(t["trial"])] for t in cand.trials], named=cand.named)
        judge_candidate(again, decision, baseline, per_example.get, metric_bounds,
                        chance_levels(record["pipeline"]), metric_exact)
        out.candidates[cand.name()] = again
    decision.confirmation = out
    return out
