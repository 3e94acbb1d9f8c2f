"""Checks that a written model computes what the trial's model did, and quiet saving and loading.

Every format an export writes (the dense directory, compressed-tensors, paretolab's own layout) is
reloaded and compared with the trial's model on one fixed prompt by :func:`logit_gap`.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import torch


def reload(folder: Path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A written model directory loaded as a user will: plain ``AutoModelForCausalLM.from_pretrained``."""
    from transformers import AutoModelForCausalLM

    with quiet():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()


def probe_logits(model: torch.nn.Module) -> torch.Tensor:
    """The model's logits (on the CPU, fp32) for 16 fixed token ids, on the model's own device."""
    vocab = int(getattr(model.config, "vocab_size", 256))
    ids = (torch.arange(16).remainder(vocab - 1) + 1).unsqueeze(0).to(next(model.parameters()).device)
    with torch.no_grad():
        return model(ids).logits.float().cpu()


def logit_gap(model: torch.nn.Module, reference: torch.Tensor) -> float:
    """Largest logit difference from ``reference`` (``probe_logits`` of the trial's model), relative to its largest logit."""
    return float((probe_logits(model) - reference).abs().max() / reference.abs().max().clamp_min(1e-12))


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No per-shard or per-layer progress bars (transformers' own, compressed-tensors' tqdm on stderr) or load reports."""
    from transformers.utils import logging as hf_logging

    bars, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
