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
    """Run the command ``argv`` names (default: the process's arguments); a ParetolabError is one line and exit code 2
    (its text escaped: a name from a store or a bundle cannot colour the terminal). A reader that stops reading
    (``paretolab studies | head -1``) ends the command quietly, with the shell's code for it (141), not a traceback."""
    from paretolab.data.names import printable
    from paretolab.stores.locations import install_redaction, redact_text

    install_redaction()  # no log line, warning or traceback of this command shows a password given in a URL
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:  # --help, a usage error: their text flushed here too
            sys.stdout.flush()
            raise
        try:
            code = int(args.func(args) or 0)
        except ParetolabError as exc:
            print(f"paretolab: error: {printable(redact_text(exc), lines=True)}", file=sys.stderr)
            code = 2
        sys.stdout.flush()  # here, where a reader gone is caught, not at the interpreter's exit
        return code
    except BrokenPipeError:
        _stdout_gone()
        return 141


def _stdout_gone() -> None:
    """The reader of stdout has gone: point stdout at /dev/null, so the interpreter's own flush at exit has nowhere to
    fail (https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no file (captured in a test): nothing left to flush there
        pass
