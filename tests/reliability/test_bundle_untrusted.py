"""Bundles are untrusted input (issue 69): a hostile bundle is refused in one line by every reader, nothing written.

Each malicious bundle is built from a valid one, tampered with, and its end record's checksum recomputed, so that what
refuses it is the check under test, never the checksum. Every reader is tried: `bundle import`, `report --bundle`,
`frontier --bundle`, `results status` and ``paretolab.load_study(bundle=)``; and the filesystem around the home is
listed before and after.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from paretolab.errors import ConfigError
from paretolab.results.bundle import RunRecord, StudyRecord, read_bundle, write_bundle
from tests.conftest import BIN, cli_here
from tests.reliability.conftest import TINY, one_line, refused

DIST = '{"name": "IntDistribution", "attributes": {"log": false, "step": 1, "low": 2, "high": 8}}'


def _trial(number: int, artifacts: dict[str, bytes] | None = None) -> dict:
    run = RunRecord(f"run{number}", "FINISHED", {"paretolab.role": "trial", "paretolab.trial_number": str(number)}, {"s0.method": "rtn"},
                    {"ppl": 10.0 + number, "size_bytes": 100.0 - number}, {},
                    {"per_example.json": b"{}"} if artifacts is None else artifacts)
    return {"number": number, "state": "COMPLETE", "values": [10.0 + number, 100.0 - number], "params": {"s0.bits": 4},
            "distributions": {"s0.bits": DIST}, "user_attrs": {}, "system_attrs": {}, "intermediate_values": {},
            "datetime_start": "2026-01-01T00:00:00", "datetime_complete": "2026-01-01T00:00:01", "run": run}


def _bundle(path: Path, name: str = "demo", trials: int = 3) -> Path:
    attrs = {"objectives": [["ppl", "minimize"], ["size_bytes", "minimize"]]}
    write_bundle([StudyRecord(name, ["MINIMIZE", "MINIMIZE"], attrs, [_trial(i) for i in range(trials)], None, {})], path)
    return path


def _tamper(src: Path, dst: Path, edit) -> Path:
    """``src``'s records edited by ``edit(records)`` (a list of dicts, end record excluded) and the end record recomputed."""
    lines = gzip.decompress(src.read_bytes()).decode().rstrip("\n").split("\n")
    records = [json.loads(line) for line in lines[:-1]]
    edit(records)
    return _write_lines(dst, [line if isinstance(line, str) else json.dumps(line, allow_nan=True) for line in records])


