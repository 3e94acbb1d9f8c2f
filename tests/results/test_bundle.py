"""Study bundles: a study's whole record in one file, read back (report, frontier, load_study) or imported, never misread."""

from __future__ import annotations

import gzip
import json

import pytest

from paretolab.errors import ConfigError
from paretolab.results.bundle import read_bundle
from paretolab.results.bundle_stores import export_bundle, import_bundle
from paretolab.results.read import frontier_rows
from paretolab.results.section import study_section
from paretolab.results.source import BundleSource
from paretolab.stores import resolve_stores
from tests.conftest import cli_here

STUDIES = ["constrained", "pruned"]


@pytest.fixture(scope="module")
def exported(constrained_home, tmp_path_factory):
    """(the original stores, the bundle of both studies)."""
    stores = resolve_stores(home=str(constrained_home), create=False)
    out = tmp_path_factory.mktemp("bundle") / "both.jsonl.gz"
    written = export_bundle(STUDIES, stores, out)
    assert set(written) == set(STUDIES) and all(n > 0 for n in written.values())
    return stores, out


def _report(source) -> str:
    return "\n".join(study_section(name, source, ["ppl", "size_bytes", "decode_tok_s", "val_loss", "train_flops"], frontier=False)
                     for name in STUDIES)


def test_export_import_report_is_byte_identical_to_the_original(exported, tmp_path):
    stores, out = exported
    fresh = resolve_stores(home=str(tmp_path / "fresh"))
    assert import_bundle(out, fresh) == {name: len(read_bundle(out)[i].trials) for i, name in enumerate(STUDIES)}
    original = _report(stores)
    assert "| method" in original
    assert _report(fresh) == original  # trials, runs, per-example scores, curves, feasibility, pruning: all came across
    assert _report(BundleSource([out])) == original  # and read straight from the bundle, no store at all
    assert frontier_rows("constrained", BundleSource([out])) == frontier_rows("constrained", stores)


def test_the_same_study_gives_the_same_bytes(exported, tmp_path):
    stores, out = exported
    again = tmp_path / "again.jsonl.gz"
    export_bundle(STUDIES, stores, again)
    assert again.read_bytes() == out.read_bytes()


def test_the_bundle_keeps_curves_pruned_marks_and_feasibility(exported):
    _, out = exported
    constrained, pruned = read_bundle(out)
    assert {t["state"] for t in pruned.trials} == {"COMPLETE", "PRUNED"}
    assert any(t["run"].history.get("curve.val_loss") for t in pruned.trials)
    assert any("learning_curve.json" in t["run"].artifacts for t in pruned.trials)
    assert {t["user_attrs"].get("feasible") for t in constrained.trials} == {True, False}
    assert constrained.user_attrs["pipeline"]["name"] == "constrained"


def test_report_and_frontier_read_a_bundle_from_the_command_line(exported, tmp_path):
    stores, out = exported
    from_bundle = cli_here("report", "constrained", "--trials", "all", "--bundle", str(out), cwd=tmp_path)
    from_stores = cli_here("report", "constrained", "--trials", "all", "--home", str(stores.optuna_url.split("///")[1].rsplit("/", 1)[0]),
                           cwd=tmp_path)
    assert from_bundle.stdout == from_stores.stdout
    front = cli_here("frontier", "constrained", "--json", "--bundle", str(out), cwd=tmp_path)
    assert json.loads(front.stdout)


