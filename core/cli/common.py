"""What the commands share: the stores their flags name, and a plain-text table (its cells escaped)."""

from __future__ import annotations

import argparse
from typing import Any


def stores_from_flags(args: argparse.Namespace, *, create: bool = False) -> Any:
    """The stores the flags name; only `run` (create=True) may create them."""
    from paretolab.stores import resolve_stores

    return resolve_stores(home=args.home, optuna_url=args.storage, tracking_uri=args.tracking_uri, create=create)


def source_from_flags(args: argparse.Namespace) -> Any:
    """Where a reading command reads: the bundles ``--bundle`` names, else the stores the flags name."""
    if getattr(args, "bundle", None):
        from paretolab.results.source import BundleSource

        return BundleSource(args.bundle)
    return stores_from_flags(args)


def print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max(len(c), *(len(cell_text(r.get(c), c)) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(cell_text(r.get(c), c).ljust(widths[c]) for c in columns))


def cell_text(value: Any, column: str = "") -> str:
    """A cell as every surface writes it (``paretolab.plugin_api.numbers``): a float in the unit of metric ``column``;
    text escaped (``paretolab.data.names.printable``): a study name holding a newline or ANSI escapes is one cell."""
    if isinstance(value, float):
        from paretolab.plugin_api.numbers import metric_value

        return metric_value(column, value)
    from paretolab.data.names import printable

    return "" if value is None else printable(value)
