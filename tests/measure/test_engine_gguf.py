"""Exact Q4_0 / Q8_0 blocks from RTN codes: llama.cpp's layout (decoded by gguf-py's reference), grids refused when not exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paretolab.measure.engine_gguf import on_grid, pack, requantize
from paretolab.plugins.baselines import quantize_rtn


def rtn(rows: int, cols: int, bits: int, seed: int = 0) -> np.ndarray:
    w = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    return quantize_rtn(w, bits, 32).numpy()


@pytest.mark.parametrize(("bits", "qtype"), [(4, "Q4_0"), (8, "Q8_0")])
def test_blocks_decode_to_the_trials_codes(bits: int, qtype: str) -> None:
    import gguf

    w = rtn(8, 96, bits)
    codes, scales = on_grid(w, bits)
    assert np.abs(codes).max() <= 2 ** (bits - 1) - 1
    packed = pack(codes, scales, bits)
    assert packed.shape == (8, 3 * (18 if bits == 4 else 34))
    back = gguf.quants.dequantize(packed, getattr(gguf.GGMLQuantizationType, qtype)).reshape(w.shape)
    # the codes are the trial's; only the scale is rounded to fp16 (<= 2^-11 relative)
    assert np.allclose(back, w, rtol=2 ** -10, atol=0)
    assert np.array_equal(np.rint(back / np.repeat(scales.astype(np.float16).astype(np.float32), 32, axis=1)), codes)


def test_off_grid_is_refused() -> None:
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    assert on_grid(w, 4) is None and on_grid(w, 8) is None
    assert on_grid(rtn(4, 64, 8), 4) is None  # 8-bit codes are not a 4-bit grid
    assert on_grid(rtn(4, 48, 4)[:, :40], 4) is None  # rows not in whole blocks


def test_requantize_a_gguf(tmp_path) -> None:
    import gguf

    src = tmp_path / "f32.gguf"
    writer = gguf.GGUFWriter(str(src), arch="llama")
    writer.add_block_count(1)
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    on, off = rtn(16, 64, 4), np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    writer.add_tensor("blk.0.attn_q.weight", on)
    writer.add_tensor("blk.0.attn_k.weight", off)
    writer.add_tensor("token_embd.weight", rtn(16, 64, 4, seed=2))  # never touched: embeddings stay as they are
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    done = requantize(src, tmp_path / "q.gguf", 4)
    assert done.blocks == {"Q4_0": 1} and done.kept_f32 == 1 and 0 <= done.scale_rel_err <= 2 ** -11
    reader = gguf.GGUFReader(str(tmp_path / "q.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types == {"blk.0.attn_q.weight": "Q4_0", "blk.0.attn_k.weight": "F32", "token_embd.weight": "F32"}
    assert int(reader.fields["general.file_type"].contents()) == int(gguf.LlamaFileType.MOSTLY_Q4_0)
    q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    assert np.allclose(gguf.quants.dequantize(q.data, q.tensor_type).reshape(on.shape), on, rtol=2 ** -10, atol=0)
