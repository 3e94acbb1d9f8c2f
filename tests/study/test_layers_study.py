"""A per-layer study end to end: Ray trials, both stores, the Trial page's tables, the export with per-group schemes."""

from __future__ import annotations

import json

import optuna
import pytest
import torch
import yaml

from tests.conftest import run_cli

pytestmark = pytest.mark.ray

TASK = {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 512, "context": 128, "stride": 128}


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_head):
    folder = tmp_path_factory.mktemp("layerstudy")
    spec = {"name": "lay", "model": "tiny-llama", "task": TASK,
            "stages": [{"method": "rtn", "params": {"bits": 8, "group_size": 32},
                        "layers": {"attention": {"bits": 4}, "each 0-1 mlp": {"bits": [3, 8]}}}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}],
            "search": {"sampler": "grid", "trials": 4, "seed": 0}, "resources": {"cpus": 1}, "measures": ["size", "params"]}
    (folder / "lay.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "lay.yaml", "--address", ray_head, "--no-progress", cwd=folder)
    loaded = optuna.load_study(study_name="lay", storage=f"sqlite:///{folder / '.paretolab' / 'optuna.db'}")
    return folder, [t for t in loaded.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]


def test_each_trial_records_its_groups_in_both_stores_and_the_assignment_per_module(study):
    from mlflow.tracking import MlflowClient

    from paretolab.dashboard.layers import group_table, module_table

    folder, trials = study
    assert len(trials) == 4 and len({tuple(sorted(t.params.items())) for t in trials}) == 4  # the whole grid
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / '.paretolab' / 'mlflow.db'}")
    for trial in trials:
        assert set(trial.params) == {"rtn.bits/0 mlp", "rtn.bits/1 mlp"}  # a group's fixed value is no search parameter
        run = client.get_run(trial.user_attrs["mlflow_run_id"])
        assert run.data.params["stage0.rtn.bits/attention"] == "4"  # but is recorded with the run
        for group in ("0 mlp", "1 mlp"):
            assert run.data.params[f"stage0.rtn.bits/{group}"] == str(trial.params[f"rtn.bits/{group}"])
        local = client.download_artifacts(run.info.run_id, "layers.stage0.json", str(folder))
        modules = module_table(open(local, "rb").read()).set_index("module")
        assert modules.loc["model.layers.1.self_attn.o_proj", "bits"] == 4
        assert modules.loc["model.layers.1.mlp.down_proj", "bits"] == trial.params["rtn.bits/1 mlp"]
        table = group_table(dict(trial.params)).set_index("group")
        assert table.loc["0 mlp", "bits"] == trial.params["rtn.bits/0 mlp"] and table.loc["0 mlp", "method"] == "rtn"


def test_a_per_layer_trial_exports_per_group_schemes_that_transformers_loads_with_the_trials_logits(study):
    from transformers import AutoModelForCausalLM

    from paretolab.api.export import export
    from paretolab.data.fidelity import logit_gap, probe_logits
    from paretolab.stores.locations import resolve_stores

    folder, trials = study
    trial = next(t for t in trials if t.params["rtn.bits/0 mlp"] == 3 and t.params["rtn.bits/1 mlp"] == 8)  # three schemes
    stores = resolve_stores(home=str(folder / ".paretolab"), create=False)
    done = export("lay", trial.number, folder / "out", stores=stores, progress=lambda _: None)
    assert done.exact, done.lines()
    config = json.loads((folder / "out" / "compact" / "config.json").read_text())["quantization_config"]
    schemes = {(g["weights"]["num_bits"], tuple(sorted(g["targets"]))) for g in config["config_groups"].values()}
    bits = {b for b, _ in schemes}
    assert bits == {4, 3, 8}
    attn = next(t for b, t in schemes if b == 4)
    assert "model.layers.0.self_attn.q_proj" in attn and "model.layers.1.self_attn.o_proj" in attn
    import paretolab

    same = paretolab.apply("tiny-llama", [{"method": "rtn", "params": {"bits": 8, "group_size": 32},
                                           "layers": {"attention": {"bits": 4}, "0 mlp": {"bits": 3}, "1 mlp": {"bits": 8}}}])
    loaded = AutoModelForCausalLM.from_pretrained(folder / "out" / "compact", dtype=torch.float32).eval()
    assert logit_gap(loaded, probe_logits(same.model)) <= 1e-5
