"""The results documents are what their committed bundles render: a stale document cannot land."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from paretolab.errors import ConfigError
from paretolab.results.bundle_stores import export_bundle
from paretolab.results.documents import LEGACY_BANNER, documents_for, read_manifest, study_state
from paretolab.stores import resolve_stores
from tests.conftest import cli_here

ROOT = Path(__file__).resolve().parents[2]


def test_every_committed_results_document_is_what_its_bundles_render():
    """`make results-docs` would change nothing: each document equals its rendering (offline, from results/bundles)."""
    start = time.monotonic()
    proc = cli_here("results", "render", "--check", "--root", str(ROOT), cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 120  # the bound for regenerating every document on two cores


def test_every_document_under_pipelines_is_in_the_manifest():
    listed = {d.path for d in read_manifest(ROOT)}
    assert {f"pipelines/{p.name}" for p in (ROOT / "pipelines").glob("*.md")} == listed


@pytest.fixture
def checkout(tmp_path, constrained_home):
    """A copy of the results layout with one document whose one study has a bundle (study `constrained`)."""
    (tmp_path / "results" / "bundles").mkdir(parents=True)
    (tmp_path / "pipelines").mkdir()
    stores = resolve_stores(home=str(constrained_home), create=False)
    raw = __import__("optuna").load_study(study_name="constrained", storage=stores.optuna_url).user_attrs["pipeline"]
    import yaml

    (tmp_path / "pipelines" / "constrained.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    export_bundle(["constrained"], stores, tmp_path / "results" / "bundles" / "constrained.jsonl.gz")
    (tmp_path / "results" / "documents.yaml").write_text(
        "figures:\n  - {family: one, model: smollm2-135m, out: results/cross}\n"
        "documents:\n"
        "  - {path: pipelines/ONE.md, family: one, title: One, studies: [constrained], metrics: 'ppl,size_bytes,decode_tok_s', timed: [constrained]}\n"
        "  - {path: pipelines/OLD.md, family: old, title: Old, studies: [gone]}\n")
    (tmp_path / "pipelines" / "OLD.md").write_text(LEGACY_BANNER + "\n\nold numbers\n")
    (tmp_path / "pipelines" / "gone.yaml").write_text("name: gone\n")  # a pipeline never run into a bundle: "missing"
    return tmp_path


def test_render_writes_the_document_with_its_provenance_and_check_catches_a_planted_edit(checkout):
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    text = (checkout / "pipelines" / "ONE.md").read_text()
    assert text.startswith("# One\n") and "**Provenance.**" in text and "Code that judged them: the results code" in text
    assert "## constrained" in text
    assert cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout).returncode == 0
    (checkout / "pipelines" / "ONE.md").write_text(text.replace("| rtn", "| rtn ", 1))  # one character
    proc = cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 1 and "pipelines/ONE.md" in proc.stderr
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    (checkout / "pipelines" / "OLD.md").write_text("old numbers, no banner\n")  # a legacy document must say it is stale
    proc = cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 1 and "OLD.md" in proc.stderr and "ONE.md" not in proc.stderr
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)  # render marks it
    assert (checkout / "pipelines" / "OLD.md").read_text().startswith(LEGACY_BANNER)
    assert cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout).returncode == 0


def test_status_tells_current_missing_and_stale_and_run_says_what_it_would_do(checkout):
    assert study_state(checkout, "constrained") == ("current", "") or study_state(checkout, "constrained")[0] == "stale"
    assert study_state(checkout, "gone")[0] == "missing"
    pipeline = checkout / "pipelines" / "constrained.yaml"
    pipeline.write_text(pipeline.read_text().replace("name: constrained", "name: constrained\nmodel: tiny-llama", 1)
                        if "model:" not in pipeline.read_text() else pipeline.read_text().replace("model: smollm2-135m", "model: tiny-llama"))
    state, why = study_state(checkout, "constrained")
    assert state == "stale" and "made from pipeline" in why
    out = cli_here("results", "status", "--root", str(checkout), cwd=checkout).stdout
    assert "stale    constrained [timed: run alone]" in out and "missing  gone" in out
    dry = cli_here("results", "run", "one", "--dry-run", "--root", str(checkout), cwd=checkout).stdout
    assert "1 study to run" in dry and "expected duration:" in dry and "run this on an otherwise idle machine" in dry
    untimed = cli_here("results", "run", "one", "--untimed", "--dry-run", "--root", str(checkout), cwd=checkout).stdout
    assert "leaving 1 timed study for an idle machine: constrained" in untimed and "nothing to run" in untimed
    timed = cli_here("results", "run", "--timed", "--dry-run", "--root", str(checkout), cwd=checkout).stdout
    assert "1 study to run" in timed and ": constrained" in timed and "leaving" in timed and "gone" in timed.split("leaving")[1]


def test_the_provenance_says_the_machine_load_its_trials_ran_under():
    from types import SimpleNamespace

    from paretolab.results.bundle import run_provenance
    from paretolab.results.documents import provenance_lines

    runs = [SimpleNamespace(data=SimpleNamespace(tags={}, params={"info.load_1m": load})) for load in ("0.40", "7.25", "0.90")]
    prov = run_provenance([], runs, "m")
    assert prov["load_1m"] == {"median": 0.9, "max": 7.25, "trials": 3}
    assert "- Machine load (1-min average while its trials ran): macko median 0.9, max 7.2." in provenance_lines([("macko", prov)])
    assert run_provenance([], runs[:0], "m")["load_1m"] is None  # trials from before it was recorded: no line
    assert not any("Machine load" in line for line in provenance_lines([("old", run_provenance([], [], "m"))]))


def test_a_timed_study_waits_for_a_quiet_machine_and_says_why_it_gave_up(monkeypatch, capsys):
    from paretolab.cli import results as cli_results

    loads = iter([3.5, 2.0, 0.4])
    monkeypatch.setattr("paretolab.measure.timing.machine_load", lambda: next(loads))
    cli_results.wait_for_quiet("macko", max_load=1.0, wait_min=1.0, poll_s=0.0)  # busy, busy, quiet: starts
    assert "macko times something: waiting up to 1 min for the machine to quiet down (1-min load average 3.5 > --max-load 1)" in capsys.readouterr().out
    monkeypatch.setattr("paretolab.measure.timing.machine_load", lambda: 5.0)
    with pytest.raises(ConfigError, match=r"macko: the machine stayed busy for 0 min \(1-min load average 5.0 > --max-load 1\).*--busy-ok"):
        cli_results.wait_for_quiet("macko", max_load=1.0, wait_min=0.0, poll_s=0.0)
    capsys.readouterr()
    monkeypatch.setattr("paretolab.measure.timing.machine_load", lambda: 0.2)
    cli_results.wait_for_quiet("macko", max_load=1.0, wait_min=0.0)  # quiet already: no wait, no message
    assert capsys.readouterr().out == ""


def test_an_unknown_family_or_a_bad_manifest_is_one_line(checkout):
    with pytest.raises(ConfigError, match="no results document 'nope'; families: one, old"):
        documents_for(read_manifest(checkout), ["nope"])
    (checkout / "results" / "documents.yaml").write_text("documents:\n  - {path: a.md, family: a, title: A, studies: [x], colour: red}\n")
    proc = cli_here("results", "status", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 2 and "unknown field 'colour'" in proc.stderr and proc.stderr.count("\n") == 1


def test_the_cross_paper_frontier_is_drawn_from_the_bundles_and_checked_by_its_points(checkout):
    import json

    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    data = json.loads((checkout / "results" / "cross.json").read_text())
    assert data["model"] == "smollm2-135m" and data["points"]
    assert all(p["study"] == "constrained" for p in data["points"]) and any(p["frontier"] for p in data["points"])
    assert (checkout / "results" / "cross.png").read_bytes()[:4] == b"\x89PNG" and b"<svg" in (checkout / "results" / "cross.svg").read_bytes()
    assert cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout).returncode == 0
    data["points"][0]["ppl"] *= 1.01  # a figure whose points are not the bundles' is stale
    (checkout / "results" / "cross.json").write_text(json.dumps(data))
    proc = cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 1 and "results/cross.json" in proc.stderr


def test_the_committed_results_stay_under_100_mb():
    total = sum(p.stat().st_size for p in (ROOT / "results").rglob("*") if p.is_file() and ".store" not in p.parts)
    assert total < 100e6, f"results/ holds {total / 1e6:.1f} MB; bundles must stay compact"


def test_a_timed_bundle_made_beside_other_work_is_named_busy_and_timed_again(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from paretolab.results import bundle as bundle_module
    from paretolab.results.documents import busy_timing

    (tmp_path / "results" / "bundles").mkdir(parents=True)
    (tmp_path / "results" / "bundles" / "s.jsonl.gz").write_bytes(b"")
    load = {"max": 2.6}
    record = SimpleNamespace(provenance={"load_1m": load}, user_attrs={"pipeline": {"resources": {"cpus": 2}}})
    monkeypatch.setattr(bundle_module, "read_bundle", lambda path: [record])
    assert busy_timing(tmp_path, "s", 1.0) == "", "its own two CPUs and a little more: an idle machine"
    load["max"] = 5.2
    assert busy_timing(tmp_path, "s", 1.0) == "timed on a busy machine: 1-min load up to 5.2 beside its own 2 CPU(s)"
    assert busy_timing(tmp_path, "s", 4.0) == "", "--max-load 4 tolerates it"
    assert busy_timing(tmp_path, "missing", 1.0) == ""
    record.provenance = {}  # trials from before the load was recorded
    assert busy_timing(tmp_path, "s", 1.0).startswith("timed before trials recorded the machine's load")


def test_a_busy_bundles_finished_run_is_removed_to_be_timed_again_and_an_unfinished_one_resumes(tmp_path, capsys):
    import optuna

    from paretolab.cli.results import _forget_finished
    from paretolab.stores.locations import resolve_stores

    stores = resolve_stores(home=str(tmp_path / "store"))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name, finished in (("done", 2), ("half", 1)):
        study = optuna.create_study(study_name=name, storage=stores.optuna_url)
        study.set_user_attr("pipeline", {"search": {"trials": 2}})
        for _ in range(finished):
            study.add_trial(optuna.trial.create_trial(value=1.0))
    _forget_finished(stores, "done", "timed on a busy machine")
    _forget_finished(stores, "half", "timed on a busy machine")
    _forget_finished(stores, "absent", "timed on a busy machine")
    names = {s.study_name for s in optuna.get_all_study_summaries(stores.optuna_url)}
    assert names == {"half"}, names
    assert "done: its bundle was timed on a busy machine; the results store's run is finished, so it is timed again afresh" in capsys.readouterr().out


@pytest.mark.parametrize("pipeline", sorted((ROOT / "pipelines").glob("*.yaml")), ids=lambda p: p.stem)
def test_status_hashes_a_pipeline_as_the_study_it_starts_does(pipeline):
    """`results status` reads the YAML without validating; its hash must be the one a study started from it stores
    (a `models:` pipeline gets its subject filled in by both), or a fresh bundle reads "stale"."""
    from paretolab.data.yaml_read import read_yaml
    from paretolab.study.spec import pipeline_hash
    from tests.study.shipped_pipelines import load_as_shipped

    assert pipeline_hash(read_yaml(pipeline.read_text(encoding="utf-8"), str(pipeline))) == load_as_shipped(pipeline).pipeline_hash()


def test_a_study_that_completed_no_trial_leaves_no_bundle(checkout, tmp_path, monkeypatch, capsys):
    """Every trial failed (an engine not installed): `results run` writes no bundle and says why, where it used to write an
    empty one and say "commit it" over the real results."""
    import optuna
    from optuna.trial import TrialState, create_trial

    import paretolab.cli.results as results_cli
    from paretolab.cli import main

    (checkout / "results" / "bundles" / "constrained.jsonl.gz").unlink()
    stores = resolve_stores(home=str(tmp_path / "store"))
    failed = optuna.create_study(study_name="constrained", storage=stores.optuna_url, directions=["minimize"])
    failed.add_trial(create_trial(state=TrialState.FAIL))
    monkeypatch.setattr(results_cli, "_call", lambda argv, cwd: 0)  # the study "ran": its trials are the failed one above
    code = main(["results", "run", "one", "--root", str(checkout), "--home", str(tmp_path / "store"), "--busy-ok", "--no-progress"])
    assert code == 2 and "completed none of its 1 trial(s), so no bundle was written" in capsys.readouterr().err
    assert not (checkout / "results" / "bundles" / "constrained.jsonl.gz").exists()
