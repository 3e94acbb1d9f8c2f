"""The dashboard's tables as plain functions (no Streamlit): every number written by ``paretolab.plugin_api.numbers``,
the one formatter the CLI and the report use, so a value reads the same on every surface."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from paretolab.plugin_api.numbers import metric_value, param_value

TEXT_COLUMNS = ("number", "methods", "simulated", "noise", "state")  # never numbers to format


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and value != value)


def frontier_table(front: pd.DataFrame, metrics: list[str], params: list[str]) -> pd.DataFrame:
    """The Frontier page's table: trial, the plotted metrics in their units, methods, params, noise, all as text."""
    shown = front.drop(columns=["hover", "frontier"], errors="ignore").copy()
    for column in shown.columns:
        if column == "number":
            shown[column] = shown[column].astype(int)  # the trial number stays a number: the table sorts by it
        elif column in metrics:
            shown[column] = shown[column].map(lambda v, c=column: metric_value(c, v) if _present(v) else "")
        elif column in params:
            shown[column] = shown[column].map(lambda v: param_value(v) if _present(v) else "")
        else:
            shown[column] = shown[column].map(lambda v: "" if not _present(v) else str(v))
    return shown


def compare_table(rows: pd.DataFrame, fields: list[str], params: list[str]) -> pd.DataFrame:
    """The Compare page's side-by-side table: one column per trial, one row per field, numbers by the one formatter."""
    cells = {}
    for number, row in rows.iterrows():
        cells[f"trial {number}"] = [_cell(row.get(f), f, f in params) for f in fields]
    return pd.DataFrame(cells, index=[f.removeprefix("param:") for f in fields])


def key_values(values: Mapping[str, Any], *, metrics: bool = False) -> pd.DataFrame:
    """A name/value table (the Trial page's parameters, metrics, MLflow params and tags)."""
    return pd.DataFrame({"name": list(values), "value": [_cell(v, k, not metrics) for k, v in values.items()]})


def _cell(value: Any, name: str, is_param: bool) -> str:
    if hasattr(value, "item"):
        value = value.item()
    if not _present(value):
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return param_value(value) if is_param or name in TEXT_COLUMNS else metric_value(name, value)
