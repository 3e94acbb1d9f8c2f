"""Pipelines that cannot run are refused before anything runs: one line naming field, value and fix, rc 2, no store."""

from __future__ import annotations

import math
import time

import pytest
import yaml

from paretolab.errors import ConfigError
from paretolab.study.spec import load_spec, parse_spec
from paretolab.study.yaml_read import MAX_PIPELINE_BYTES
from tests.conftest import edited, run_cli

GOOD = {
    "name": "refused",
    "model": "tiny-llama",
    "description": "a pipeline the table below breaks one field at a time",
    "task": {"name": "perplexity", "corpus": "pydoc", "max_tokens": 512, "context": 128, "stride": 128},
    "stages": [
        {"method": "magnitude", "params": {"sparsity": {"low": 0.1, "high": 0.9}, "scope": "row"}},
        {"choice": [{"method": "rtn", "params": {"bits": [2, 4, 8]}}, {"method": "none"}]},
    ],
    "objectives": [{"metric": "ppl", "direction": "minimize"}, {"metric": "size_bytes"}],
    "search": {"sampler": "random", "trials": 4, "seed": 0, "trial_timeout_s": 600},
    "resources": {"cpus": 1, "gpus": 0},
}


def with_(path: str, value):
    """GOOD with the field at dotted ``path`` set to ``value`` (list items by index)."""
    return edited(GOOD, path, value)


