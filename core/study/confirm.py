"""A pipeline's ``confirm:`` block: keep a share of the task's examples from the search, for ``paretolab pick`` to confirm
its choice on (see :mod:`paretolab.plugin_api.examples`)::

    confirm: {share: 0.5, seed: 0}   # half the windows (questions) held out, drawn by seed 0

Every trial then scores the search part only (its ``info.examples`` says which: "search part: 6 of 12 windows (...): windows 0,2,...");
the split is part of the pipeline's hash, since it changes what every trial scores.
"""

from __future__ import annotations

import math
from typing import Any

from paretolab.errors import ConfigError
from paretolab.study.fields import no_unknown

MAX_SHARE = 0.9
EXAMPLE = "{share: 0.5, seed: 0}"


def parse_confirm(raw: Any, task_name: str, regs: Any) -> dict[str, Any] | None:
    """``{share, seed}`` of a valid ``confirm:`` block (None without one); refused for a task that cannot split."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"confirm: expected a mapping like {EXAMPLE}, got {raw!r}")
    no_unknown(raw, ("share", "seed"), "confirm.")
    share, seed = raw.get("share", 0.5), raw.get("seed", 0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or not 0 < share <= MAX_SHARE:
        raise ConfigError(f"confirm.share: the confirm part's share of the examples, above 0 and at most {MAX_SHARE}; got {share!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"confirm.seed: a whole number >= 0 that draws the split; got {seed!r}")
    task = regs.tasks.get(task_name)
    if not getattr(task, "splits", False):
        able = sorted(t.name for t in regs.tasks if getattr(t, "splits", False))
        raise ConfigError(f"confirm: the task {task_name!r} does not split its examples into a search and a confirm part; "
                          f"tasks that do: {', '.join(able)} (or remove confirm:)")
    return {"share": float(share), "seed": int(seed)}


def search_split(confirm: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``TrialSettings.split`` of a search trial under ``confirm`` (None without a split)."""
    return {**confirm, "part": "search"} if confirm else None
