"""Late or misleading answers of the command line (issue 69): each is one true line, at once, and no traceback."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import BIN, cli_here
from tests.reliability.conftest import TINY, refused


@pytest.mark.parametrize("command", ["plugins", "plugins --json"])
def test_a_reader_that_stops_reading_ends_the_command_quietly(command, tmp_path):
    """`paretolab plugins | head -1`: its first line, then silence (no BrokenPipeError traceback), and code 141 as a
    program killed by SIGPIPE would give."""
    proc = subprocess.run(["bash", "-c", f"{BIN / 'paretolab'} {command} | head -1; echo \"status=${{PIPESTATUS[0]}}\" >&2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert len(proc.stdout.splitlines()) == 1, proc.stdout
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] in ("status=141", "status=0"), proc.stderr


@pytest.mark.parametrize("argv", [["studies"], ["frontier", "demo"], ["report", "demo"]], ids=lambda a: a[0])
def test_a_home_that_is_a_file_is_said_not_taken_for_an_empty_home(argv, tmp_path):
    home = tmp_path / "home"
    home.write_text("not a folder\n")
    line = refused(*argv, "--home", str(home), cwd=tmp_path)
    assert f"--home {home}: is a file, not a folder" in line


def _checkout(root: Path, studies: str) -> Path:
    (root / "results" / "bundles").mkdir(parents=True)
    (root / "pipelines").mkdir()
    (root / "pipelines" / "tiny.yaml").write_text(TINY)
    (root / "results" / "documents.yaml").write_text(f"documents:\n  - {{path: pipelines/T.md, family: t, title: T, studies: [{studies}]}}\n")
    return root


def test_a_misspelled_study_in_the_documents_manifest_is_named_unknown_with_the_closest_pipeline(tmp_path):
    root = _checkout(tmp_path, "tiyn")
    out = cli_here("results", "status", "--root", str(root), cwd=root).stdout
    assert "unknown  tiyn — unknown study tiyn (no pipeline named so; did you mean tiny?)" in out, out
    assert "missing" not in out
    line = refused("results", "run", "--dry-run", "--root", str(root), cwd=root)  # not run to fail an hour later
    assert "unknown study tiyn (no pipeline named so; did you mean tiny?)" in line


def test_a_study_name_in_the_documents_manifest_is_checked_as_a_pipeline_name(tmp_path):
    root = _checkout(tmp_path, "'../x'")
    line = refused("results", "status", "--root", str(root), cwd=root)
    assert "studies[0]" in line and "'../x'" in line and "must start with a letter or digit" in line


def test_check_of_a_device_says_what_it_is(tmp_path):
    line = refused("check", "/dev/zero", cwd=tmp_path)
    assert line == "paretolab: error: pipeline file '/dev/zero' is a character device, not a regular file; give the path of a YAML file"


def test_check_of_a_fifo_says_what_it_is_and_does_not_wait_for_a_writer(tmp_path):
    fifo = tmp_path / "pipeline.yaml"
    os.mkfifo(fifo)
    result: list = []
    worker = threading.Thread(target=lambda: result.append(cli_here("check", str(fifo), cwd=tmp_path, check=False)), daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():  # it opened the FIFO: write to it so the thread, and the test, end
        with open(fifo, "w") as f:
            f.write(TINY)
        worker.join(60)
        pytest.fail("`check` of a FIFO waited for a writer")
    proc = result[0]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"'{fifo}' is a FIFO (named pipe), not a regular file" in proc.stderr