NAN = float("nan")
BAD = [
    # a value of the wrong type or outside the method's search space
    ("stages.0.params.sparsity", "lots", "stages[0].params.sparsity: 'lots' is not a number; give a number from 0.0 to 0.9"),
    ("stages.0.params.sparsity", 5.0, "stages[0].params.sparsity: 5.0 is outside the method's search space; give a value from 0.0 to 0.9"),
    ("stages.0.params.sparsity", [0.5, 1.5], "stages[0].params.sparsity: 1.5 is outside the method's search space"),
    ("stages.0.params.sparsity", {"low": 0.1, "high": 2}, "stages[0].params.sparsity: 2 is outside the method's search space"),
    ("stages.0.params.scope", "colum", "stages[0].params.scope: 'colum' is not one of 'row', 'matrix'"),
    ("stages.1.choice.0.params.bits", ["four"], "stages[1].choice[0].params.bits: 'four' is not an integer"),
    ("stages.1.choice.0.params.bits", {"low": 2.5, "high": 8}, "stages[1].choice[0].params.bits: 2.5 is not an integer"),
    ("stages.0", {"method": "wanda", "params": {"calib_samples": "many"}}, "stages[0].params.calib_samples: 'many' is not an integer (the default is 16)"),
    ("stages.0", {"method": "layerdrop", "params": {"k": 2.5}}, "stages[0].params.k: 2.5 is not an integer; give an integer from 0 to 29"),
    ("stages.0", {"method": "layerdrop", "params": {"score": {"low": 1, "high": 2}}}, "stages[0].params.score: layerdrop.score is one of"),
    # step
    ("stages.0.params.sparsity", {"low": 0.1, "high": 0.9, "step": 0}, "stages[0].params.sparsity.step: expected a number greater than 0, got 0"),
    ("stages.0.params.sparsity", {"low": 0.1, "high": 0.9, "step": -0.1}, "stages[0].params.sparsity.step: expected a number greater than 0, got -0.1"),
    ("stages.0.params.sparsity", {"low": 0.1, "high": 0.9, "step": 0.1, "log": True}, "a log range cannot have a step"),
    # NaN anywhere
    ("stages.0.params.sparsity", NAN, "stages[0].params.sparsity: NaN is not a usable value"),
    ("stages.0.params.sparsity", {"low": NAN, "high": 0.9}, "stages[0].params.sparsity.low: NaN is not a usable value"),
    ("search.trial_timeout_s", NAN, "search.trial_timeout_s: NaN is not a usable value"),
    ("resources.cpus", NAN, "resources.cpus: NaN is not a usable value"),
    ("task.max_tokens", NAN, "task.max_tokens: NaN is not a usable value"),
    # seeds a sampler cannot take
    ("search.seed", 1e23, "search.seed: expected an integer from 0 to 2147483647, got 1e+23"),
    ("search.seed", 10**23, "search.seed: expected an integer from 0 to 2147483647"),
    ("search.seed", -1, "search.seed: expected an integer from 0 to 2147483647, got -1"),
    # task options outside their ranges
    ("task.max_tokens", 0, "task.max_tokens: 0 is out of range; give a value >= 2"),
    ("task.stride", 0, "task.stride: 0 is out of range; give a value >= 1"),
    ("task.stride", 256, "task.stride: 256 is larger than task.context (128); give stride <= context"),
    ("task.batch_size", -1, "task.batch_size: -1 is out of range"),
    ("task", {"name": "arithmetic", "max_new_tokens": 0}, "task.max_new_tokens: 0 is out of range; give a value >= 1"),
    ("task", {"name": "arithmetic", "level": 9}, "task.level: 9 is out of range; give a value from 1 to 5"),
    ("task", {"name": "arithmetic", "prompt": "chatty"}, "task.prompt: 'chatty' is not one of 'auto', 'chat', 'fewshot'"),
    ("measures", {"latency": {"repeats": 0}}, "measures.latency.repeats: 0 is out of range"),
    ("task", {"name": "kv_retrieval", "positions": "begining"}, "task.positions: ['begining'] not known; use any of beginning, middle, end"),
    ("task", {"name": "kv_retrieval", "positions": 3}, "task.positions: expected names like 'beginning,end' or a list, got 3"),
    ("task", {"name": "qa", "dataset": "myqa", "answer": "words"}, "task.answer: 'words' is not one of 'number', 'text', 'auto'"),
    # a corpus or data file that does not exist
    ("task.corpus", "/no/such/corpus.txt", "task.corpus: '/no/such/corpus.txt' is neither a built-in corpus"),
    ("task", {"name": "multiple_choice", "dataset": "/no/such/file.jsonl"}, "task.dataset: '/no/such/file.jsonl' is not an existing file"),
    # an objective the pipeline does not produce
    ("objectives.0.metric", "acc", "objectives[0].metric: 'acc' would be missing from trials: neither task 'perplexity' (ppl, nll, "),
    ("objectives.0.metric", "peak_gpu_mb", "objectives[0].metric: 'peak_gpu_mb' would be missing from trials"),
    # a model that does not resolve
    ("model", "smollm3", "model: unknown model 'smollm3'; did you mean 'smollm2-135m'"),
    # description must be text
    ("description", {"a": [1, 2]}, "description: expected text, got dict"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r}"[:60] for p, v, _ in BAD])
def test_bad_pipelines_are_refused_naming_field_value_and_fix(path, value, message):
    with pytest.raises(ConfigError) as info:
        parse_spec(with_(path, value))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_an_objective_only_some_choices_report_is_refused():
    raw = with_("stages.1.choice.1", {"method": "cat", "params": {"calib_corpus": "wikitext2"}}) | {"objectives": [{"metric": "ppl"}, {"metric": "sqnr_db"}]}
    with pytest.raises(ConfigError, match="'sqnr_db' would be missing from trials: only some choices of stage 'stage1' report it"):
        parse_spec(raw)


def test_the_good_pipeline_and_an_objective_a_method_declares_are_accepted():
    parse_spec(GOOD)
    spec = parse_spec(with_("stages.1", {"method": "cat", "params": {"calib_corpus": "wikitext2"}}) | {"objectives": [{"metric": "ppl"}, {"metric": "sqnr_db", "direction": "maximize"}]})
    assert [o.metric for o in spec.objectives] == ["ppl", "sqnr_db"]
    # an integer range on a float parameter means the float range, not the integers 0 and 1
    spec = parse_spec(with_("stages.0.params.sparsity", {"low": 0, "high": 0.9}))
    assert spec.stages[0].options[0].params["sparsity"].integer is False


def test_pipeline_hash_ignores_description_and_resources_but_not_results():
    base = parse_spec(GOOD).pipeline_hash()
    assert parse_spec(with_("description", "reworded")).pipeline_hash() == base
    assert parse_spec(with_("resources", {"cpus": 2, "workers": 3})).pipeline_hash() == base
    assert parse_spec(with_("search.trial_timeout_s", 60)).pipeline_hash() == base
    assert parse_spec(with_("search.seed", 1)).pipeline_hash() != base
    assert parse_spec(with_("task.max_tokens", 1024)).pipeline_hash() != base
    # a study stored under the old hash (description and resources included) still resumes
    spec = parse_spec(GOOD)
    assert spec.legacy_pipeline_hash() != base and spec.matches_hash(spec.legacy_pipeline_hash())
    assert not spec.matches_hash(parse_spec(with_("search.seed", 1)).pipeline_hash())


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    path = tmp_path / "bomb.yaml"
    path.write_text("name: bomb\nmodel: tiny-llama\ndescription:\n  " + "\n  ".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="aliases expand to more than 100000 YAML nodes"):
        load_spec(path)
    assert time.perf_counter() - start < 5


def test_a_recursive_alias_and_an_oversized_file_are_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("name: loop\ndescription: &d [a, *d]\n")
    with pytest.raises(ConfigError, match="an alias refers to its own anchor"):
        load_spec(path)
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(GOOD) + "#" * MAX_PIPELINE_BYTES)
    with pytest.raises(ConfigError, match=f"a pipeline file may hold at most {MAX_PIPELINE_BYTES} bytes"):
        load_spec(big)


