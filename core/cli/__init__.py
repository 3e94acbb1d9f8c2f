"""The `paretolab` command line: ``main`` parses the arguments and runs one command.

- :mod:`paretolab.cli.parser` — every verb and flag; :mod:`~paretolab.cli.run` — run, submit, jobs, draft;
  :mod:`~paretolab.cli.read` — frontier, report, dashboard; :mod:`~paretolab.cli.manage` — check, studies (list, prune, delete);
  :mod:`~paretolab.cli.catalog` — plugins, models.
"""

from __future__ import annotations

import sys

from paretolab.cli.parser import build_parser
from paretolab.errors import ParetolabError

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run the command ``argv`` names (default: the process's arguments); a ParetolabError is one line and exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ParetolabError as exc:
        print(f"paretolab: error: {exc}", file=sys.stderr)
        return 2
