"""End to end on a CUDA device: compiled Triton kernels vs their references, speculative equality,
every method's trial on the GPU, and a `gpus: 1` study whose model sits on `cuda`.

All tests here are `gpu`-marked: without CUDA they are reported as skipped ("needs CUDA");
benchmarks/gpu_check.sh runs them (with TRITON_INTERPRET=0, so the kernels compile for the GPU).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


def _compiled(kernel: object) -> bool:
    """True when a @triton.jit function was compiled (not wrapped for the CPU interpreter)."""
    return type(kernel).__name__ != "InterpretedFunction"


def _random_sparse(rows: int, cols: int, sparsity: float, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dense = torch.randn(rows, cols, generator=gen, device="cpu")
    n_zero = int(cols * sparsity)
    if n_zero:
        dense.scatter_(1, torch.rand(rows, cols, generator=gen, device="cpu").argsort(dim=1)[:, :n_zero], 0.0)
    return dense


@pytest.mark.parametrize("shape", [(576, 576), (1536, 576), (576, 1536), (4096, 4096), (45, 300)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("sparsity", [0.5, 0.7, 0.9])
def test_macko_triton_on_cuda_matches_reference(shape: tuple[int, int], sparsity: float) -> None:
    from paretolab.kernels import macko_triton
    from paretolab.kernels.macko import macko_encode, macko_spmv_ref

    assert _compiled(macko_triton._macko_spmv_kernel), "TRITON_INTERPRET is on: the kernel would not run on the GPU"
    dense = _random_sparse(*shape, sparsity, seed=shape[0] + int(100 * sparsity)).to(CUDA, torch.float16)
    fmt = macko_encode(dense)
    x = torch.randn(shape[1], device=CUDA, dtype=torch.float16)
    got = macko_triton.macko_spmv_triton(fmt, x)
    assert got.is_cuda
    torch.testing.assert_close(got.float(), macko_spmv_ref(fmt, x).float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), dense.float() @ x.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("shape", [(1, 9, 3, 2048, 64, 128), (1, 4, 2, 700, 48, 17), (2, 3, 3, 300, 64, 32)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_token_sparse_triton_on_cuda_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    from paretolab.kernels import token_sparse_triton
    from paretolab.kernels.token_sparse import window_scores_ref

    assert _compiled(token_sparse_triton._row_stats_kernel), "TRITON_INTERPRET is on: the kernel would not run on the GPU"
    b, h, hkv, length, d, w = shape
    gen = torch.Generator(device="cpu").manual_seed(length)
    q = torch.randn(b, h, length, d, generator=gen, device="cpu").to(CUDA, dtype)
    k = (2 * torch.randn(b, hkv, length, d, generator=gen, device="cpu")).to(CUDA, dtype)
    got = token_sparse_triton.window_scores_triton(q, k, w)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 1e-4}
    torch.testing.assert_close(got, window_scores_ref(q, k, w), **tol)


def test_speculative_decoding_on_cuda_equals_greedy() -> None:
    from paretolab.models import TinyLlama
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugins.speculative import Speculative, compare_with_greedy

    subject = TinyLlama(layers=4, hidden=64, seed=3).load().to(CUDA)
    subject = Speculative().transform(subject, {"draft": "self", "k": 3, "skip": 1, "calib_samples": 2, "calib_seq_len": 32},
                                      TrialContext(seed=0, workdir=Path("."), device=CUDA))
    gen = torch.Generator(device="cpu").manual_seed(0)
    prompts = [torch.randint(3, 250, (n,), generator=gen, device="cpu").tolist() for n in (5, 17, 40)]
    result = compare_with_greedy(subject, prompts, 24)
    assert result["spec_matches_greedy"] == 1.0 and subject.device.type == "cuda"


def test_every_method_runs_a_trial_on_cuda() -> None:
    """The device contract for real: each method's trial (cheap settings) on a CUDA model."""
    from paretolab.models import TinyLlama
    from paretolab.plugin_api.manager import registries
    from paretolab.plugins.moe.testbed import micro_moe
    from paretolab.records import StagePlan
    from paretolab.study.trial import run_trial
    from paretolab.testing import contract_settings
    from tests.plugins.test_device_contract import CHEAP, MOE_METHODS, NO_MODEL_TENSORS

    base = TinyLlama().load().to(CUDA)
    moe_base = micro_moe().to(CUDA)  # the MoE methods refuse a dense model (as on the CPU contract)
    failures = []
    for method in registries().methods:
        if method.name in NO_MODEL_TENSORS:
            continue
        params = {**method.defaults(), **CHEAP.get(method.name, {})}
        subject = moe_base if method.name in MOE_METHODS else base
        for number, settings in enumerate(contract_settings(method, None)):
            result = run_trial(subject, [StagePlan("s", method.name, params)], settings, number)
            if result.failed:
                failures.append(f"{method.name} / {settings.task}: {result.error}")
            elif not result.metrics.get("peak_gpu_mb", 0) > 0:
                failures.append(f"{method.name} / {settings.task}: no GPU memory used")
    assert not failures, "\n".join(failures)


def test_a_gpus_1_study_runs_its_model_on_cuda(tmp_path: Path) -> None:
    from tests.conftest import run_cli
    from tests.study.test_study import mlflow_trial_runs

    smoke = yaml.safe_load((Path(__file__).parents[2] / "pipelines" / "smoke.yaml").read_text())
    smoke.update(name="gpusmoke", resources={"cpus": 1, "gpus": 1}, search={**smoke["search"], "trials": 2})
    pipeline = tmp_path / "gpusmoke.yaml"
    pipeline.write_text(yaml.safe_dump(smoke))
    run_cli("run", str(pipeline), "--no-progress", cwd=tmp_path, timeout=300)
    runs = mlflow_trial_runs(tmp_path, "gpusmoke")
    assert len(runs) == 2
    for run in runs:
        assert run.data.params["info.device"] == "cuda:0", run.data.params
        assert run.data.metrics["peak_gpu_mb"] > 0 and math.isfinite(run.data.metrics["ppl"])
