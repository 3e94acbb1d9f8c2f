"""What every page needs: the stores, the chosen study, and its trials (cached by the data path)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import pandas as pd

from paretolab.dashboard import data, runs
from paretolab.dashboard.cluster import ADDRESS_ENV
from paretolab.data.names import markdown_text
from paretolab.stores import Stores, resolve_stores


def label(text: object) -> str:
    """Text from a store or a bundle (a study's name, a failure reason) as a page shows it: its control, bidi and
    Markdown characters escaped (``paretolab.data.names.markdown_text``), so it reads as the characters it is."""
    return markdown_text(text, inline=True)


def file_part(name: str) -> str:
    """A study's name as part of a download's file name: only letters, digits and ``_ . -`` (the rest as ``_``)."""
    import re

    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "study"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The app's own arguments (after ``--`` on the ``streamlit run`` line); env vars fill the rest."""
    parser = argparse.ArgumentParser(prog="paretolab dashboard app")
    parser.add_argument("--home")
    parser.add_argument("--storage")
    parser.add_argument("--tracking-uri")
    parser.add_argument("--address")
    args, _ = parser.parse_known_args(argv)
    return args


def stores_from(args: argparse.Namespace) -> Stores:
    return resolve_stores(home=args.home, optuna_url=args.storage, tracking_uri=args.tracking_uri, create=False)  # the dashboard only reads


def ray_address(args: argparse.Namespace) -> str | None:
    return args.address or os.environ.get(ADDRESS_ENV) or None


def methods_cost() -> dict[str, str]:
    """Method name -> ``real``/``simulated``, from the registry (empty if plugins fail to load)."""
    try:
        from paretolab.plugin_api.manager import registries

        return {m.name: m.cost_is for m in registries().methods}
    except Exception:
        return {}


def metric_directions() -> dict[str, str]:
    try:
        from paretolab.plugin_api.manager import registries

        return {m.name: m.direction for m in registries().metrics}
    except Exception:
        return {}


@dataclass
class Context:
    """The stores and the study a page renders; trials are read lazily, through the cache."""

    stores: Stores
    address: str | None
    studies: list[data.StudyInfo]
    study: data.StudyInfo | None

    @cached_property
    def table(self) -> data.TrialTable:
        assert self.study is not None, "pages check ctx.study first"
        return data.load_trials(self.stores.optuna_url, self.study.name, methods_cost=methods_cost())

    @cached_property
    def runs(self) -> pd.DataFrame:
        """MLflow metrics and tags per trial number (empty frame if MLflow has nothing)."""
        assert self.study is not None
        try:
            return runs.trial_metrics_cached(self.stores.tracking_uri, self.study.name, self.table.version)
        except Exception:
            return pd.DataFrame({"number": pd.Series(dtype=int)})

    def merged(self) -> pd.DataFrame:
        """Optuna's trial table with the MLflow metrics joined on trial number (Optuna's columns win)."""
        extra = self.runs
        frame = self.table.frame
        if extra.empty:
            return frame
        extra = extra[[c for c in extra.columns if c == "number" or c not in frame.columns]]
        return frame.merge(extra, on="number", how="left")

    def numeric_metrics(self, frame: pd.DataFrame) -> list[str]:
        """Objectives first, then the speedups against the unmodified model (they survive load), then every other numeric metric."""
        objectives = [m for m, _ in self.table.objectives]
        skip = {"number", "run_status", "feasible", *objectives}  # a verdict, not a metric
        others = [c for c in frame.columns if c not in skip and not c.startswith(("param:", "paretolab.", "datetime"))
                  and pd.api.types.is_numeric_dtype(frame[c]) and frame[c].notna().any()]
        return objectives + sorted(others, key=lambda m: (not m.endswith("_speedup"), m))

    def direction(self, metric: str) -> str:
        own = dict(self.table.objectives)
        return own.get(metric) or metric_directions().get(metric, "minimize")


def describe_methods() -> list[dict[str, Any]]:
    from paretolab.plugin_api.manager import registries

    regs = registries()
    rows = []
    for m in regs.methods:
        d = m.describe()
        rows.append({
            "method": d["name"], "kind": d["kind"], "cost": d["cost_is"], "plugin": regs.methods.owner(m.name),
            "paper": d["paper"], "search space": "; ".join(f"{k}: {v}" for k, v in d["search_space"].items()),
        })
    return rows


def describe_metrics() -> list[dict[str, Any]]:
    from paretolab.plugin_api.manager import registries

    return [{"metric": m.name, "unit": m.unit, "direction": m.direction, "estimated": m.estimated, "description": m.description}
            for m in registries().metrics]
