"""`paretolab dashboard` as a user types it."""

from __future__ import annotations

from tests.conftest import run_cli


def test_dashboard_help_names_its_flags(tmp_path):
    out = run_cli("dashboard", "--help", cwd=tmp_path).stdout
    for flag in ("--host", "--port", "--address", "--home", "--storage", "--tracking-uri"):
        assert flag in out
    assert "127.0.0.1" in out


def test_dashboard_refuses_a_bad_port(tmp_path):
    bad = run_cli("dashboard", "--port", "70000", "--home", str(tmp_path), cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "--port: 70000 is out of range; give a whole number from 1 to 65535" in bad.stderr
