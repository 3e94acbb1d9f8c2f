"""`paretolab sensitivity`: a method's quality cost on each layer group alone (see paretolab.api.sensitivity)."""

from __future__ import annotations

import argparse
from typing import Any

from paretolab.cli.numbers import number, whole
from paretolab.errors import ConfigError


def settings(pairs: list[str], flag: str) -> dict[str, Any]:
    """``["bits=3", "corpus=pydoc"]`` as ``{"bits": 3, "corpus": "pydoc"}`` (values read as YAML scalars)."""
    from paretolab.data.yaml_read import read_yaml

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {pair!r}: expected NAME=VALUE, like bits=3")
        out[key.strip()] = read_yaml(text, f"{flag} {key.strip()}") if text.strip() else ""
    return out


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from paretolab.api.sensitivity import greedy_text, sensitivity, write

    model, task = args.model, settings(args.task or [], "--task")
    if args.pipeline:
        from paretolab.study.spec import load_spec

        spec = load_spec(args.pipeline)
        model = model or spec.model
        task = {"name": spec.task, **spec.task_options, **task}
    if not model:
        raise ConfigError("sensitivity: give --model NAME (e.g. smollm2-135m) or a pipeline whose model and task to use")
    out = args.out or f"sensitivity-{model.replace('/', '_')}-{args.method}"
    from paretolab.data.outputs import check_export_dir
    from paretolab.api.sensitivity import RECORD

    check_export_dir(out, force=args.force, record=RECORD)  # before the minutes of work
    result = sensitivity(model, args.method, settings(args.params or [], "--params"), by=args.group or args.by, task=task, seed=args.seed)
    print(result.markdown())
    budget = args.budget_mb * 1e6 if args.budget_mb is not None else None
    if budget is not None:
        print(greedy_text(result.greedy(budget), result))
    for path in write(result, out, force=args.force, budget_bytes=budget):
        print(f"wrote {path}")
    return 0


LAYERWISE = "{layerwise methods}"  # in a help text: the registered layerwise methods, read when the help is printed


def layerwise_methods() -> str:
    """The registered methods that declare ``layerwise = True`` (built-in and installed plugins), comma-separated."""
    try:
        from paretolab.plugin_api.manager import registries

        return ", ".join(sorted(m.name for m in registries().methods if getattr(m, "layerwise", False))) or "none registered"
    except Exception:  # noqa: BLE001 - a broken plugin is reported by the command itself, not by its help
        return "`paretolab plugins` marks them per-layer"


class _Help(argparse.RawDescriptionHelpFormatter):
    """Fills in the layerwise methods when the help is printed: building the parser (every `paretolab` call) reads no registry."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        return text.replace(LAYERWISE, layerwise_methods()) if text and LAYERWISE in text else text


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sensitivity", help="a method's quality cost on each layer (or group) alone: table, plot, greedy budget", description=(
        "Apply METHOD with --params to one layer group at a time (every other module unmodified), score the model on "
        "the task's windows and report, per group, the metric's change against the unmodified model on the same windows "
        "(paired, with its 95 % bootstrap interval) and the bytes the group saves. Ranked least sensitive per MB saved "
        "first; written to DIR as sensitivity.json, sensitivity.md and sensitivity.png/.svg. With --budget-mb, the "
        "groups in that order until the model fits, as a `layers:` block for a per-layer pipeline stage."
    ), formatter_class=_Help, epilog=(
        "examples:\n"
        "  paretolab sensitivity --model smollm2-135m --method rtn --params bits=3 group_size=128\n"
        "  paretolab sensitivity --model tiny-llama --method rtn --params bits=2 --by layer-kind --task max_tokens=1024\n"
        "  paretolab sensitivity pipelines/layers_mixed.yaml --method rtn --params bits=3 --budget-mb 70   model and task of the pipeline\n"
        "  paretolab sensitivity --model smollm2-135m --method magnitude --params sparsity=0.7 --group '0-9 mlp' --group '20-29 mlp'"))
    p.add_argument("pipeline", nargs="?", help="a pipeline YAML whose model and task to use (flags override)")
    p.add_argument("--model", help="a registered model, a local directory or a hub id (default: the pipeline's)")
    p.add_argument("--method", required=True, help=f"a layerwise method: {LAYERWISE} (methods that declare layerwise = True)")
    p.add_argument("--params", nargs="*", metavar="NAME=VALUE", help="the method's setting on each group, e.g. bits=3 group_size=128")
    p.add_argument("--by", choices=("layer", "layer-kind", "kind"), default="layer",
                   help="the groups: each decoder layer (default), each layer's attention and MLP apart, or attention vs MLP")
    p.add_argument("--group", action="append", metavar="SELECTOR",
                   help="a group of your own instead of --by (repeatable): 'attention', '0-9 mlp', 'each 0-29 down_proj', ...")
    p.add_argument("--task", nargs="*", metavar="NAME=VALUE", help="perplexity options over the defaults "
                   "(corpus=pydoc max_tokens=4096 context=512 stride=512), e.g. corpus=wikitext2 max_tokens=8192")
    p.add_argument("--budget-mb", type=number(0, 10**9, above=True), metavar="MB", help="also give the greedy assignment under this size_bytes budget (MB = 1e6 bytes)")
    p.add_argument("--seed", type=whole(0, 2**31 - 1), default=0, help="the seed of every stage (as a trial's)")
    p.add_argument("--out", metavar="DIR", help="where to write (default sensitivity-MODEL-METHOD)")
    p.add_argument("--force", action="store_true", help="replace DIR if an earlier sensitivity run wrote it")
    p.set_defaults(func=cmd_sensitivity)
