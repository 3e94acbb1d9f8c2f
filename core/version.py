"""paretolab's version, and the code version every trial and checkpoint records."""

from __future__ import annotations

import subprocess
from pathlib import Path

__version__ = "0.1.0"


def code_version() -> str:
    """paretolab's version, plus the git commit when running from a checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{__version__}+{commit}" if commit else __version__
