"""Exports are safe (issue 69): ``--force`` replaces only a directory whose ``paretolab.json`` lists exactly the files it
holds; every exported file follows the user's umask (model.safetensors was 0600); an export killed midway leaves no half
directory at ``--out`` and an earlier export byte for byte as it was."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from paretolab.data.outputs import manifest
from tests.conftest import run_cli
from tests.reliability.conftest import leftovers, refused

RECORD = "paretolab.json"


def snapshot(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder``: its mode and bytes."""
    return {p.relative_to(folder).as_posix(): (stat.S_IMODE(p.stat().st_mode), p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()}


def force_over(tmp_path: Path, target: Path) -> str:
    return refused("export", "demo", "1", "--out", str(target), "--force", "--home", str(tmp_path / "nohome"), cwd=tmp_path)


def user_folder(tmp_path: Path, record: str) -> Path:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    (folder / RECORD).write_text(record)
    return folder


@pytest.mark.parametrize("record, why", [
    ("{}", "lists no files"),
    ('{"study": "x", "files": {}}', "lists no files"),
    ("not json", "is not an export's record"),
    ('{"files": {"model.safetensors": {"bytes": 1, "sha256": "0"}}}', "'thesis.tex', which its paretolab.json does not list"),
])
def test_force_refuses_a_user_folder_that_merely_holds_a_paretolab_json(tmp_path, record, why):
    folder = user_folder(tmp_path, record)
    before = snapshot(folder)
    line = force_over(tmp_path, folder)
    assert why in line and "not an earlier export" in line, line
    assert snapshot(folder) == before and not leftovers(tmp_path)


def test_force_refuses_a_listed_file_that_changed_or_went_missing(tmp_path):
    folder = tmp_path / "e"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")
    (folder / RECORD).write_text(json.dumps({"files": manifest(folder, skip=RECORD)}))
    (folder / "model.safetensors").write_bytes(b"WEIGHTS")  # same size, other bytes: the sha256 tells
    assert "'model.safetensors' differs from what its paretolab.json lists" in force_over(tmp_path, folder)
    (folder / "config.json").unlink()
    assert "'config.json', listed in its paretolab.json, is missing" in force_over(tmp_path, folder)
    assert (folder / "model.safetensors").read_bytes() == b"WEIGHTS"


def test_the_export_writer_gives_every_file_the_umask_and_lists_it(tiny, tmp_path):
    """The writer alone, on the tiny model (fast): safetensors writes model.safetensors 0600 by itself."""
    import importlib

    writer = importlib.import_module("paretolab.api.export")
    staging = tmp_path / "out.partial"
    before = os.umask(0o022)
    try:
        writer._write(tiny, staging, writer.Exported(out=tmp_path / "out", study="s", trial=0),
                      {"pipeline": {}, "params": {}, "metrics": {}, "code_version": ""}, {}, [])
    finally:
        os.umask(before)
    modes = {p.relative_to(staging).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in staging.rglob("*")}
    assert modes["model.safetensors"] == 0o644 and set(modes.values()) == {0o644}, modes
    assert set(json.loads((staging / RECORD).read_text())["files"]) == set(modes) - {RECORD}


# --- real exports of a one-trial study ---

@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_head):
    folder = tmp_path_factory.mktemp("exports")
    spec = {"name": "exp", "model": "tiny-llama",
            "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256, "context": 128, "stride": 128},
            "stages": [{"method": "rtn", "params": {"bits": 4, "group_size": 32}}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
            "search": {"sampler": "grid", "trials": 1, "seed": 0}, "resources": {"cpus": 1}, "measures": ["size", "params"]}
    (folder / "exp.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "exp.yaml", "--address", ray_head, "--no-progress", cwd=folder)
    return folder


def export(folder: Path, out: Path, *extra: str, umask: int = 0o022, before: str = "") -> subprocess.CompletedProcess:
    """``paretolab export exp 0 --out OUT`` in a fresh process under ``umask``; ``before``: Python run first (a planted kill)."""
    code = (f"import os, sys; os.umask({umask:#o}); {before}\n"
            "from paretolab.cli import main; sys.exit(main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, "export", "exp", "0", "--out", str(out), *extra], cwd=folder,
                          capture_output=True, text=True, timeout=600)


# killed with the weights, config and tokenizer written and paretolab.json not yet: a half export, had it been written in place
KILL_MIDWAY = ("import signal, importlib; e = importlib.import_module('paretolab.api.export'); "
               "e.follow_umask = lambda folder: os.kill(os.getpid(), signal.SIGKILL)")


@pytest.mark.parametrize("umask, files, folders", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_every_exported_file_follows_the_umask(study, umask, files, folders):
    out = study / f"out{umask:o}"
    proc = export(study, out, umask=umask)
    assert proc.returncode == 0, proc.stderr[-3000:]
    modes = {p.relative_to(out).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*")}
    assert "model.safetensors" in modes and RECORD in modes
    assert {k: v for k, v in modes.items() if v != (folders if (out / k).is_dir() else files)} == {}
    assert stat.S_IMODE(out.stat().st_mode) == folders
    listed = json.loads((out / RECORD).read_text())["files"]
    assert set(listed) == {k for k in modes if not (out / k).is_dir()} - {RECORD}


def earlier_export(study: Path) -> Path:
    """The export of the umask test (made here when that test did not run first)."""
    out = study / "out22"
    if not out.exists():
        assert export(study, out).returncode == 0
    return out


def test_an_export_killed_midway_leaves_no_half_directory_and_an_earlier_export_intact(study):
    fresh = study / "killed"
    proc = export(study, fresh, before=KILL_MIDWAY)
    assert proc.returncode == -9 and not fresh.exists()  # nothing at --out: the files went to DIR.partial
    out = earlier_export(study)
    earlier = snapshot(out)
    proc = export(study, out, "--force", before=KILL_MIDWAY)
    assert proc.returncode == -9 and snapshot(out) == earlier
    proc = export(study, out, "--force")  # and the next export clears what the killed one left beside it
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (study / "out22.partial").exists() and not (study / "out22.replaced").exists()
    now = snapshot(out)
    assert set(now) == set(earlier) and now[RECORD] != earlier[RECORD]  # replaced: exported_at moved on


def test_force_refuses_an_earlier_export_a_user_added_a_file_to(study, tmp_path):
    mine = tmp_path / "copy"
    shutil.copytree(earlier_export(study), mine)
    (mine / "notes.txt").write_text("my notes on this model")
    before = snapshot(mine)
    proc = export(study, mine, "--force")
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(err) == 1 and "'notes.txt', which its paretolab.json does not list" in err[0], proc.stderr
    assert snapshot(mine) == before
