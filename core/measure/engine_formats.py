"""What an engine serves for a trial, and its label: the trial's weights counted by kind, the dense
Hugging Face directory, and (vLLM) the compressed-tensors checkpoint of integer-group trials.

A label is never silent: a trial whose stored format the engine cannot run as such is served as
its dense equivalent and says so (:data:`DENSE_LABEL`); a checkpoint not written says why.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import torch

from paretolab.data import compressed
from paretolab.plugin_api.external import dense_copy, write_hf  # noqa: F401 (the engine measure's writer is the hand-over's)
from paretolab.plugin_api.storage import unique_parameters
from paretolab.plugin_api.subject import Subject

DENSE_LABEL = "dense equivalent (no engine kernel: dense cost)"


def weight_kinds(subject: Subject) -> Counter[str]:
    """How the trial's matrices are stored, counted: ``dense``, ``sparse``, ``int4 g32``, ``format:NAME`` ..."""
    kinds: Counter[str] = Counter()
    for name, tensor in unique_parameters(subject.model):
        if tensor.dim() < 2:
            continue
        st = subject.storage_of(name)
        if st.sparse:
            kinds["sparse"] += 1
        elif st.value_bits is None:
            kinds["dense"] += 1
        else:
            group = "row" if st.group_size in (None, tensor.shape[-1]) else f"g{st.group_size}"
            kinds[f"int{st.value_bits:g} {group}{' flat' if st.flat_groups else ''}"] += 1
    for name, st in subject.current_storage().items():
        if name.startswith("format:"):
            kinds[name] += 1
    return kinds


def served_label(kinds: Counter[str], dense_type: str) -> str:
    """What the engine serves and whether it is the trial's own format (see the module doc)."""
    t = dense_type.upper()
    return t if set(kinds) <= {"dense"} else f"{t} {DENSE_LABEL}"


def exact_bits(kinds: Counter[str]) -> int | None:
    """4 or 8 where every quantized matrix is RTN-style ``int4 g32`` / ``int8 g32`` (Q4_0 / Q8_0 exist for them), else None."""
    quantized = set(kinds) - {"dense"}
    for bits in (4, 8):
        if quantized == {f"int{bits} g32"}:
            return bits
    return None


def int_groups(subject: Subject) -> dict[str, tuple[int, int]] | str:
    """Each quantized matrix's (bits, group size) where all are integer groups along rows, else why not (one line)."""
    out: dict[str, tuple[int, int]] = {}
    for name, tensor in unique_parameters(subject.model):
        st = subject.storage_of(name)
        if tensor.dim() < 2 or (st.value_bits is None and not st.sparse):
            continue
        if st.sparse or st.value_bits is None:
            return f"{name} is sparse"
        group = st.group_size or tensor.shape[-1]
        if st.value_bits != int(st.value_bits) or (st.flat_groups and tensor.shape[-1] % group):
            return f"{name}: {st.value_bits:g} bits in groups of {group}{' over the flattened tensor' if st.flat_groups else ''}"
        out[name] = (int(st.value_bits), int(group))
    return out


def compressed_checkpoint(subject: Subject, kinds: Counter[str], out: Path, info: dict[str, Any], e: str) -> Path | None:
    """The trial as a compressed-tensors checkpoint (the export's writer, :mod:`paretolab.data.compressed`), for vLLM; None and a label otherwise.

    Only where every stored matrix is dense or integer groups (RTN and the like): sparse and format trials
    keep their "no engine kernel: dense cost" label. Where the checkpoint is not written (a scheme
    compressed-tensors refuses, a reload that does not reproduce the trial), the label says why.
    """
    quantized = set(kinds) - {"dense"}
    if not quantized or any(not k.startswith("int") for k in quantized):
        return None
    groups = int_groups(subject)
    why: list[str] = [groups] if isinstance(groups, str) else []
    if not compressed.available():
        why.append("compressed-tensors is not installed in paretolab's environment (pip install compressed-tensors)")
    if not why and isinstance(groups, dict) and compressed.write(dense_copy(subject.model).to("cpu", torch.float32), groups, out, subject.tokenizer, why):
        schemes = ", ".join(sorted(quantized))
        info[f"{e}_format"] = f"compressed-tensors {compressed.FORMAT} ({schemes}: the trial's codes and scales; other tensors F32)"
        return out
    info[f"{e}_format"] = f"{info[f'{e}_format']}: no compressed-tensors checkpoint ({'; '.join(why)})"
    return None
