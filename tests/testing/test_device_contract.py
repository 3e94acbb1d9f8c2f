"""Every task and measure makes its tensors on the model's device (the contract's meta check, no method)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.options import parse_options
from paretolab.testing import tensors_default_to

GSM8K_ROWS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
    {"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"},
]
FILES: dict[str, list[dict[str, Any]]] = {  # small data files for the data-backed tasks
    "mc.jsonl": [{"query": "The sky is", "choices": ["blue", "loud"], "gold": 0}],
    "gsm8k.jsonl": GSM8K_ROWS,
    "kv.jsonl": [{"context": "key 12 has value 345. key 9 has value 88. The value of key 9 is", "answer": "88"}],
}
# cheap options per task
TASKS: dict[str, dict[str, Any]] = {
    "perplexity": {"max_tokens": 256, "context": 64, "stride": 32},
    "multiple_choice": {"dataset": "{tmp}/mc.jsonl", "limit": 1},
    "arithmetic": {"limit": 2, "max_new_tokens": 4},
    "gsm8k": {"dataset": "{tmp}/gsm8k.jsonl", "limit": 1, "max_new_tokens": 4, "shots": 1},
    "qa": {"dataset": "{tmp}/gsm8k.jsonl", "limit": 1, "max_new_tokens": 4, "shots": 1},
    "kv_retrieval": {"path": "{tmp}/kv.jsonl", "limit": 1, "max_new_tokens": 4},
    "assoc_recall": {"examples": 2, "batch_size": 2},
    "lambada": {"source": "builtin", "limit": 2},
}
MEASURES: dict[str, dict[str, Any]] = {
    "act_memory": {"seq_len": 32, "rounds": 1},
    "latency": {"prompt_tokens": 16, "new_tokens": 2, "repeats": 1, "warmup": 0},
    "depth_probe": {"max_tokens": 128, "seq_len": 64},
    "hidden_var": {"max_tokens": 128, "seq_len": 64},
    "kv_cache": {"tokens": 8},
    "early_exit": {"max_tokens": 128, "seq_len": 64, "draft_k": 2, "prompts": 1, "prompt_tokens": 8, "new_tokens": 4},
    "forgetting": {"corpus": "pydoc", "max_tokens": 128, "seq_len": 64, "task_tokens": 128, "mc_limit": 0, "acc_problems": 1, "acc_new_tokens": 2},
    "stage_energy": {},
    "ffn_sparsity": {"max_tokens": 128, "seq_len": 64, "prompt_tokens": 8, "new_tokens": 2, "repeats": 1, "max_repeats": 1},
    "expert_memory": {},
}
MOE_MEASURES = frozenset({"expert_memory"})  # measured on a random micro MoE (they refuse a dense model)
# tasks that score what a method of one kind set up (a router, a coder, a tabular, sequence or pair learner) and refuse a bare
# model: the contract suite runs them under every method of that kind (contract_settings), on the model's device
METHOD_BOUND_TASKS = {"mc_routing": "routing", "compression": "coding", "tabular": "tabular", "sequence": "sequence",
                    "paired_retrieval": "paired_retrieval"}


def test_every_task_and_measure_is_listed() -> None:
    regs = registries()
    assert {t.name for t in regs.tasks} - set(METHOD_BOUND_TASKS) <= set(TASKS), "give the new task cheap options in TASKS"
    assert {m.name for m in regs.measures} - {"params", "size"} - OUT_OF_PROCESS <= set(MEASURES), "give the new measure cheap options in MEASURES"


@pytest.mark.parametrize(("task", "kind"), sorted(METHOD_BOUND_TASKS.items()))
def test_method_bound_tasks_run_in_the_contract_of_their_kind(task: str, kind: str) -> None:
    from paretolab.testing import contract_settings

    methods = [m for m in registries().methods if m.kind == kind]
    assert methods, f"no method of kind {kind!r} runs task {task!r} in the contract"
    for method in methods:
        assert task in {s.task for s in contract_settings(method, None)}, f"{method.name}: the contract does not run {task!r}"


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_makes_tensors_on_the_model_device(name: str, tiny, ctx, tmp_path) -> None:
    for file, rows in FILES.items():
        (tmp_path / file).write_text("".join(json.dumps(row) + "\n" for row in rows))
    task = registries().tasks.get(name)
    given = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v for k, v in TASKS[name].items()}
    options = parse_options(task.options, given, where="task")
    with tensors_default_to("meta"):
        metrics = task.evaluate(tiny, options, ctx)
    assert metrics


# Measures whose model runs in another process (the engine measure writes the trial's model to disk and serves it from
# the engine's own environment): no tensor of theirs is made here; tests/measure/test_engine_* hold them to their contract.
OUT_OF_PROCESS = {"engine"}


@pytest.mark.parametrize("name", sorted(m.name for m in registries().measures if m.name not in OUT_OF_PROCESS))
def test_measure_makes_tensors_on_the_model_device(name: str, ctx) -> None:
    from paretolab.models import TinyLlama

    tiny = TinyLlama(layers=3).load()  # the depth fit needs three layers
    if name in MOE_MEASURES:
        from paretolab.plugins.moe.testbed import micro_moe

        tiny = micro_moe()
    measure = registries().measures.get(name)
    options = parse_options(measure.options, MEASURES.get(name, {}), where=f"measures.{name}")
    with tensors_default_to("meta"):
        metrics = measure.measure(tiny, options, ctx)
    assert metrics

