"""A trial's failure reason in words: any exception a plugin raises in a worker, BaseException included, as one line."""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def readable_reason(exc: BaseException) -> str:
    """``Type: first line`` of any exception (BaseException included), without colour codes; Ray's task errors by their cause."""
    cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError carries the worker's own exception
    if isinstance(cause, BaseException) and cause is not exc:
        exc = cause
    text = ANSI.sub("", str(exc)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    name = type(exc).__name__
    if isinstance(exc, KeyboardInterrupt):
        return f"{name}: interrupted inside the trial" + (f" ({lines[0]})" if lines else "")
    if isinstance(exc, SystemExit):
        return f"{name}: a plugin called exit({exc.code!r}) inside the trial"
    return f"{name}: {text}" if text else name  # the whole message, as before: the failure listings take its first line
