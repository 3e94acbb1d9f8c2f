"""The contract's checks of what a method claims about its cost and its changes (issue 69's cost cheats), below the measures.

What a model holds (``held_bytes``) and what a trial can observe of a subject (``observable_state``); how many
bits a weight's actual values need in the grouping its storage record declares (``needed_bits``) and where
``size_bytes`` reports fewer (``size_shortfalls``); values of a parameter far apart in its distribution
(``candidate_values``) and which parameters leave the result unchanged between them (``parameter_effects``).
``paretolab.testing.MethodContract`` runs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import torch

from paretolab.errors import ConfigError
from paretolab.plugin_api.storage import DENSE, TensorStorage, unique_parameters

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.method import Method
    from paretolab.plugin_api.subject import Subject

LOSSLESS_TOLERANCE = 1e-4  # relative to the base logits' largest magnitude: a 16-bit round trip, not a 4-bit one
PARAMETER_KINDS = ("weights", "architecture")  # kinds whose parameters act in transform (the others' act as it runs)


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every distinct tensor the model keeps (parameters and buffers, shared ones once)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        if tensor is not None:
            seen[tensor.data_ptr()] = max(seen.get(tensor.data_ptr(), 0), tensor.numel() * tensor.element_size())
    return sum(seen.values())


def observable_state(subject: Subject) -> tuple[Any, ...]:
    """What a method may change: the model's output, its modules and config, the generator, the tokenizer, the storage records, the training hooks."""
    config = subject.model.config.to_dict() if hasattr(subject.model, "config") else {}
    modules = tuple(type(m).__name__ for m in subject.model.modules())
    hooks = tuple((type(h).__name__, h.method) for h in subject.training.hooks) if subject.training is not None else ()
    router = id(subject.router) if subject.router is not None else None
    info = tuple(sorted(k for k in subject.info if k in ("coder", "learner")))  # a coding or tabular method's choice
    return (config, modules, id(subject.generator) if subject.generator is not None else None, id(subject.tokenizer), dict(subject.storage), hooks, router, info)


def output_change(before: torch.Tensor, after: torch.Tensor) -> float:
    """The largest change of the logits, relative to the base's largest magnitude (infinite when the shape changed)."""
    if after.shape != before.shape:
        return math.inf
    return float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))


def needed_bits(tensor: torch.Tensor, storage: TensorStorage) -> tuple[int, int, int]:
    """The fewest bits a tensor's actual values need in ``storage``'s grouping: ``ceil(log2(distinct))`` per element of
    each group (its groups of ``group_size`` along a row, or over the flattened tensor for ``flat_groups``; a whole row
    where it declares none), counting only the kept entries of a sparse tensor. Returns (bits, group length, most
    distinct values in one group)."""
    values = tensor.detach().reshape(1, -1) if tensor.dim() < 2 or storage.flat_groups else tensor.detach().reshape(-1, tensor.shape[-1])
    cols = values.shape[1]
    group = min(storage.group_size, cols) if storage.group_size and storage.group_size > 0 else cols
    pad = (-cols) % group
    valid = values != 0 if storage.sparse else torch.ones_like(values, dtype=torch.bool)
    values = torch.nn.functional.pad(values.float(), (0, pad)).reshape(-1, group)
    valid = torch.nn.functional.pad(valid, (0, pad)).reshape(-1, group)
    ordered = torch.where(valid, values, torch.full_like(values, math.inf)).sort(dim=1).values
    finite = torch.isfinite(ordered)
    distinct = finite[:, 0].long() + ((ordered[:, 1:] != ordered[:, :-1]) & finite[:, 1:]).sum(dim=1)
    per_value = torch.ceil(torch.log2(distinct.clamp_min(1).double())).long()
    return int((valid.sum(dim=1) * per_value).sum()), group, int(distinct.max()) if distinct.numel() else 0


def size_shortfalls(subject: Subject) -> tuple[list[str], int, int]:
    """Where ``size_bytes`` reports fewer bytes than a tensor's distinct values per group need (see ``needed_bits``).

    Tensors without a storage record are counted dense in their dtype, which always holds their values. Returns the
    shortfalls (one line per tensor), and the model's reported bytes and the least it may report.
    """
    short, reported, needed = [], 0, 0
    for name, tensor in unique_parameters(subject.model):
        storage = subject.storage_of(name)
        has = storage.nbytes(tensor)
        reported += has
        if storage == DENSE:
            needed += has
            continue
        bits, group, most = needed_bits(tensor, storage)
        need = math.ceil(bits / 8)
        needed += need
        if has < need:
            short.append(f"{name}: reports {has} bytes but its values need at least {need} (up to {most} distinct values per group "
                         f"of {group}: {math.ceil(math.log2(max(most, 1)))} bits each, {storage.value_bits} declared)")
    formats = sum(s.stored_bytes or 0 for n, s in subject.current_storage().items() if n.startswith("format:"))
    return short, reported + formats, needed + formats


