"""paretolab export: a trial's model re-applied, checked against the recorded quality, written for plain transformers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from tests.conftest import cli_here, run_cli

pytestmark = pytest.mark.ray

TASK = {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 512, "context": 128, "stride": 128}
EXPORTABLE = {  # method -> its params, and the compact format export must write (None: dense only)
    "none": ({}, None),
    "magnitude": ({"sparsity": 0.5}, "macko"),
    "wanda": ({"sparsity": 0.5}, "macko"),
    "macko": ({"sparsity": 0.5}, "macko"),
    "rtn": ({"bits": 4, "group_size": 32}, "int4 (pack-quantized)"),  # a compressed-tensors checkpoint
    "catq": ({"steps": 5}, "int2"),  # groups of 128 over the flattened 64-wide rows: paretolab's own layout
    "absmean_ternary": ({}, "int2"),
    "layerdrop": ({"k": [1, 4], "score": "random"}, None),  # k=4 of 2 layers fails: the failed trial to refuse
}
REFUSED = {"cat": {"transform": "cat", "w_bits": 4, "a_bits": 8, "strength": 1.0}}
CLAIM = {"text": "magnitude pruning at 50 % costs at most 5 % perplexity", "metric": "ppl", "method": "magnitude",
         "baseline": "none", "expect": "no_worse", "margin": 0.05, "scale": "log", "replicates": []}

# a fresh interpreter that loads each directory with plain transformers and runs the study's perplexity task on it
LOAD_AND_SCORE = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from paretolab.api.compact import load_compact
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject
task = registries().tasks.get("perplexity")
options = parse_options(task.options, {k: v for k, v in json.loads(sys.argv[1]).items() if k != "name"}, where="task")
out = {}
for d in sys.argv[2:]:
    tok = AutoTokenizer.from_pretrained(d)
    models = {"dense": AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()}
    if json.load(open(d + "/paretolab.json"))["compact"]:
        models["compact"] = load_compact(d)
    out[d] = {k: task.evaluate(Subject(model=m, tokenizer=tok, model_name=d), options, TrialContext(seed=0, workdir=__import__("pathlib").Path(d)))["ppl"]
              for k, m in models.items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_head):
    folder = tmp_path_factory.mktemp("exportstudy")
    options = [{"method": m, "params": p} for m, (p, _) in EXPORTABLE.items()]
    options += [{"method": m, "params": p} for m, p in REFUSED.items()]
    spec = {"name": "ex", "model": "tiny-llama", "task": TASK, "stages": [{"choice": options}],
            "objectives": [{"metric": "ppl"}, {"metric": "size_bytes"}], "claims": [CLAIM],
            "search": {"sampler": "grid", "trials": 10, "seed": 0, "trial_timeout_s": 300},
            "resources": {"cpus": 1}, "measures": ["size", "params"]}
    (folder / "ex.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "ex.yaml", "--address", ray_head, "--no-progress", cwd=folder)
    loaded = optuna.load_study(study_name="ex", storage=f"sqlite:///{folder / '.paretolab' / 'optuna.db'}")
    return folder, loaded.get_trials(deepcopy=False)


def first(trials, method, state=optuna.trial.TrialState.COMPLETE):
    return next(t for t in trials if t.params["stage0.method"] == method and t.state == state)


def recorded(folder: Path, number: int) -> dict[str, float]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{folder / '.paretolab' / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name("ex").experiment_id], f"tags.`paretolab.trial_number` = '{number}'")[0]
    return dict(run.data.metrics)


def test_every_weights_method_exports_a_model_plain_transformers_scores_as_the_trial_did(study):
    from paretolab.api.export import export
    from paretolab.stores.locations import resolve_stores

    folder, trials = study
    stores = resolve_stores(home=str(folder / ".paretolab"), create=False)
    dirs = {}
    for index, (method, (_, fmt)) in enumerate(EXPORTABLE.items()):
        trial = first(trials, method)
        if index == 1:  # the command once; the other methods through the Python function it prints (a process each: ~7 s of imports)
            said = run_cli("export", "ex", str(trial.number), "--out", f"out-{method}", cwd=folder).stdout
        else:
            said = "\n".join(export("ex", trial.number, folder / f"out-{method}", stores=stores, progress=lambda _: None).lines())
        assert "reproduced" in said, said
        info = json.loads((folder / f"out-{method}" / "paretolab.json").read_text())
        assert info["reproduced"]["within"] is True and info["params"] == dict(trial.params)
        assert info["sizes_bytes"]["dense on disk"] > 0 and "dense fp16" in info["sizes_bytes"]
        assert set(info["compact"].values()) == ({fmt} if fmt else set()), (method, info["compact"])
        if fmt:
            assert info["sizes_bytes"]["compact on disk"] < info["sizes_bytes"]["dense on disk"] / 2
        dirs[method] = str(folder / f"out-{method}")
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_SCORE, json.dumps(TASK), *dirs.values()],
                          capture_output=True, text=True, timeout=600, check=True)
    scored = json.loads(proc.stdout.strip().splitlines()[-1])
    for method, d in dirs.items():
        metrics = recorded(folder, first(trials, method).number)
        assert scored[d]["dense"] == pytest.approx(metrics["ppl"], rel=1e-5), method
        if "compact" in scored[d]:  # fp16 values and scales: within the trial's own interval
            assert metrics["ppl_ci_low"] <= scored[d]["compact"] <= metrics["ppl_ci_high"], method


def test_refusals_are_one_line_and_leave_nothing_behind(study):
    folder, trials = study
    failed = first(trials, "layerdrop", optuna.trial.TrialState.FAIL)
    cases = [
        ((str(failed.number),), rf"trial {failed.number} of 'ex' is fail.*layerdrop.k"),
        ((str(first(trials, "cat").number),), r"no export path for cat: module .* is CATLinear \(from paretolab.plugins.cat\) here but Linear"),
        (("999",), r"has no trial 999"),
    ]
    from paretolab.api.export import export
    from paretolab.errors import ParetolabError
    from paretolab.stores.locations import resolve_stores

    stores = resolve_stores(home=str(folder / ".paretolab"), create=False)
    for index, (args, message) in enumerate(cases):
        if index == 0:  # the command once (exit 2, one line); the rest through the function it prints the error of
            proc = run_cli("export", "ex", *args, "--out", "refused", cwd=folder, check=False)
            assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            said = proc.stderr
        else:
            with pytest.raises(ParetolabError) as refused:
                export("ex", int(args[0]), folder / "refused", stores=stores, progress=lambda _: None)
            said = str(refused.value)
            assert len(said.strip().splitlines()) == 1, said
        assert __import__("re").search(message, said), said
        assert not (folder / "refused").exists() and not (folder / "refused.partial").exists()
    number = first(trials, "none").number
    export("ex", number, folder / "twice", stores=stores, progress=lambda _: None)
    with pytest.raises(ParetolabError, match="exists; pick a new directory or pass --force"):
        export("ex", number, folder / "twice", stores=stores, progress=lambda _: None)
    export("ex", number, folder / "twice", stores=stores, force=True, progress=lambda _: None)


def test_a_study_whose_base_model_is_gone_is_refused(study, tmp_path):
    import shutil

    folder, trials = study
    copy = tmp_path / "copy"
    shutil.copytree(folder / ".paretolab", copy / ".paretolab")
    stored = optuna.load_study(study_name="ex", storage=f"sqlite:///{copy / '.paretolab' / 'optuna.db'}")
    stored.set_user_attr("pipeline", {**stored.user_attrs["pipeline"], "model": "a-checkpoint-deleted-since"})
    proc = cli_here("export", "ex", str(first(trials, "none").number), "--out", "x", cwd=copy, check=False)
    assert proc.returncode == 2 and "base model 'a-checkpoint-deleted-since' is missing here" in proc.stderr, proc.stderr


def test_load_study_gives_trials_frontier_and_the_reports_verdicts_as_frames(study):
    import paretolab
    from paretolab.results.frontier import pareto_indices
    from paretolab.stores.locations import resolve_stores

    folder, trials = study
    frames = paretolab.load_study("ex", home=str(folder / ".paretolab"))
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(frames.trials["trial"]) == sorted(t.number for t in complete)
    assert {"ppl", "size_bytes", "param:stage0.method"} <= set(frames.trials.columns)
    points = frames.trials[["ppl", "size_bytes"]].to_numpy().tolist()
    expected = {int(frames.trials["trial"].iloc[i]) for i in pareto_indices(points, ["minimize", "minimize"])}
    assert set(frames.frontier["trial"]) == expected
    report = cli_here("report", "ex", cwd=folder).stdout
    assert len(frames.verdicts) == report.count("**Verdict") >= 1  # one per claim and setting, as the report says them
    for _, row in frames.verdicts.iterrows():
        assert row["method"] == "magnitude" and f"**Verdict at {row['setting']}: {row['verdict']}**" in report
        assert row["low"] <= row["difference"] <= row["high"]
    assert resolve_stores(home=str(folder / ".paretolab"), create=False).optuna_url.endswith("optuna.db")


def test_a_training_trial_exports_with_its_curve_and_becomes_a_base_by_name(tmp_path, ray_head):
    cache = {"PARETOLAB_CACHE": str(tmp_path / "cache")}
    spec = {"name": "tr", "model": "tiny-llama", "task": {**TASK, "max_tokens": 256},
            "stages": [{"method": "train", "params": {"tokens": 8192, "seq_len": 64, "batch": 8, "eval_every": 4, "eval_tokens": 512,
                                                      "corpus": "pystdlib-train", "seed": 0, "save_as": "trained-{seed}"}}],
            "objectives": [{"metric": "val_loss"}, {"metric": "train_flops"}],
            "search": {"sampler": "grid", "trials": 1, "seed": 0, "trial_timeout_s": 300}, "resources": {"cpus": 1}, "measures": ["params"]}
    (tmp_path / "tr.yaml").write_text(yaml.safe_dump(spec))
    run_cli("run", "tr.yaml", "--address", ray_head, "--no-progress", cwd=tmp_path, env=cache)
    saved = tmp_path / "cache" / "models" / "trained" / "trained-0" / "paretolab.json"
    stamp = json.loads(saved.read_text())["saved_at"]
    done = run_cli("export", "tr", "0", "--out", "out", "--save-as", "my-exported", cwd=tmp_path, env=cache)
    assert "reproduced" in done.stdout and "saved as model 'my-exported'" in done.stdout
    info = json.loads((tmp_path / "out" / "paretolab.json").read_text())
    assert info["training_curve"]["curve.val_loss"], "the training record lost its curve"
    assert json.loads(saved.read_text())["saved_at"] == stamp, "export overwrote the study's own checkpoint"
    listed = run_cli("models", "list", cwd=tmp_path, env=cache).stdout  # a new process: the saved model is found by name
    assert "my-exported" in listed


def test_pick_export_writes_the_choice_with_a_model_card_of_its_evidence(study):
    """The card's plumbing, on a decision made by hand: the tiny model is at chance, so no rule of a real study holds on it."""
    from paretolab.api.pick import export_choice
    from paretolab.results.decision_rule import parse_budget, parse_rule
    from paretolab.results.pick import Candidate, Decision
    from paretolab.stores.locations import resolve_stores

    folder, trials = study
    chosen = first(trials, "rtn")
    row = {"trial": chosen.number, "ppl": 250.0, "size_bytes": 9e4, "run_params": {}, "params": {}}
    known = {"ppl": "lower", "size_bytes": "lower"}
    choice = Candidate("rtn", {"stage0.rtn.bits": 4, "stage0.rtn.group_size": 32}, [row], cost=9e4, cost_span=(9e4, 9e4),
                       quality=250.0, in_budget=True, verdict="held", difference=1.012, low=1.004, high=1.019, replicates=1)
    decision = Decision("ex", parse_rule("ppl no_worse 2 % vs none", known), [parse_budget("size_bytes <= 0.5 x none", known)],
                        "size_bytes", references={"none": 2e5}, choice=choice, candidates=[choice])
    stores = resolve_stores(home=str(folder / ".paretolab"), create=False)
    done = export_choice(decision, folder / "picked", stores=stores, command="paretolab pick ex --keep ...", progress=lambda _: None)
    card = (folder / "picked" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers") and "# ex: `rtn`" in card
    assert "- `stage0.rtn.bits` = 4" in card and "- `stage0.rtn.group_size` = 32" in card
    assert "×1.012 [×1.004, ×1.019] (95 % interval) over 1 pair(s): held" in card
    assert f"trial {chosen.number}" in card and "size_bytes <= 0.5 x none = 100 kB" in card
    assert "vllm serve" in card and "llama_cpp.server" in card and "paretolab pick ex --keep ..." in card
    info = json.loads((folder / "picked" / "paretolab.json").read_text())
    assert "README.md" in info["files"] and done.within is True  # --force may replace it later: the card is in the manifest
