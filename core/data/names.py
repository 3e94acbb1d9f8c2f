"""Names and untrusted text: the one check of a study's name, and the one escape of text before it reaches a person.

A study's name becomes a path component (MLflow's artifact folder, a bundle's file name), a table cell, a document
heading and a dashboard label, and it may come from a file someone else wrote (a bundle, ``--as``). So every name, from
a pipeline, a flag or a bundle, passes :func:`check_name`: Unicode-normalised (NFKC, so two spellings of one name are
one name), then ASCII letters, digits and ``_ . -``, starting with a letter or digit, at most 100 characters. Anything
else that is printed (a reason, a tag, a path from a file) goes through :func:`printable`, which escapes the control
characters a terminal would obey (newlines that forge a table row, ANSI colour, the bell, bidi overrides).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from paretolab.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
NAME_RULE = "must start with a letter or digit and use only letters, digits, _ . - (at most 100 characters)"
# C0 and C1 controls, DEL, and the bidi/format characters that reorder or hide what a terminal shows.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")
_PIPE = re.compile(r"\|")
_MARKDOWN = re.compile(r"[\\`*_~\[\]()<>|#!$]")


def normal_name(name: str) -> str:
    """``name`` as names are compared: NFKC-normalised (fullwidth ``ｄｅｍｏ`` is ``demo``)."""
    return unicodedata.normalize("NFKC", name)


def is_name(name: object) -> bool:
    """Whether ``name`` is a valid name as written (already normal)."""
    return isinstance(name, str) and NAME_RE.fullmatch(name) is not None


def check_name(name: object, where: str = "name") -> str:
    """``name`` normalised, or a ConfigError naming ``where``, the value (escaped) and the rule."""
    if not isinstance(name, str):
        raise ConfigError(f"{where}: expected a name (text), got {type(name).__name__}")
    normal = normal_name(name)
    if NAME_RE.fullmatch(normal) is None:
        raise ConfigError(f"{where}: {printable(repr(name))} {NAME_RULE}, e.g. 'my-study'")
    return normal


def printable(text: object, *, lines: bool = False) -> str:
    """``text`` with every control, format and bidi character escaped (``\\n``, ``\\x1b``, ``\\u202e``): safe to print.

    ``lines=True`` keeps newlines and tabs (a message of several lines we wrote ourselves, e.g. a YAML error's caret),
    escaping everything else a terminal would obey."""
    return (_UNSAFE_IN_LINES if lines else _UNSAFE).sub(_escape, str(text))


def markdown_text(text: object, *, inline: bool = False) -> str:
    """``text`` for one line or table cell of a Markdown document: :func:`printable`, with ``|`` (which would start a
    new column) escaped. ``inline=True`` (a name in a dashboard label) also escapes what Markdown reads as emphasis, a
    link, code or HTML, so a name shows as the characters it is."""
    return (_MARKDOWN if inline else _PIPE).sub(lambda m: "\\" + m.group(), printable(text))


def twin_of(name: str, names: Iterable[str]) -> str | None:
    """The one of ``names`` that is ``name`` under Unicode normalisation but spelled otherwise (``ｄｅｍｏ`` for
    ``demo``), else None: a study created or looked up by name must not become a second study of the same name."""
    normal = normal_name(name)
    return next((other for other in names if other != name and normal_name(other) == normal), None)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
