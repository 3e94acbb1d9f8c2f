"""Every registered method makes its tensors on the model's device (the contract's meta check, cheap params)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from paretolab.plugin_api.manager import registries
from paretolab.testing import check_tensor_devices

CALIB = {"calib_samples": 2, "calib_seq_len": 32}
# Small settings per method so the check runs in seconds; the defaults fill in the rest.
CHEAP: dict[str, dict[str, Any]] = {
    "cat": {**CALIB, "block": 16, "sqnr_tokens": 16},
    "catq": {**CALIB, "steps": 2, "group_size": 32},
    "layerdrop": {**CALIB, "k": 1},
    "macko": {**CALIB},
    "wanda": {**CALIB},
    "psumquant": {**CALIB, "tile": 32, "fit_tokens": 32, "sqnr_tokens": 16},
    "parallel_probe": {"n_branches": 2, "questions_per_batch": 2},
    "self_consistency": {"n_branches": 2, "questions_per_batch": 2},
    "select_to_think": {"large": "tiny-llama", "calib_examples": 2},
    "large_only": {"large": "tiny-llama"},
    "s2t_self_consistency": {"n_branches": 2},
    "speculative": {"draft": "self", "k": 2, "skip": 1, "prompts": 1, "new_tokens": 4, "prompt_tokens": 16, **CALIB},
    "token_sparse_attention": {"window": 4, "min_tokens": 8, "kernel_size": 3},
    "kalman_attention": {"chunk": 4},
    "gla": {"chunk": 4},
    "rtn": {"group_size": 32},
    # the incumbents run their libraries (make incumbents): groups the tiny model's 64 columns hold, few iterations
    **{name: {**CALIB, "group_size": 32} for name in ("gptq", "awq")},
    "autoround": {**CALIB, "group_size": 32, "iters": 2},
    "hqq": {"group_size": 32},
    # the tiny model is its own teacher (same tokenizer); a few windows of the repository's README
    "distill_kd": {"teacher": "tiny-llama", "tokens": 64, "seq_len": 16, "batch": 2, "top_k": 4, "corpus": str(Path(__file__).parents[2] / "README.md")},
    "distill_sft": {"teacher": "tiny-llama", "tokens": 48, "seq_len": 16, "batch": 2, "prompt_tokens": 4, "new_tokens": 8,
                    "corpus": str(Path(__file__).parents[2] / "README.md")},
    **{name: {"calib_corpus": str(Path(__file__).parents[2] / "README.md"), "calib_samples": 2, "calib_seq_len": 32}
       for name in ("rfid_moe", "svd_moe", "puzzle_moe", "expert_drop", "expert_average", "msmoe")},
    "absmean_ternary": {"group_size": 32},
    "rl": {"steps": 1, "prompts": 1, "group": 2, "max_new_tokens": 3, "eval_problems": 2},
    "bittokens": {"eval_problems": 4},
    "digit_tokens": {"group": 1, "eval_problems": 4},  # tiny-llama's byte vocabulary is too small for group 3
    "mtpc": {"steps": 1, "batch": 8, "gen_prompts": 1, "gen_prompt_tokens": 8, "gen_tokens": 8, "prompts": 1, "prompt_tokens": 8, "new_tokens": 4,
             "k": 2, "states": 2, "distill_corpus": "numeric-val", "prompt_corpus": "numeric-val"},
    # a few steps on a small text that is not the task's pydoc corpus
    # tabular learners train for real on the contract's 400-row set: a few members, trials and epochs
    "tabpack": {"members": 3, "epochs": 2, "patience": 1},
    "tuned_mlp": {"trials": 2, "epochs": 2, "patience": 1},
    "tabm": {"k": 2, "epochs": 2, "patience": 1},
    "hgb": {"max_iter": 10},
    # sequence networks train for real on the contract's 120 short sequences: small, one epoch, short timings
    "ltc": {"units": 4, "unfolds": 2, "epochs": 1, "timing_s": 0.2},
    "coda": {"units": 4, "latent": 2, "epochs": 1, "timing_s": 0.2},
    # APM's analog distils on the contract's 300 generated pairs: few pairs, few matching steps
    "apm": {"pairs": 20, "steps": 5},
    "mtt": {"pairs": 20, "steps": 3, "expert_epochs": 4, "unroll": 2},
    "random_pairs": {"pairs": 20},
    # the learned selector trains for real (two straight-through steps through the tiny model, on the builtin rows)
    "omnisift_text": {"steps": 2, "batch": 2, "train_context": 32, "hidden": 8},
    "train": {"tokens": 256, "seq_len": 32, "batch": 4, "eval_every": 1, "eval_tokens": 128, "corpus": str(Path(__file__).parents[2] / "README.md")},
}


# extra runs of one method with other settings, for code paths the defaults do not reach
VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("cat-hadamard", "cat", {**CHEAP["cat"], "transform": "hadamard"}),
]
# methods that need an MoE model run on a random micro MoE (paretolab.plugins.moe.testbed.micro_moe) instead of tiny-llama
MOE_METHODS = frozenset({"rfid_moe", "svd_moe", "puzzle_moe", "expert_drop", "expert_average", "msmoe"})
# tokenizer methods make no model tensors and need a real BPE tokenizer (incremental_bpe's own tests use SmolLM2's)
NO_MODEL_TENSORS = {"incremental_bpe"}
# methods whose library runs in the incumbents' environment: run by make test-incumbents (marker incumbents), which builds it
INCUMBENTS = frozenset({"gptq", "awq", "sparsegpt", "autoround", "hqq"})
# llama.cpp's converter refuses tiny-llama's byte tokenizer: kquant's device check is its contract's, in tests/plugins/test_kquant.py
OWN_SUBJECT = {"kquant": "llama.cpp's GGUF converter refuses tiny-llama's byte tokenizer; kquant's contract (tests/plugins/test_kquant.py) "
                         "runs this check on a model with SmolLM2's tokenizer"}


def _cases() -> list[Any]:
    def marks(name: str) -> list[Any]:
        if name in NO_MODEL_TENSORS:
            return [pytest.mark.skip(reason="tokenizer method: no model tensors")]
        if name in OWN_SUBJECT:
            return [pytest.mark.skip(reason=OWN_SUBJECT[name])]
        return [pytest.mark.incumbents] if name in INCUMBENTS else []

    cases = [pytest.param(m.name, CHEAP.get(m.name, {}), id=m.name, marks=marks(m.name))
             for m in sorted(registries().methods, key=lambda m: m.name)]
    return cases + [pytest.param(method, params, id=case) for case, method, params in VARIANTS]


@pytest.mark.parametrize(("method_name", "params"), _cases())
def test_method_makes_tensors_on_the_model_device(method_name: str, params: dict[str, Any], tiny) -> None:
    method = registries().methods.get(method_name)
    if method_name in MOE_METHODS:
        from paretolab.plugins.moe.testbed import micro_moe

        tiny = micro_moe()
    check_tensor_devices(method, tiny, {**method.defaults(), **params})
