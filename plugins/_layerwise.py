"""Calibration plumbing (the draw itself is public: :mod:`paretolab.plugin_api.calibration`) shared by the cat, catq, psumquant, layerdrop and depth_probe plugins.

Llama-style decoder stacks (``model.model.layers``) only; every function says so in its error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.plugin_api.calibration import CALIB_DEFAULTS, calib_seed, calibration_ids  # noqa: F401 (the plugins' old import path)
from paretolab.plugin_api.subject import Subject


def heldout_ids(subject: Subject, ctx: TrialContext, params: dict[str, Any], *, tokens: int) -> torch.Tensor:
    """(M, L) windows of the calibration corpus sharing no token with :func:`calibration_ids`, at least ``tokens`` in all."""
    from paretolab.data import heldout_calibration_ids

    n, length = int(params.get("calib_samples", 8)), int(params.get("calib_seq_len", 256))
    corpus = str(params.get("calib_corpus", "pydoc"))
    windows = max(1, -(-tokens // length))
    ids = heldout_calibration_ids(subject.tokenizer, corpus=corpus, n_samples=n, seq_len=length, seed=calib_seed(ctx, params), n_heldout=windows)
    return ids.to(subject.device)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder blocks of a Llama-style causal LM (``model.model.layers``)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(f"{type(model).__name__} has no model.layers ModuleList; these methods support Llama-style decoders only")
    return layers


@contextmanager
def linear_inputs(modules: dict[str, torch.nn.Module], on_input: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """While active, call ``on_input(name, x)`` with each module's input flattened to (tokens, in_features)."""

    def hook(name: str) -> Callable[..., None]:
        def record(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach()
            on_input(name, x.reshape(-1, x.shape[-1]))

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in modules.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def run_model(model: torch.nn.Module, ids: torch.Tensor, *, batch_size: int = 4) -> None:
    """Forward ``ids`` through ``model`` in batches, no grad, no cache (for hooks to observe)."""
    with torch.no_grad():
        for batch in ids.split(batch_size):
            model(input_ids=batch, use_cache=False)


class _Stop(Exception):
    pass


def first_layer_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    """(hidden (N, L, D), kwargs) that the first decoder layer receives for ``ids``: the start of layer-wise passes."""
    layers = decoder_layers(model)
    seen: dict[str, Any] = {}

    def grab(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen["hidden"] = args[0] if args else kwargs.pop("hidden_states")
        seen["kwargs"] = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache", "past_key_values", "use_cache")}
        raise _Stop

    handle = layers[0].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen["hidden"].detach(), seen["kwargs"]


def select_kwargs(kwargs: dict[str, Any], index: slice | torch.Tensor, batch: int) -> dict[str, Any]:
    """``kwargs`` with every tensor whose leading dim is the calibration batch indexed by ``index``."""

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == batch and batch > 1:
            return value[index]
        if isinstance(value, tuple):
            return tuple(cut(v) for v in value)
        return value

    return {k: cut(v) for k, v in kwargs.items()}


def run_layer(layer: torch.nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """One decoder layer's output hidden states (whatever tuple/tensor convention the layer uses)."""
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def layer_outputs(layer: torch.nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any], *, batch_size: int = 4) -> torch.Tensor:
    """``run_layer`` over the calibration batch in chunks, no grad."""
    n = hidden.shape[0]
    outs = []
    with torch.no_grad():
        for start in range(0, n, batch_size):
            index = slice(start, min(start + batch_size, n))
            outs.append(run_layer(layer, hidden[index], select_kwargs(kwargs, index, n)))
    return torch.cat(outs)
