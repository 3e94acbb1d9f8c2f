"""Calibration data for a method, the same for every calibrated method of a study: the public helper plugin authors use.

A calibrated method (GPTQ, AWQ, Wanda, CAT, ...) declares its ``calib_*`` parameters and draws its tokens here, so that
every such method in a pipeline sees the same corpus, the same number of tokens and the same named draws (``calib_seed``
in a pipeline pairs trials across methods; three named draws make replicates a claim can name).
"""

from __future__ import annotations

from typing import Any

import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.subject import Subject

CALIB_DEFAULTS: dict[str, Any] = {"calib_corpus": "pydoc", "calib_samples": 8, "calib_seq_len": 256, "calib_seed": -1}
HESSIAN_CALIB_DEFAULTS: dict[str, Any] = {**CALIB_DEFAULTS, "calib_samples": 32}
"""For a method that fits a Hessian or solves per layer (GPTQ, AWQ, SparseGPT, AutoRound, a plugin's own): 32 windows of
256 tokens. 8 x 256 tokens of one manual is too few for such a method: a plugin author's GPTQ-style method overfit them and
lost to round-to-nearest, and won 3.2x with 32 windows. A pipeline comparing calibrated methods names the same
``calib_samples`` for all of them (the draw is only the same when the numbers are)."""


def calib_seed(ctx: TrialContext, params: dict[str, Any]) -> int:
    """The seed of a trial's calibration draw: ``calib_seed`` where it is >= 0 (a draw named in a pipeline, which pairs
    trials across methods and makes draws replicates a claim can name), else the trial's own seed."""
    seed = int(params.get("calib_seed", -1))
    return seed if seed >= 0 else ctx.seed


def calibration_ids(subject: Subject, ctx: TrialContext, params: dict[str, Any], *, method: str) -> torch.Tensor:
    """(N, L) calibration ids from the ``calib_*`` params of ``method`` (defaults in CALIB_DEFAULTS), drawn by :func:`calib_seed`."""
    n, length = int(params.get("calib_samples", 8)), int(params.get("calib_seq_len", 256))
    if n < 1 or length < 2:
        raise ConfigError(f"{method}.calib_samples must be >= 1 and {method}.calib_seq_len >= 2, got {n} and {length}")
    corpus = str(params.get("calib_corpus", "pydoc"))
    return ctx.calibration_draw(subject.tokenizer, corpus=corpus, n_samples=n, seq_len=length, seed=calib_seed(ctx, params)).to(subject.device)
