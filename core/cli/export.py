"""`paretolab export STUDY TRIAL --out DIR`: a trial's model as a directory transformers loads (see paretolab.api.export)."""

from __future__ import annotations

import argparse

from paretolab.cli.common import stores_from_flags


def cmd_export(args: argparse.Namespace) -> int:
    from paretolab.api.export import export

    done = export(args.study, args.trial, args.out, stores=stores_from_flags(args), force=args.force, save_as=args.save_as)
    for line in done.lines():
        print(line)
    return 0 if done.within is not False else 1