def _write_lines(dst: Path, lines: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    lines = [*lines, json.dumps({"kind": "end", "records": len(lines), "sha256": digest})]
    dst.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return dst


def _artifact(name: str):
    def edit(records):
        records[2]["run"]["artifacts"] = {name: "eA=="}
    return edit


def _set(index: int, key: str, value):
    def edit(records):
        records[index][key] = value
    return edit


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def valid(tmp_path) -> Path:
    return _bundle(tmp_path / "valid.jsonl.gz")


def _cases(tmp_path: Path, valid: Path) -> dict[str, tuple[Path, str]]:
    victim = tmp_path / "victim" / "file"
    out = {
        "traversal": (_artifact("../x"), "not a relative path"),
        "deep traversal": (_artifact("../" * 12 + str(victim).lstrip("/")), "not a relative path"),
        "absolute": (_artifact(str(victim)), "not a relative path"),
        "inner dot-dot": (_artifact("a/../../x"), "not a relative path"),
        "backslash": (_artifact("..\\x"), "backslash"),
        "empty part": (_artifact("a//b"), "not a relative path"),
        "nul": (_artifact("a\x00b"), "control character"),
        "file over folder": (lambda r: r[2]["run"].__setitem__("artifacts", {"a": "eA==", "a/b": "eA=="}), "inside another"),
        "bad state": (_set(2, "state", "EXPLODED"), "is not a trial state"),
        "unknown study": (_set(2, "study", "other"), "no study declared"),
        "no number": (lambda r: r[2].pop("number"), "not a trial number"),
        "bool number": (_set(2, "number", True), "not a trial number"),
        "nan value": (_set(2, "values", [float("nan"), 1.0]), "not a finite number"),
        "inf metric": (lambda r: r[2]["run"]["metrics"].__setitem__("ppl", float("inf")), "not a finite number"),
        "nan intermediate": (_set(2, "intermediate_values", {"0": float("nan")}), "not a finite number"),
        "wrong value count": (_set(2, "values", [1.0]), "one per objective"),
        "gap": (_set(3, "number", 7), "no trial number(s) 1"),
        "repeat": (_set(3, "number", 0), "number(s) 0 more than once"),
        "newline name": (lambda r: [r[0].__setitem__("studies", ["de\nmo"]), r[1].__setitem__("name", "de\nmo")], "'de\\\\nmo'"),
        "ansi name": (lambda r: [r[0].__setitem__("studies", ["\x1b[31mred\x07"]), r[1].__setitem__("name", "\x1b[31mred\x07")],
                      "\\\\x1b"),
        "traversal name": (lambda r: [r[0].__setitem__("studies", ["../../x"]), r[1].__setitem__("name", "../../x")], "must start"),
        "named twice": (lambda r: r[0].__setitem__("studies", ["demo", "ｄｅｍｏ"]), "named twice"),
        "bad base64": (lambda r: r[2]["run"].__setitem__("artifacts", {"a": "not base64!"}), "not base64"),
        "bad date": (_set(2, "datetime_start", "yesterday"), "not an ISO date"),
        "bad distribution": (lambda r: r[2]["distributions"].__setitem__("s0.bits", "{}"), "not an Optuna distribution"),
        "param outside": (lambda r: r[2]["params"].__setitem__("s0.bits", 99), "isn't contained"),
        "pipeline text": (lambda r: r[1]["user_attrs"].__setitem__("pipeline", "x"), "user_attrs.pipeline: expected a mapping"),
        "objectives": (lambda r: r[1]["user_attrs"].__setitem__("objectives", [["ppl", "up"]]), "user_attrs.objectives"),
        "load text": (_set(1, "provenance", {"load_1m": {"median": 1, "max": "high"}}), "provenance.load_1m.max"),
        "run id": (lambda r: r[2]["run"].__setitem__("run_id", 7), "run.run_id: expected text"),
        "run status": (lambda r: r[2]["run"].__setitem__("status", "DONE"), "not an MLflow run status"),
        "tag key": (lambda r: r[2]["run"]["tags"].__setitem__("../x", "y"), "not an MLflow key"),
        "param value": (lambda r: r[2]["run"]["params"].__setitem__("p", 3), "expected text"),
    }
    cases = {name: (_tamper(valid, tmp_path / f"bad-{i}.jsonl.gz", edit), words) for i, (name, (edit, words)) in enumerate(out.items())}
    lines = gzip.decompress(valid.read_bytes()).decode().rstrip("\n").split("\n")[:-1]
    cases["deep line"] = (_write_lines(tmp_path / "deep.jsonl.gz", [lines[0], "[" * 100_000 + "]" * 100_000, *lines[1:]]), "nests deeper")
    cases["shallow but deep"] = (_write_lines(tmp_path / "deep2.jsonl.gz", [lines[0], '{"a":' * 100 + "1" + "}" * 100, *lines[1:]]),
                                 "nests deeper")
    return cases


def test_every_reader_refuses_each_hostile_bundle_in_one_line_writing_nothing(tmp_path, valid):
    import paretolab

    cases = _cases(tmp_path, valid)
    home = tmp_path / "home"
    before = _listing(tmp_path)
    for name, (path, words) in cases.items():
        with pytest.raises(ConfigError, match=None) as caught:
            paretolab.load_study("demo", bundle=path)
        assert words.replace("\\\\", "\\") in str(caught.value) and "\n" not in str(caught.value), (name, str(caught.value))
        assert "line " in str(caught.value), (name, str(caught.value))  # the record's line is named
        for args in (("bundle", "import", str(path), "--home", str(home)), ("report", "demo", "--bundle", str(path)),
                     ("frontier", "demo", "--bundle", str(path))):
            line = refused(*args, cwd=tmp_path)
            assert "\x1b" not in line and "\x07" not in line, (name, args, line)
        assert _listing(tmp_path) == before, name  # no store, no victim file, no temporary folder
    assert not (tmp_path / "victim").exists() and not home.exists()


def test_the_valid_bundle_imports_and_its_artifact_lands_in_its_run(tmp_path, valid):
    from paretolab.stores import resolve_stores

    proc = cli_here("bundle", "import", str(valid), "--home", str(tmp_path / "home"), cwd=tmp_path)
    assert "demo (3 trials)" in proc.stdout
    stores = resolve_stores(home=str(tmp_path / "home"), create=False)
    from paretolab.results.source import StoreSource

    study = StoreSource(stores).study("demo")
    assert len(study.trials) == 3 and study.user_attrs["paretolab.import"]["state"] == "complete"
    assert sorted(p.name for p in (tmp_path / "home").rglob("per_example.json")) == ["per_example.json"] * 3


def test_as_names_are_checked_as_a_pipelines_name(tmp_path, valid):
    home = tmp_path / "home"
    before = _listing(tmp_path)
    for name, words in (("", "must start"), ("../../x", "must start"), ("a\nb", "\\n"), ("\x1b[2J", "\\x1b")):
        line = refused("bundle", "import", str(valid), "--home", str(home), "--as", name, cwd=tmp_path)
        assert line.startswith("paretolab: error: --as:") and words in line and "\x1b" not in line, line
    assert _listing(tmp_path) == before


def test_names_equal_under_nfkc_clash(tmp_path, valid):
    home = tmp_path / "home"
    cli_here("bundle", "import", str(valid), "--home", str(home), cwd=tmp_path)
    wide = _bundle(tmp_path / "wide.jsonl.gz", name="ｄｅｍｏ")
    assert read_bundle(wide)[0].name == "demo"  # read as its normal form
    line = refused("bundle", "import", str(wide), "--home", str(home), cwd=tmp_path)
    assert "'demo' is already in" in line and "paretolab studies delete demo" in line and "paretolab rm" not in line, line
    line = refused("bundle", "import", str(valid), "--home", str(home), "--as", "ｄｅｍｏ", cwd=tmp_path)
    assert "'demo' is already in" in line
    import optuna

    from paretolab.stores import resolve_stores

    other = tmp_path / "other"
    optuna.create_study(study_name="ｄｅｍｏ", storage=resolve_stores(home=str(other)).optuna_url)  # a name from before the check
    line = refused("bundle", "import", str(valid), "--home", str(other), cwd=tmp_path)
    assert "'ｄｅｍｏ' is already in" in line, line


def test_export_writes_a_study_named_twice_once_and_warns_of_running_trials(tmp_path, valid):
    import optuna

    from paretolab.stores import resolve_stores

    home = tmp_path / "home"
    cli_here("bundle", "import", str(valid), "--home", str(home), cwd=tmp_path)
    proc = cli_here("bundle", "export", "demo", "demo", "--out", str(tmp_path / "out.jsonl.gz"), "--home", str(home), cwd=tmp_path)
    assert "named twice: written once" in proc.stderr and [r.name for r in read_bundle(tmp_path / "out.jsonl.gz")] == ["demo"]
    stores = resolve_stores(home=str(home), create=False)
    optuna.load_study(study_name="demo", storage=stores.optuna_url).ask()  # a trial under way
    proc = cli_here("bundle", "export", "demo", "--out", str(tmp_path / "run.jsonl.gz"), "--home", str(home), cwd=tmp_path)
    warning = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and "still running: 1 of its 4 trial(s)" in warning[0], proc.stderr


def test_export_stores_the_pipeline_path_relative_to_the_checkout(tmp_path, valid):
    import optuna

    from paretolab.stores import resolve_stores

    home = tmp_path / "home"
    cli_here("bundle", "import", str(valid), "--home", str(home), cwd=tmp_path)
    checkout = tmp_path / "checkout"
    (checkout / ".git").mkdir(parents=True)
    stores = resolve_stores(home=str(home), create=False)
    study = optuna.load_study(study_name="demo", storage=stores.optuna_url)
    study.set_user_attr("paretolab.session", {"state": "finished", "pipeline": str(checkout / "pipelines" / "demo.yaml")})
    cli_here("bundle", "export", "demo", "--out", str(tmp_path / "out.jsonl.gz"), "--home", str(home), cwd=tmp_path)
    text = gzip.decompress((tmp_path / "out.jsonl.gz").read_bytes()).decode()
    assert str(tmp_path) not in text
    assert read_bundle(tmp_path / "out.jsonl.gz")[0].user_attrs["paretolab.session"]["pipeline"] == "pipelines/demo.yaml"


def test_results_status_names_a_bad_committed_bundle_in_one_line(tmp_path, valid):
    root = tmp_path / "root"
    (root / "results" / "bundles").mkdir(parents=True)
    (root / "pipelines").mkdir()
    (root / "pipelines" / "demo.yaml").write_text(TINY.replace("name: tiny", "name: demo"))
    (root / "results" / "documents.yaml").write_text(
        "documents:\n  - {path: pipelines/demo.md, family: f, title: T, studies: [demo]}\n")
    _tamper(valid, root / "results" / "bundles" / "demo.jsonl.gz", _set(2, "state", "EXPLODED"))
    proc = cli_here("results", "status", "--root", str(root), cwd=tmp_path, check=False)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    row = [line for line in proc.stdout.splitlines() if "demo" in line and "stale" in line]
    assert len(row) == 1 and "demo.jsonl.gz: line 3: state: 'EXPLODED' is not a trial state" in row[0], proc.stdout
    line = refused("results", "render", "--root", str(root), cwd=tmp_path)
    assert "line 3: state" in line


def _bomb(path: Path, size: int, line: bytes) -> Path:
    """A gzip file that decompresses to ``size`` bytes of ``line`` repeated, after a valid header, built streaming."""
    comp = zlib.compressobj(6, zlib.DEFLATED, 31)  # gzip framing
    with open(path, "wb") as f:
        f.write(comp.compress(b'{"format":"paretolab-bundle","version":1,"studies":["demo"],"written_by":"x"}\n'))
        block = line * max(1, (1 << 20) // len(line))
        for _ in range(size // len(block)):
            f.write(comp.compress(block))
        f.write(comp.flush())
    return path


def test_a_gzip_bomb_is_refused_early_and_never_held_in_memory(tmp_path):
    wide = _bomb(tmp_path / "bomb.jsonl.gz", 300 << 20, b'{"kind":"trial","pad":"' + b"a" * 1000 + b'"}\n')
    assert wide.stat().st_size < 4 << 20
    script = ("import resource, sys\nfrom paretolab.errors import ConfigError\nfrom paretolab.results.bundle import read_bundle\n"
              "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
              "try:\n    read_bundle(sys.argv[1])\nexcept ConfigError as exc:\n    print(exc)\n"
              "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(wide)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PARETOLAB_BUNDLE_MAX_BYTES": str(200 << 20)})
    message, grown = proc.stdout.splitlines()
    assert "decompresses to more than 209.7 MB" in message and "gzip bomb" in message, proc.stdout + proc.stderr
    assert int(grown) < 50, f"reading the bomb grew memory by {grown} MB"
    zeros = _bomb(tmp_path / "zeros.jsonl.gz", 32 << 20, b"\0" * 4096)  # one line, no newline
    huge = refused("report", "demo", "--bundle", str(zeros), cwd=tmp_path, env={"PARETOLAB_BUNDLE_MAX_LINE": str(1 << 20)})
    assert "line 2 is longer than 1.049 MB" in huge
    line = refused("bundle", "import", str(wide), "--home", str(tmp_path / "home"), cwd=tmp_path,
                   env={"PARETOLAB_BUNDLE_MAX_BYTES": str(8 << 20)})
    assert "gzip bomb" in line and not (tmp_path / "home").exists()


def _studies(home: Path, cwd: Path) -> str:
    return cli_here("studies", "--home", str(home), cwd=cwd).stdout


def _import_stopped(big: Path, home: Path, cwd: Path, sig: int) -> subprocess.CompletedProcess:
    """`paretolab bundle import` sent ``sig`` once it has written a few MLflow runs."""
    import sqlite3
    import time

    proc = subprocess.Popen([str(BIN / "paretolab"), "bundle", "import", str(big), "--home", str(home)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with sqlite3.connect(home / "mlflow.db") as db:
                    if db.execute("select count(*) from runs").fetchone()[0] >= 5:
                        break
            except sqlite3.Error:
                pass
            time.sleep(0.05)
        assert proc.poll() is None, "the import finished before it could be stopped"
        proc.send_signal(sig)
    finally:
        out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_an_import_interrupted_by_a_signal_leaves_nothing(tmp_path, sig):
    big = _bundle(tmp_path / "big.jsonl.gz", trials=40)
    line = one_line(_import_stopped(big, tmp_path / "home", tmp_path, sig))
    assert "interrupted; nothing of it was left in the stores" in line, line
    assert "no studies yet" in _studies(tmp_path / "home", tmp_path)


def test_an_import_killed_midway_reads_as_partial_and_resume_completes_it(tmp_path):
    from paretolab.stores import resolve_stores

    big = _bundle(tmp_path / "big.jsonl.gz", trials=40)
    home = tmp_path / "home"
    _import_stopped(big, home, tmp_path, signal.SIGKILL)
    listing = _studies(home, tmp_path)
    assert "partial import" in listing and "--resume" in listing, listing
    assert "finished" not in listing, listing
    for args in (("report", "demo"), ("frontier", "demo"), ("bundle", "export", "demo", "--out", str(tmp_path / "o.jsonl.gz"))):
        line = refused(*args, "--home", str(home), cwd=tmp_path)
        assert "partial import" in line and "--resume" in line, line
    line = refused("bundle", "import", str(big), "--home", str(home), cwd=tmp_path)
    assert "partial import" in line and "--resume" in line and "paretolab rm" not in line, line
    proc = cli_here("bundle", "import", str(big), "--home", str(home), "--resume", cwd=tmp_path)
    assert "demo (40 trials)" in proc.stdout
    stores = resolve_stores(home=str(home), create=False)
    from paretolab.results.source import StoreSource

    assert len(StoreSource(stores).trial_runs("demo")) == 40  # the killed import's runs went with its study
    assert "partial" not in _studies(home, tmp_path)


@pytest.mark.parametrize("failure", ["interrupt", "efbig", "enospc"])
def test_an_import_stopped_by_ctrl_c_or_a_full_disk_leaves_nothing(tmp_path, valid, monkeypatch, failure):
    import errno

    from paretolab.results import bundle_stores

    home = tmp_path / "home"
    calls = []
    original = bundle_stores._log_run

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            if failure == "interrupt":
                raise KeyboardInterrupt
            code = errno.EFBIG if failure == "efbig" else errno.ENOSPC
            raise OSError(code, os.strerror(code))
        return original(*args, **kwargs)

    monkeypatch.setattr(bundle_stores, "_log_run", failing)
    line = one_line(cli_here("bundle", "import", str(valid), "--home", str(home), cwd=tmp_path, check=False))
    assert ("interrupted" if failure == "interrupt" else os.strerror(errno.EFBIG if failure == "efbig" else errno.ENOSPC)) in line
    assert "nothing of it was left" in line, line
    assert "no studies yet" in _studies(home, tmp_path)
    monkeypatch.setattr(bundle_stores, "_log_run", original)
    assert "demo (3 trials)" in cli_here("bundle", "import", str(valid), "--home", str(home), cwd=tmp_path).stdout


def test_an_artifact_is_written_inside_its_runs_folder_and_never_through_a_symlink(tmp_path):
    from paretolab.results.bundle_stores import artifact_target

    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    (root / "file").symlink_to(outside / "f")
    assert artifact_target(root, "a/b.json") == root.resolve() / "a" / "b.json"
    for name in ("link/x", "file", "../x", str(outside / "f"), "a/../../x"):
        with pytest.raises(ConfigError, match="refused"):
            artifact_target(root, name)
    assert list(outside.iterdir()) == []