def test_import_refuses_a_study_already_there_and_writes_nothing(exported, tmp_path):
    _, out = exported
    fresh = resolve_stores(home=str(tmp_path / "s"))
    import_bundle(out, fresh)
    with pytest.raises(ConfigError, match="'constrained' is already in"):
        import_bundle(out, fresh)
    proc = cli_here("bundle", "import", str(out), "--home", str(tmp_path / "s"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "already in" in proc.stderr


def _rewrite(path, target, edit):
    lines = gzip.decompress(path.read_bytes()).decode().split("\n")
    edit(lines)
    target.write_bytes(gzip.compress("\n".join(lines).encode()))
    return target


def test_a_corrupt_truncated_or_foreign_bundle_is_refused_with_one_line(exported, tmp_path):
    _, out = exported
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(out.read_bytes()[: len(out.read_bytes()) // 2])
    flipped = tmp_path / "flip.jsonl.gz"
    raw = bytearray(out.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    flipped.write_bytes(bytes(raw))
    dropped = _rewrite(out, tmp_path / "dropped.jsonl.gz", lambda lines: lines.pop(3))  # a trial gone, gzip intact
    edited = _rewrite(out, tmp_path / "edited.jsonl.gz", lambda lines: lines.__setitem__(3, lines[3].replace('"COMPLETE"', '"FAIL"', 1)))
    newer = _rewrite(out, tmp_path / "newer.jsonl.gz", lambda lines: lines.__setitem__(0, lines[0].replace('"version":1', '"version":2')))
    foreign = tmp_path / "foreign.jsonl.gz"
    foreign.write_bytes(gzip.compress(b'{"hello": 1}\n'))
    for path, words in ((cut, "corrupt or truncated"), (flipped, "corrupt"), (dropped, "truncated"), (edited, "checksum"),
                        (newer, "format version 2"), (foreign, "not a paretolab bundle"), (tmp_path / "none.jsonl.gz", "no such file")):
        with pytest.raises(ConfigError, match=words):
            read_bundle(path)
        proc = cli_here("report", "constrained", "--bundle", str(path), cwd=tmp_path, check=False)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (path, proc.stderr)


def test_export_checks_its_output_before_reading_and_leaves_no_partial_file(exported, tmp_path, monkeypatch):
    stores, _ = exported
    (tmp_path / "file").write_text("x")
    for out, words in ((tmp_path / "file" / "b.jsonl.gz", "is a file"), (tmp_path / "b.json", "ends in .jsonl.gz"), (tmp_path, "is a folder")):
        with pytest.raises(ConfigError, match=words):
            export_bundle(STUDIES, stores, out)
    target = tmp_path / "full.jsonl.gz"

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("paretolab.data.outputs.os.replace", full)  # the one atomic write (write_atomic)
    with pytest.raises(ConfigError, match="No space left on device; nothing was written"):
        export_bundle(STUDIES, stores, target)
    assert list(tmp_path.glob("*full*")) == []  # the temporary file is gone too


def test_per_example_scores_travel_so_differences_stay_paired(tmp_path):
    from tests.results.test_report import _fix, _hits, _stored_study

    base = _hits()
    (tmp_path / "a").mkdir()
    stores, name = _stored_study(tmp_path / "a", [("none", base, 100.0), ("rtn", _fix(base, 16), 50.0)])
    out = tmp_path / "q.jsonl.gz"
    export_bundle([name], stores, out)
    fresh = resolve_stores(home=str(tmp_path / "b"))
    import_bundle(out, fresh)
    original = study_section(name, stores, ["acc"], frontier=False)
    assert "beyond noise (paired, 400 examples)" in original
    assert study_section(name, fresh, ["acc"], frontier=False) == original
    assert study_section(name, BundleSource([out]), ["acc"], frontier=False) == original


def test_load_study_reads_a_bundle_as_it_reads_the_stores(exported):
    import paretolab

    stores, out = exported
    from_bundle = paretolab.load_study("constrained", bundle=out)
    from_stores = paretolab.load_study("constrained", stores=stores)
    assert from_bundle.trials.drop(columns=["run_id"]).equals(from_stores.trials.drop(columns=["run_id"]))
    assert list(from_bundle.frontier["trial"]) == list(from_stores.frontier["trial"])
    assert from_bundle.pipeline == from_stores.pipeline


def test_a_trained_bases_record_travels_in_the_bundle_not_from_the_reading_machine(tmp_path, monkeypatch):
    """A document rendered from a bundle is the same on any machine: how a base trained here was made comes along."""
    import optuna

    from paretolab.training.checkpoints import RECORD, trained_dir
    from tests.results.test_report import _fix, _hits, _stored_study

    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    (trained_dir() / "base-fp32").mkdir(parents=True)
    (trained_dir() / "base-fp32" / RECORD).write_text(json.dumps({"base": "scratch-5m", "weights": "fp32 (trained here)", "tokens": 1024,
                                                                  "corpus": "pystdlib-train", "seed": 0, "saved_at": "2026-12-06T00:00:00Z"}))
    (tmp_path / "a").mkdir()
    stores, name = _stored_study(tmp_path / "a", [("none", _hits(), 100.0), ("rtn", _fix(_hits(), 4), 50.0)])
    optuna.load_study(study_name=name, storage=stores.optuna_url).set_user_attr("model", "base-fp32")
    out = tmp_path / "q.jsonl.gz"
    export_bundle([name], stores, out)
    here = study_section(name, stores, ["acc"], frontier=False)
    assert "Base `base-fp32`: fp32 (trained here), from `scratch-5m`" in here
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "elsewhere"))  # a machine that never trained it
    assert study_section(name, BundleSource([out]), ["acc"], frontier=False) == here
