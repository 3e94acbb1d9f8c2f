"""`paretolab interaction STUDY --a A --b B`: whether two stacked methods' effects add up (see paretolab.results.interaction)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def cmd_interaction(args: argparse.Namespace) -> int:
    from paretolab.results.interaction import interaction, markdown
    from paretolab.cli.common import source_from_flags

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    relative = tuple(m.strip() for m in args.relative.split(",") if m.strip())
    found = interaction(args.study, source_from_flags(args), args.a, args.b, metrics, relative)
    print(markdown(args.study, args.a, args.b, found))
    return 0


def add_parser(sub: Any, bundle_flag: Callable[[Any], None], store_flags: Callable[[Any], None]) -> None:
    p = sub.add_parser("interaction", help="do two stacked methods' effects add up? the log-scale interaction term and its interval",
                       description=(
        "From a study with a choice stage per method (each offering {method: none}) and all four arms run, compare "
        "A+B with A alone, B alone and the base on the log scale: interaction = log(A+B) - log(A) - log(B) + log(base), "
        "0 when the effects add up (multiply as ratios). For ppl the interval is a paired bootstrap over the windows "
        "all four trials were scored on; a cost measured once per trial has none."),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n  paretolab interaction prune_then_quantize --a wanda --b rtn\n"
        "  paretolab interaction layers_spec_x_quant --a rtn --b speculative --metrics speedup_vs_greedy,mean_accepted_len \\\n"
        "      --relative speedup_vs_greedy,mean_accepted_len     B's effect measured inside each trial: B and A+B suffice"))
    p.add_argument("study", help="study name")
    p.add_argument("--a", required=True, metavar="METHOD", help="the first method's label (as `paretolab report` writes it)")
    p.add_argument("--b", required=True, metavar="METHOD", help="the second method's label")
    p.add_argument("--metrics", default="ppl,size_bytes", help="comma-separated metrics (default ppl,size_bytes)")
    p.add_argument("--relative", default="", metavar="METRICS", help="comma-separated metrics that are B's effect measured inside each "
                   "trial against its own target (speculative's speedup_vs_greedy, mean_accepted_len): base and A read 1, so only the "
                   "trials of B and A+B are needed")
    bundle_flag(p)
    store_flags(p)
    p.set_defaults(func=cmd_interaction)
