"""A per-layer trial on the Trial page: each group's values (from its parameters) and each module's (from its artifact)."""

from __future__ import annotations

import json
from typing import Any

import pandas as pd


def group_table(params: dict[str, Any]) -> pd.DataFrame:
    """One row per layer group of a per-layer stage: ``method.bits/attention = 3`` -> (method, group, bits=3)."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for name, value in params.items():
        head, sep, group = name.partition("/")
        if not sep:
            continue
        method, _, key = head.rpartition(".")
        rows.setdefault((method, group), {"method": method, "group": group})[key] = value
    return pd.DataFrame(list(rows.values()))


def module_table(artifact: bytes | str) -> pd.DataFrame:
    """One row per module from a trial's ``layers.<stage>.json``: its group and the values it ran with."""
    record = json.loads(artifact)
    rows = [{"module": module, **entry} for module, entry in record.get("modules", {}).items()]
    return pd.DataFrame(rows)