def test_ordinary_anchors_still_work(tmp_path):
    path = tmp_path / "anchors.yaml"
    path.write_text(yaml.safe_dump(GOOD).replace("task:", "task: &t", 1) + "")
    assert load_spec(path).task == "perplexity"


def test_model_that_does_not_load_here_is_refused(tmp_path):
    from paretolab.models import check_model

    empty = tmp_path / "my-model"
    empty.mkdir()
    with pytest.raises(ConfigError, match="model '.*my-model': the directory has no config.json"):
        check_model(str(empty))
    with pytest.raises(ConfigError, match="model: unknown model 'nope'"):
        check_model("nope")
    check_model("tiny-llama")


def _cli_refuses(tmp_path, raw, fragment):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(raw) if isinstance(raw, dict) else raw)
    home = tmp_path / "home"
    out = run_cli("run", str(path), "--home", str(home), "--no-progress", cwd=tmp_path, check=False, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paretolab: error: ") and fragment in lines[0], out.stderr
    assert "\x1b[" not in out.stderr  # no coloured Ray traceback
    assert not home.exists() and not (tmp_path / ".paretolab").exists()  # no store was written


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        ("stages.0.params.sparsity", "lots", "stages[0].params.sparsity: 'lots' is not a number"),
        ("task.stride", 0, "task.stride: 0 is out of range"),
        ("objectives.0.metric", "acc", "objectives[0].metric: 'acc' would be missing"),
    ],
)
def test_cli_refuses_with_rc_2_and_writes_no_store(tmp_path, path, value, fragment):
    _cli_refuses(tmp_path, with_(path, value), fragment)


def test_cli_refuses_a_model_directory_without_weights(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    _cli_refuses(tmp_path, with_("model", str(empty)), "the directory has no config.json")


def test_cli_refuses_an_alias_bomb_and_a_nan(tmp_path):
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
    )
    _cli_refuses(tmp_path, "name: bomb\nmodel: tiny-llama\ndescription:\n" + "".join("  " + line + "\n" for line in bomb.splitlines()), "aliases expand")
    text = yaml.safe_dump(with_("search.trial_timeout_s", 1.0)).replace("trial_timeout_s: 1.0", "trial_timeout_s: .nan")
    _cli_refuses(tmp_path, text, "search.trial_timeout_s: NaN is not a usable value")
    assert math.isnan(yaml.safe_load(text)["search"]["trial_timeout_s"])


def test_the_contract_suite_holds_methods_to_the_metrics_they_declare(tiny, ctx):
    from paretolab import Method
    from paretolab.testing import MethodContract

    class Undeclared(Method):
        name = "undeclared"

        def transform(self, subject, params, ctx):
            return subject

        def measure(self, subject, ctx):
            return {"size_bytes": 1.0}

    class Declared(Undeclared):
        metrics = ("size_bytes",)

    class Own(Undeclared):
        metrics = ("sqnr_db",)

        def measure(self, subject, ctx):
            return {"sqnr_db": 30.0}

    contract = MethodContract()
    with pytest.raises(AssertionError, match="'size_bytes' is reported but not declared: add it to Undeclared.metrics"):
        contract.test_reported_metrics_are_registered_and_finite(Undeclared(), tiny, {}, ctx)
    with pytest.raises(AssertionError, match="'size_bytes', which the platform measures"):  # declared or not, size is the platform's
        contract.test_reported_metrics_are_registered_and_finite(Declared(), tiny, {}, ctx)
    contract.test_reported_metrics_are_registered_and_finite(Own(), tiny, {}, ctx)
