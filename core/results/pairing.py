"""Which stored trials a claim compares: its arms (labels), pairs matched on replicates and settings, groups per setting.

A trial is ``{"trial", "label", "params": {"stage.method.param" or "method.param": value}, metrics...}``.
A label names what the choice stages picked (``bhyt``, ``none``, ``magnitude+rtn``) and may end in
``[param=value, ...]`` to take only the trials whose methods ran with those values.

A method trial and a baseline trial are a *pair* when they have the same value of every replicate
(the claim's ``replicates``: seeds, calibration draws, splits) and of every shared setting. A
setting that varies on one side only (the method's own ``quantile``, a baseline's own ``k``)
and a shared setting that takes several values both split the comparison into *groups*, one per
setting: a verdict is given per group, never pooled over settings as if they were draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paretolab.results.replicates import is_replicate
from paretolab.study.report_spec import Claim, split_label

NONE = "none"
FIXED = ("fixed",)  # the replicate key of a side that does not vary by replicate


@dataclass
class Group:
    """The pairs of one setting; ``setting`` names the values that tell this group from the others (empty when alone)."""

    setting: tuple[tuple[str, str], ...]
    pairs: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def label(self) -> str:
        return ", ".join(f"{name}={value}" for name, value in self.setting)


def trial_label(choices: dict[str, str]) -> str:
    """The label of what a trial's choice stages picked: non-``none`` methods joined by ``+``, else ``none``."""
    picked = [m for m in choices.values() if m != NONE]
    return "+".join(picked) or NONE


def selects(label: str, trial: dict[str, Any], chosen: set[str] | None = None) -> bool:
    """The trial has ``label``'s methods and ran them with the values its brackets ask for.

    ``chosen``: the methods some trial's choice stages picked (its label). A method of the label outside them is a
    fixed stage's (``rtn[bits=4]`` where rtn is no choice): the trial must have run it, and its label is the rest."""
    base, wanted = split_label(label)
    methods = base.split("+")
    picks = methods if chosen is None else [m for m in methods if m in chosen or m == NONE]
    if trial["label"] != ("+".join(picks) or NONE):
        return False
    if any(m not in picks and m not in _ran(trial) for m in methods):
        return False
    for name, value in wanted.items():
        ran = [v for k, v in trial["params"].items() if short(k) == name and method_of(k) in methods]
        if not ran or not all(_same(v, value) for v in ran):
            return False
    return True


def _ran(trial: dict[str, Any]) -> set[str]:
    """The methods a trial ran: those its parameters belong to and those its stages record (``stage0.method``)."""
    logged = trial.get("run_params", {})
    return {method_of(k) for k in trial["params"]} | {str(v) for k, v in logged.items() if k.count(".") == 1 and k.endswith(".method")}


def method_of(param: str) -> str:
    """The method a parameter name belongs to: ``stage1.train.lr`` and ``train.lr`` -> ``train``."""
    parts = param.split(".")
    return parts[-2] if len(parts) >= 2 else ""


def short(param: str) -> str:
    return param.split(".")[-1]


def _same(value: Any, text: str) -> bool:
    try:
        return float(value) == float(text)
    except (TypeError, ValueError):
        return str(value) == text


