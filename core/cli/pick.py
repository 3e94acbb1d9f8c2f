"""`paretolab pick STUDY --keep RULE --where BUDGET`: the cheapest configuration whose quality holds (paretolab.api.pick)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any


def cmd_pick(args: argparse.Namespace) -> int:
    from paretolab.api.pick import export_choice, write_record
    from paretolab.cli.common import source_from_flags
    from paretolab.errors import ConfigError
    from paretolab.results.decision_record import decide_study, decision_lines, decision_record

    if args.export and args.bundle:
        raise ConfigError("pick --export re-applies the chosen trial, which needs the stores: import the bundle first "
                          "(paretolab bundle import FILE), then run pick --export without --bundle")
    decision = decide_study(args.study, source_from_flags(args), keep=args.keep, budgets=args.where or [], cost=args.cost)
    if decision.choice is not None and decision.split is not None and not args.no_confirm and not args.bundle:
        from paretolab.api.confirm import confirm
        from paretolab.cli.common import stores_from_flags

        confirm(decision, stores=stores_from_flags(args), progress=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(decision_record(decision), indent=1, default=str))
    else:
        print("\n".join(decision_lines(decision)))
    if args.out:
        for path in write_record(decision, args.out):
            print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    if args.export:
        from paretolab.cli.common import stores_from_flags

        done = export_choice(decision, args.export, stores=stores_from_flags(args), force=args.force,
                             command=_command(args), progress=lambda m: print(m, file=sys.stderr))
        for line in done.lines():
            print(line, file=sys.stderr if args.json else sys.stdout)
        print(f"  README.md: the model card (the decision, its evidence, how to serve it)", file=sys.stderr if args.json else sys.stdout)
    if decision.choice is None:
        return 3
    return 4 if decision.confirmation is not None and not decision.confirmation.survived(decision.choice) else 0


def _command(args: argparse.Namespace) -> str:
    words = ["paretolab", "pick", args.study, "--keep", args.keep, *[w for b in args.where or [] for w in ("--where", b)]]
    if args.cost:
        words += ["--cost", args.cost]
    return shlex.join(words)


def add_parser(sub: Any, bundle_flag: Callable[[Any], None], store_flags: Callable[[Any], None]) -> None:
    p = sub.add_parser("pick", help="the cheapest configuration whose quality holds: a decision with its evidence", description=(
        "Judge every configuration of a study (a method with its settings; its seeds and calibration draws are replicates "
        "of it, never configurations of their own) by a quality rule in the claims' words, paired with the rule's baseline "
        "on each replicate as `paretolab report` judges a claim, and choose the one that meets every budget (on its mean) "
        "with the best cost. Prints the choice with its interval, the rivals within noise of its cost, the cheaper ones "
        "the data cannot confirm, or, when nothing qualifies, the nearest miss and why (exit status 3). A study whose "
        "pipeline keeps a confirm part (`confirm: {share: 0.5, seed: 0}`) has its choice, rivals and baseline re-applied "
        "and scored there, on examples the search never saw, and the rule judged again (exit status 4 when the choice "
        "does not survive)."),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "rules (--keep): METRIC EXPECT [MARGIN] vs LABEL, EXPECT one of lower, higher, no_worse, equivalent:\n"
        "  'ppl no_worse 2 % vs none'        at most 2 % worse than the unmodified model (judged as a ratio)\n"
        "  'acc equivalent 1 pt vs none'     within one percentage point of it\n"
        "  'ppl lower vs rtn[bits=4]'        better than an arm (a label as `report` writes it)\n"
        "budgets (--where, repeatable): METRIC <= VALUE [UNIT], also <, >=, >:\n"
        "  'size_bytes <= 80 MB'   'size_bytes <= 0.5 x none'   'decode_tok_s >= 40'\n\n"
        "examples:\n  paretolab pick demo --keep 'ppl no_worse 2 % vs none' --where 'size_bytes <= 0.5 x none'\n"
        "  paretolab pick demo --keep 'ppl no_worse 2 % vs none' --where 'size_bytes <= 80 MB' --out decision/ --export chosen/\n"
        "  paretolab pick wanda_vs_magnitude --bundle results/bundles/wanda_vs_magnitude.jsonl.gz \\\n"
        "      --keep 'ppl no_worse 25 % vs none' --where 'size_bytes <= 0.8 x none'"))
    p.add_argument("study", help="study name")
    p.add_argument("--keep", required=True, metavar="RULE", help="the quality rule every candidate is judged by (see below)")
    p.add_argument("--where", action="append", metavar="BUDGET", help="a budget the choice's mean must meet (repeatable)")
    p.add_argument("--cost", metavar="METRIC", help="what to minimize (maximize for a metric whose better direction is "
                   "higher); default: the first budget's metric")
    p.add_argument("--json", action="store_true", help="print the decision record as JSON instead of Markdown")
    p.add_argument("--out", metavar="DIR", help="also write the record: DIR/decision.md and DIR/decision.json")
    p.add_argument("--export", metavar="DIR", help="export the choice (its median replicate) as `paretolab export` does, "
                   "with a model card as DIR/README.md")
    p.add_argument("--force", action="store_true", help="with --export: replace an earlier export at DIR")
    p.add_argument("--no-confirm", action="store_true", help="skip re-measuring the choice on the pipeline's confirm part "
                   "(done by default when the study has a `confirm:` split and is read from its stores)")
    bundle_flag(p)
    store_flags(p)
    p.set_defaults(func=cmd_pick)
