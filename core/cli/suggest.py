"""The command line's parser class: a misspelt command or choice is answered with the closest names."""

from __future__ import annotations

import argparse
import difflib
from typing import Any


class SuggestingParser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" error says which choice was probably meant.

    ``paretolab fronteir demo`` -> ``argument COMMAND: invalid choice: 'fronteir'; did you mean 'frontier'? (choose
    from ...)``. Sub-commands' parsers are of this class too (``add_subparsers`` takes the parent's class).
    """

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        choices = action.choices
        if choices is None or value in choices:
            return
        names = [str(c) for c in choices]
        close = difflib.get_close_matches(str(value), names, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from {', '.join(names)})")
