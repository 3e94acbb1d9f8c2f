"""A local run keeps Ray's token authentication on without Ray warning about it every time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ray

SCRIPT = """
import os, ray
from paretolab.cluster.ray_init import init_ray
init_ray(None)
print("mode", os.environ.get("RAY_AUTH_MODE"))
ray.shutdown()
"""


def test_local_ray_starts_in_token_mode_without_the_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(tmp_path), RAY_USAGE_STATS_ENABLED="0")  # no token yet: Ray makes one under this HOME
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "mode token" in proc.stdout
    assert "Token authentication is" not in proc.stderr + proc.stdout
