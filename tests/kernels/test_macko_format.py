"""The MACKO format: exact round trips, the byte layout of the official compressor, the stored size."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paretolab.kernels.macko import ALIGN, MackoMatrix, macko_decode, macko_encode


def encode_by_loop(dense: torch.Tensor) -> tuple[list[float], list[int], list[int]]:
    """An independent, entry-by-entry encoder: (values, 4-bit codes, row_ptr), tails unpadded.

    Walks each row like the official CPU compressor (count skipped zeros; store a zero once 15
    were skipped) but stops at the row's last nonzero.
    """
    values: list[float] = []
    codes: list[int] = []
    row_ptr = [0]
    for row in dense.tolist():
        nz = [c for c, v in enumerate(row) if v != 0]
        last = nz[-1] if nz else -1
        skipped = 0
        for c in range(last + 1):
            if row[c] != 0 or skipped == 15:
                values.append(row[c])
                codes.append(skipped)
                skipped = 0
            else:
                skipped += 1
        row_ptr.append(len(values))
    return values, codes, row_ptr


@st.composite
def sparse_matrices(draw: st.DrawFn) -> torch.Tensor:
    """fp16 matrices of random shape: random density (0 and 100% included) or explicit columns (long gaps, empty rows)."""
    rows = draw(st.integers(1, 24))
    cols = draw(st.integers(1, 120))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    values = torch.randn(rows, cols, generator=gen).to(torch.float16)
    if draw(st.booleans()):
        sparsity = draw(st.sampled_from([0.0, 0.3, 0.5, 0.7, 0.9, 0.97, 1.0]))
        keep = torch.rand(rows, cols, generator=gen) >= sparsity
    else:
        keep = torch.zeros(rows, cols, dtype=torch.bool)
        for r in range(rows):
            for c in draw(st.sets(st.integers(0, cols - 1), max_size=6)):
                keep[r, c] = True
    return torch.where(keep, values, torch.zeros_like(values))


@settings(max_examples=150, deadline=None)
@given(sparse_matrices())
def test_any_sparse_matrix_round_trips_exactly(dense: torch.Tensor) -> None:
    fmt = macko_encode(dense)
    assert torch.equal(macko_decode(fmt), dense)
    assert fmt.shape == tuple(dense.shape)


@settings(max_examples=100, deadline=None)
@given(sparse_matrices())
def test_buffers_match_an_entry_by_entry_encoder(dense: torch.Tensor) -> None:
    values, codes, row_ptr = encode_by_loop(dense)
    fmt = macko_encode(dense)
    n = len(values)
    assert fmt.row_ptr.tolist() == row_ptr
    assert fmt.values[:n].tolist() == values
    unpacked = torch.stack([fmt.deltas & 0xF, fmt.deltas >> 4], dim=1).reshape(-1)
    assert unpacked[:n].tolist() == codes
    # The tail up to the next multiple of 8 is zeros, so aligned 8-entry loads are safe.
    assert fmt.values.numel() == math.ceil(n / ALIGN) * ALIGN
    assert not fmt.values[n:].any() and not unpacked[n:].any()


@settings(max_examples=100, deadline=None)
@given(sparse_matrices())
def test_nbytes_is_20_bits_per_padded_entry_plus_32_bit_row_pointers(dense: torch.Tensor) -> None:
    fmt = macko_encode(dense)
    padded = fmt.values.numel()
    assert fmt.nbytes == (20 * padded + 32 * (dense.shape[0] + 1)) // 8
    assert fmt.nbytes == sum(t.numel() * t.element_size() for t in (fmt.values, fmt.deltas, fmt.row_ptr))


def test_the_papers_example_row() -> None:
    """Values [1,2,3] at columns [2,36,46] store [1,0,0,2,3] with column steps [3,16,16,2,10] from column -1."""
    dense = torch.zeros(1, 50, dtype=torch.float16)
    dense[0, [2, 36, 46]] = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float16)
    fmt = macko_encode(dense)
    assert fmt.values[:5].tolist() == [1.0, 0.0, 0.0, 2.0, 3.0]
    assert fmt.deltas[:3].tolist() == [2 | 15 << 4, 15 | 1 << 4, 9]  # codes = steps - 1, low nibble first
    assert fmt.row_ptr.tolist() == [0, 5]


def test_a_gap_of_exactly_16_needs_no_padding_and_17_needs_one() -> None:
    dense = torch.zeros(2, 40, dtype=torch.float16)
    dense[0, [0, 16]] = 1.0  # step 16
    dense[1, [0, 17]] = 1.0  # step 17 -> a zero at column 16
    fmt = macko_encode(dense)
    assert fmt.row_ptr.tolist() == [0, 2, 5]
    assert torch.equal(macko_decode(fmt), dense)


def test_empty_and_all_zero_matrices() -> None:
    for dense in (torch.zeros(5, 300), torch.zeros(0, 7), torch.zeros(3, 0)):
        fmt = macko_encode(dense)
        assert fmt.values.numel() == 0 and fmt.row_ptr.tolist() == [0] * (dense.shape[0] + 1)
        assert torch.equal(macko_decode(fmt), dense.half())


def test_bfloat16_values_round_trip() -> None:
    dense = torch.randn(17, 90)
    dense[torch.rand(17, 90) < 0.6] = 0
    fmt = macko_encode(dense, value_dtype=torch.bfloat16)
    assert fmt.values.dtype == torch.bfloat16
    assert torch.equal(macko_decode(fmt), dense.to(torch.bfloat16))


def test_values_that_round_to_zero_are_not_stored() -> None:
    dense = torch.tensor([[1e-9, 1.0, -0.0, 2.0]])  # 1e-9 underflows in fp16
    fmt = macko_encode(dense)
    assert fmt.stored_entries == 2
    assert macko_decode(fmt).tolist() == [[0.0, 1.0, 0.0, 2.0]]


def test_bad_input_is_refused_with_its_shape() -> None:
    with pytest.raises(ValueError, match=r"2-D matrix, got shape \(4,\)"):
        macko_encode(torch.ones(4))
    with pytest.raises(ValueError, match="value_dtype"):
        macko_encode(torch.ones(2, 2), value_dtype=torch.float32)


def test_to_moves_every_buffer() -> None:
    fmt = macko_encode(torch.eye(4)).to("cpu")
    assert isinstance(fmt, MackoMatrix) and fmt.device.type == "cpu"
