"""Ray's token authentication from the client side: find this machine's token, never print it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

TOKEN_HELP = (
    "the Ray cluster at {address} requires its authentication token, and {found}. "
    "Get the token on the head node with `ray get-auth-token`, then either `export RAY_AUTH_TOKEN=<token>` here "
    "or save it to ~/.ray/auth_token (or a file named by RAY_AUTH_TOKEN_PATH) with `chmod 600`, and run this again"
)


def token_source() -> str | None:
    """Where this machine's Ray token comes from (a variable's name or a path), or None."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")).expanduser()
    return str(path) if path.is_file() else None


def use_token_if_present() -> None:
    """Turn Ray's token mode on for this process when a token is here (Ray reads this before import)."""
    if "RAY_AUTH_MODE" not in os.environ and token_source():
        os.environ["RAY_AUTH_MODE"] = "token"


def quiet_local_token_notice() -> None:
    """Drop Ray's "token authentication is enabled" notice, which a private local Ray logs on every run.

    Ray's behaviour is unchanged (token mode on by default, a token made under ~/.ray if none);
    only that one logger is raised to errors.
    """
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)


def is_auth_error(exc: BaseException) -> bool:
    """Whether Ray refused us for want of (the right) token."""
    text = f"{exc} {exc.__cause__ or ''}".lower()
    return type(exc).__name__ == "AuthenticationError" or "authentication token" in text or "unauthenticated" in text


def token_help(address: str) -> str:
    """What to do, in one line, when the cluster wants a token we do not have (or have wrong)."""
    source = token_source()
    found = f"the token from {source} was refused" if source else "no token was found on this machine"
    return TOKEN_HELP.format(address=address, found=found)
