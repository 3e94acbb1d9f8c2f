"""Studies on a random-weight model say that their quality numbers mean nothing."""

from __future__ import annotations

import optuna

from paretolab.stores import resolve_stores
from tests.conftest import cli_here
from tests.dashboard.conftest import build_stores

NOTE = "Not meaningful for quality: model 'tiny-llama' has random weights"


def test_frontier_and_report_label_a_tiny_llama_study(tmp_path):
    home = tmp_path / "home"
    stores = build_stores(home)  # studies demo and single, on tiny-llama
    frontier = cli_here("frontier", "demo", "--home", str(home), cwd=tmp_path)
    assert f"warning: {NOTE}" in frontier.stdout
    as_json = cli_here("frontier", "demo", "--home", str(home), "--json", cwd=tmp_path)
    assert NOTE in as_json.stderr and NOTE not in as_json.stdout  # the JSON stays parseable
    report = cli_here("report", "demo", "--home", str(home), cwd=tmp_path)
    assert f"> **{NOTE}" in report.stdout

    optuna.load_study(study_name="single", storage=resolve_stores(home=str(home)).optuna_url).set_user_attr("model", "smollm2-135m")
    assert stores and "Not meaningful" not in cli_here("frontier", "single", "--home", str(home), cwd=tmp_path).stdout
    assert "Not meaningful" not in cli_here("report", "single", "--home", str(home), cwd=tmp_path).stdout


def test_a_pipeline_that_trains_its_random_init_model_gets_no_warning():
    from paretolab.models import quality_note, trains

    trained = {"stages": [{"choice": [{"method": "bhyt"}, {"method": "none"}]}, {"method": "train", "params": {"tokens": 10}}]}
    chosen = {"stages": [{"choice": [{"method": "train"}, {"method": "none"}]}]}
    untrained = {"stages": [{"method": "wanda"}]}
    assert trains(trained) and trains(chosen) and not trains(untrained) and not trains({})
    assert quality_note("tiny-llama", trained) == ""
    assert quality_note("tiny-llama", untrained).startswith(NOTE)


def test_the_note_is_recorded_when_a_study_is_created_and_frontier_reads_it_back(tmp_path):
    """`frontier` loads no plugin to say it: the study carries the note `run` worked out (tiny-llama: random weights)."""
    from paretolab.study.optuna_study import open_study
    from paretolab.study.spec import parse_spec

    stores = resolve_stores(home=str(tmp_path / "home"))
    pipeline = {"name": "noted", "model": "tiny-llama", "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 256},
                "stages": [{"method": "rtn", "params": {"bits": [4, 8]}}],
                "objectives": [{"metric": "ppl", "direction": "minimize"}, {"metric": "size_bytes", "direction": "minimize"}]}
    study = open_study(parse_spec(pipeline), stores, resume=False)
    assert study.user_attrs["quality_note"].startswith(NOTE)
    study.set_user_attr("quality_note", "recorded, not recomputed")
    study.add_trial(optuna.trial.create_trial(params={}, distributions={}, values=[20.0, 1000.0]))
    frontier = cli_here("frontier", "noted", "--home", str(tmp_path / "home"), cwd=tmp_path)
    assert "warning: recorded, not recomputed" in frontier.stdout