def candidate_values(dist: optuna.distributions.BaseDistribution, current: Any = None) -> list[Any]:
    """Values of a parameter to compare, the two farthest apart first: a categorical's first and last choices, then the
    others (one may be an alias of the first); a float's ends; an integer's low end and the next value that at least
    doubles it (a budget's far end would only be slow); then the value in use."""
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        values = [dist.choices[0], dist.choices[-1], *dist.choices[1:-1]]
    elif isinstance(dist, optuna.distributions.FloatDistribution):
        values = [dist.low, dist.high, current]
    elif isinstance(dist, optuna.distributions.IntDistribution):
        values = [dist.low, min(dist.high, max(dist.low + (dist.step or 1), 2 * dist.low)), current, dist.high]
    else:
        values = []
    return list(dict.fromkeys(v for v in values if v is not None))


def weights_of(subject: Subject) -> dict[str, torch.Tensor]:
    """The model's state (parameters and buffers), detached."""
    return {k: v.detach() for k, v in subject.model.state_dict().items()}


def same_model(a: tuple[dict[str, torch.Tensor], torch.Tensor], b: tuple[dict[str, torch.Tensor], torch.Tensor]) -> bool:
    """Whether two (weights, logits) results are equal: the same tensors under the same names, and the same output."""
    (wa, la), (wb, lb) = a, b
    same_weights = wa.keys() == wb.keys() and all(wa[k].shape == wb[k].shape and torch.equal(wa[k], wb[k]) for k in wa)
    return same_weights and la.shape == lb.shape and torch.equal(la, lb)


def parameter_effects(method: Method, subject: Subject, params: dict[str, Any], ctx: TrialContext,
                      result_of: Callable[[Subject], tuple[dict[str, torch.Tensor], torch.Tensor, int]]) -> list[str]:
    """What the contract's parameter check finds wrong: a parameter whose values far apart give the same weights and
    outputs (the others as ``params``, then at the method's defaults: one may act only beside another's value), and a
    result that reports fewer bytes than its values need. ``result_of`` gives (weights, logits, size_bytes)."""
    space, failures = method.search_space(), []
    at_defaults = {k: v for k, v in method.defaults().items() if k in space}
    bases = [dict(params)] + ([{**params, **at_defaults}] if any(params.get(k) != v for k, v in at_defaults.items()) else [])
    for key, dist in space.items():
        if key in method.inert_params:
            continue
        for base in bases:
            seen: list[tuple[Any, tuple[dict[str, torch.Tensor], torch.Tensor, int]]] = []
            for value in candidate_values(dist, base.get(key)):
                try:
                    out = method.transform(subject.copy(), {**base, key: value}, ctx)
                except ConfigError:
                    continue  # a value this model cannot take (more key/value heads than it has)
                result = result_of(out)
                short, reported, needed = size_shortfalls(out)
                if short:
                    failures.append(f"at {key}={value!r} it reports {reported} bytes but its weights need at least {needed} "
                                    f"(distinct values per group): {short[0]}")
                if any(not same_model(r[:2], result[:2]) for _, r in seen):
                    break
                seen.append((value, result))
            else:
                continue  # no two values differed at this base: try the next
            break  # an effect was seen
        else:
            if len(seen) >= 2:
                (v0, r0), (v1, r1) = seen[0], seen[1]
                sizes = f" (while reporting {r0[2]} and {r1[2]} bytes)" if r0[2] != r1[2] else ""
                failures.append(f"{key}={v0!r} and {key}={v1!r} gave the same weights{sizes}: the method ignores {key!r} "
                                f"(if it cannot matter on a small model, say why in {type(method).__name__}.inert_params)")
    return list(dict.fromkeys(failures))


def check_artifact_sizes(method: Method, out: Subject) -> None:
    """A method sized by another library's artefact: the artefact exists, and holds at least the bytes reported for the
    tensors it stores (a size with no file behind it fails); each tensor's exact bytes are the plugin's own test."""
    artefact = out.info.get(f"{method.name}_artifact")
    assert artefact, f"{method.name} declares sized_by_artifact but left no subject.info[{method.name + '_artifact'!r}]"
    path = Path(artefact)
    assert path.exists(), f"{method.name}'s artefact {path} does not exist after its transform"
    on_disk = sum(f.stat().st_size for f in ([path] if path.is_file() else path.rglob("*")) if f.is_file())
    reported = sum(record.stored_bytes for record in out.current_storage().values() if record.stored_bytes is not None)
    assert reported > 0, f"{method.name} reports no tensor's stored bytes"
    assert reported <= on_disk, f"{method.name} reports {reported} stored bytes but its artefact holds {on_disk}"