def group_pairs(claim: Claim, trials: list[dict[str, Any]]) -> tuple[list[Group], int]:
    """The claim's (method, baseline) pairs, one group per setting; and how many keys had more than one trial on a side.

    A key with two trials on one side that no setting tells apart cannot be paired and is counted, not guessed.
    """
    (m_base, m_wanted), (b_base, b_wanted) = split_label(claim.method), split_label(claim.baseline)
    own = {*m_base.split("+"), *b_base.split("+")}
    same_methods = m_base == b_base  # layerdrop[score=greedy_bi] vs layerdrop[score=random]: their other params must match
    selected = {*m_wanted, *b_wanted}

    chosen = {m for t in trials for m in t["label"].split("+")}  # what choice stages picked; a label's other methods are fixed stages'
    sides: dict[str, list[dict[str, Any]]] = {"method": [], "baseline": []}
    for trial in trials:
        if not isinstance(trial.get(claim.metric), (int, float)):
            continue
        if selects(claim.method, trial, chosen):
            sides["method"].append(trial)
        elif selects(claim.baseline, trial, chosen):
            sides["baseline"].append(trial)
    full = {side: {k for t in ts for k in t["params"]} for side, ts in sides.items()}
    # the replicate parameters both sides have; when none is shared (puzzle_moe.calib_seed vs expert_drop.calib_seed), each side's own
    reps = {k for k in full["method"] & full["baseline"] if is_replicate(k, claim.replicates)}
    if not reps:
        reps = {k for k in full["method"] | full["baseline"] if is_replicate(k, claim.replicates)}

    def setting_name(k: str) -> str | None:
        if k in reps or (short(k) in selected and method_of(k) in own):
            return None  # a replicate, or what a bracket already selected
        if method_of(k) in own and not same_methods and not (k in full["method"] and k in full["baseline"]):
            return short(k)  # rfid_moe.memory and svd_moe.memory are the same setting
        return k

    # a side none of whose trials has a replicate parameter does not vary by replicate (magnitude pruning beside Wanda's
    # calibration draws): its trial pairs with the other side's trial of every replicate
    fixed = {side for side, ts in sides.items() if ts and not full[side] & reps}

    def split(trial: dict[str, Any], side: str) -> tuple[tuple[Any, ...], dict[str, str]] | None:
        rep = tuple(repr(v) for k, v in sorted(trial["params"].items()) if k in reps)  # one value per stage that has it
        if claim.replicates and not rep:
            if side not in fixed:
                return None
            rep = FIXED
        named = {}
        for k, v in trial["params"].items():
            if (name := setting_name(k)) is not None:
                named[name] = _text(v)
        return rep, named

    parts = {side: [(t, s) for t in ts if (s := split(t, side)) is not None] for side, ts in sides.items()}
    values = {side: {} for side in parts}  # setting name -> the values it takes on that side
    for side, ps in parts.items():
        for _, (_, named) in ps:
            for n, v in named.items():
                values[side].setdefault(n, set()).add(v)
    # a setting both sides have; a method's own short name only when the two sides share a value of it (both
    # memory=0.5), else it is two methods' unrelated knobs that happen to share a name (sdr.threshold, route.threshold)
    common = sorted(n for n in values["method"].keys() & values["baseline"].keys()
                    if "." in n or values["method"][n] & values["baseline"][n])

    def keyed(side: str) -> dict[tuple[Any, ...], dict[tuple[tuple[str, str], ...], list[dict[str, Any]]]]:
        out: dict[tuple[Any, ...], dict[tuple[tuple[str, str], ...], list[dict[str, Any]]]] = {}
        for trial, (rep, named) in parts[side]:
            key = (rep, tuple((n, named.get(n, "")) for n in common))
            extra = tuple(sorted((n, v) for n, v in named.items() if n not in common))
            out.setdefault(key, {}).setdefault(extra, []).append(trial)
        return out

    method, baseline = keyed("method"), keyed("baseline")
    groups: dict[tuple[Any, ...], Group] = {}
    ambiguous = 0
    keys = [(k, k) for k in set(method) & set(baseline)]
    if "baseline" in fixed and "method" not in fixed:
        keys = [(k, (FIXED, k[1])) for k in method if (FIXED, k[1]) in baseline]
    elif "method" in fixed and "baseline" not in fixed:
        keys = [((FIXED, k[1]), k) for k in baseline if (FIXED, k[1]) in method]
    for m_key, b_key in sorted(keys, key=repr):
        for m_extra, m_trials in sorted(method[m_key].items()):
            for b_extra, b_trials in sorted(baseline[b_key].items()):
                if len(m_trials) != 1 or len(b_trials) != 1:
                    ambiguous += 1
                    continue
                gid = (m_key[1], m_extra, b_extra)
                groups.setdefault(gid, Group(())).pairs.append((m_trials[0], b_trials[0]))
    return _name_groups(groups), ambiguous


def _name_groups(groups: dict[tuple[Any, ...], Group]) -> list[Group]:
    """Give each group the settings that vary across groups (``sparsity=0.5``), in a stable order."""
    items = sorted(groups.items(), key=lambda kv: repr(kv[0]))
    if len(items) <= 1:
        return [g for _, g in items]
    flat = [dict((*gid[0], *gid[1], *gid[2])) for gid, _ in items]
    varying = sorted({n for d in flat for n in d if len({e.get(n) for e in flat}) > 1})
    for (_, group), values in zip(items, flat):
        group.setting = tuple((short(n), values.get(n, "–")) for n in varying)
    return [g for _, g in items]


def pair_trials(claim: Claim, trials: list[dict[str, Any]]) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], int]:
    """Every pair of every group (flattened), and the ambiguous count."""
    groups, ambiguous = group_pairs(claim, trials)
    return [p for g in groups for p in g.pairs], ambiguous


def _text(value: Any) -> str:
    """A setting's value as a verdict names it (``lr=0.00005``, not ``5e-05``); 6 digits keep close settings apart."""
    from paretolab.plugin_api.numbers import number

    return number(value, digits=6) if isinstance(value, float) else str(value)
