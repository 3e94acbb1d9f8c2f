"""Exact GGUF block formats for round-to-nearest trials: the trial's own integer codes as Q4_0 / Q8_0.

llama.cpp's quantizer would re-quantize the trial's (already quantized) weights on its own grid —
Q4_0 puts ``d = max / -8``, where paretolab's RTN puts ``s = absmax / 7`` — so the engine would run
other weights than the trial measured. Here, instead, each matrix of the converter's F32 GGUF whose
every group of 32 (along the row, as llama.cpp's blocks run) sits on a symmetric grid of ``2^bits``
levels is written as blocks holding those very codes: Q4_0 (``code + 8`` in nibbles, first 16 values
low) for 4 bits, Q8_0 (int8) for 8. The one change is the block scale, stored as fp16 (the block
format's own), where the trial kept fp32: each value moves by at most ``|code| * |s - fp16(s)|``,
recorded as ``scale_rel_err`` (at most 2^-11 relative). The file is checked after writing: the
blocks, decoded by gguf-py's reference dequantizer, must give back codes x fp16 scales exactly.

A matrix not on such a grid stays F32; :func:`requantize` says how many went each way, and the
engine measure labels the trial's format exact only where every quantized matrix found its blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK = 32
BITS_TO_TYPE = {4: "Q4_0", 8: "Q8_0"}


@dataclass
class Requantized:
    """What :func:`requantize` wrote: matrices per block type, the largest scale rounding, the file."""

    path: Path
    blocks: dict[str, int]
    kept_f32: int
    scale_rel_err: float


def on_grid(w: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(codes int8 (rows, cols), scales fp32 (rows, cols / 32)) when every group of 32 along a row is ``q * absmax / qmax``; else None."""
    rows, cols = w.shape
    if cols % BLOCK:
        return None
    qmax = 2 ** (bits - 1) - 1
    g = w.astype(np.float32).reshape(rows, cols // BLOCK, BLOCK)
    s = np.abs(g).max(axis=-1, keepdims=True) / np.float32(qmax)
    safe = np.where(s > 0, s, np.float32(1))
    q = np.rint(g / safe)
    if q.min() < -qmax or q.max() > qmax or not np.allclose(q * safe, g, rtol=1e-5, atol=1e-7):
        return None
    return q.astype(np.int8).reshape(rows, cols), s.reshape(rows, -1)


def pack(codes: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """llama.cpp's Q4_0 (18 bytes a block) or Q8_0 (34 bytes) rows for ``codes`` with fp16 ``scales``."""
    rows, cols = codes.shape
    q = codes.reshape(rows, cols // BLOCK, BLOCK)
    d = scales.astype(np.float16).reshape(rows, cols // BLOCK, 1).view(np.uint8)  # (rows, nb, 2) little-endian
    if bits == 4:
        u = (q.astype(np.int16) + 8).astype(np.uint8)
        body = u[..., :16] | (u[..., 16:] << 4)
    elif bits == 8:
        body = q.view(np.uint8)
    else:
        raise ValueError(f"no exact GGUF block format for {bits}-bit codes")
    return np.concatenate([d, body], axis=-1).reshape(rows, -1)


def requantize(f32: Path, out: Path, bits: int) -> Requantized:
    """``f32`` (the converter's F32 GGUF) → ``out`` with every on-grid matrix as exact ``BITS_TO_TYPE[bits]`` blocks."""
    import gguf

    qtype = getattr(gguf.GGMLQuantizationType, BITS_TO_TYPE[bits])
    reader = gguf.GGUFReader(str(f32))
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(str(out), arch=arch, endianess=reader.endianess)
    blocks, kept, worst = 0, 0, 0.0
    tensors: list[tuple[str, np.ndarray, int]] = []
    for t in reader.tensors:
        data, ttype = np.asarray(t.data), int(t.tensor_type)
        if ttype == int(gguf.GGMLQuantizationType.F32) and data.ndim == 2 and not t.name.startswith(("token_embd", "output.")):
            grid = on_grid(data, bits)
            if grid is not None:
                codes, scales = grid
                packed = pack(codes, scales, bits)
                back = gguf.quants.dequantize(packed, qtype).reshape(data.shape)
                expect = (codes.reshape(*scales.shape, BLOCK).astype(np.float32)
                          * scales.astype(np.float16).astype(np.float32)[..., None]).reshape(data.shape)
                if not np.array_equal(back, expect):
                    raise AssertionError(f"{t.name}: {BITS_TO_TYPE[bits]} blocks do not decode to the codes written")
                nz = scales > 0
                if nz.any():
                    worst = max(worst, float(np.max(np.abs(scales.astype(np.float16).astype(np.float32)[nz] - scales[nz]) / scales[nz])))
                tensors.append((t.name, packed, int(qtype)))
                blocks += 1
                continue
            kept += 1
        tensors.append((t.name, data, ttype))
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if field.name == gguf.Keys.General.FILE_TYPE and blocks:
            value = int(gguf.LlamaFileType.MOSTLY_Q4_0 if bits == 4 else gguf.LlamaFileType.MOSTLY_Q8_0)
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    for name, data, ttype in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, gguf.GGMLQuantizationType(ttype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return Requantized(path=out, blocks={BITS_TO_TYPE[bits]: blocks}, kept_f32=kept, scale_rel_err=worst)
