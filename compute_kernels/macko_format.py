"""The MACKO sparse matrix format (exact encode/decode) and its pure-PyTorch SpMV reference.

MACKO ("Mutually Aligned Compressed coordinates Kernel Optimised", Macko & Boža,
github.com/vlejd/macko_spmv) is CSR with the column indices delta-encoded in 4 bits:

- ``values``:  16-bit values of each row's kept entries, rows one after another;
- ``deltas``:  one 4-bit code per value, two per byte (even element in the low nibble). The code
  is ``delta - 1`` where ``delta = col - previous col`` in [1, 16] and a row's "previous col"
  starts at -1, so the code is the number of zero columns skipped. Where a gap would exceed 16,
  an explicit zero is stored every 16 columns ("padding") so that every delta fits;
- ``row_ptr``: int32, ``rows + 1`` offsets into ``values``/``deltas``.

As in the official compressor, the value and delta buffers are padded with zeros to a multiple
of 8 entries so a kernel can load 8 values (16 bytes) and 8 deltas (4 bytes) at a time; rows
are not aligned individually (a kernel masks the part of a chunk that belongs to another row).

Our choices: a run of zeros at the *end* of a row gets no padding (no later entry needs a delta
across it); the official CPU compressor also pads trailing runs, which only costs bytes and
decodes to the same matrix. Entries that are zero after the cast to the value dtype (including
-0.0 and fp16 underflow) are dropped. Decoding restores the matrix exactly in the value dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DELTA_BITS = 4
MAX_DELTA = 1 << DELTA_BITS  # 16: the largest column step one 4-bit code can express
ALIGN = 8  # values/deltas are padded to a multiple of this many entries
VALUE_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class MackoMatrix:
    """A (rows, cols) sparse matrix in MACKO format; the three tensors are all it stores."""

    values: torch.Tensor  # (P,) float16 or bfloat16, P = padded entry count, P % 8 == 0
    deltas: torch.Tensor  # (P // 2,) uint8, two 4-bit codes (delta - 1) per byte, low nibble first
    row_ptr: torch.Tensor  # (rows + 1,) int32 offsets into values
    shape: tuple[int, int]

    @property
    def stored_entries(self) -> int:
        """Entries the rows use: kept values plus padding zeros (the tail padding excluded)."""
        return int(self.row_ptr[-1].item())

    @property
    def nbytes(self) -> int:
        """The real size of the stored buffers in bytes (shape metadata not counted)."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.deltas, self.row_ptr))

    @property
    def device(self) -> torch.device:
        return self.values.device

    def to(self, device: torch.device | str) -> MackoMatrix:
        """The same matrix with its buffers on ``device``."""
        return MackoMatrix(self.values.to(device), self.deltas.to(device), self.row_ptr.to(device), self.shape)


def macko_encode(dense: torch.Tensor, *, value_dtype: torch.dtype = torch.float16) -> MackoMatrix:
    """Encode a 2-D matrix; entries that are zero in ``value_dtype`` are not stored."""
    if dense.dim() != 2:
        raise ValueError(f"macko_encode needs a 2-D matrix, got shape {tuple(dense.shape)}")
    if value_dtype not in VALUE_DTYPES:
        raise ValueError(f"value_dtype must be one of {VALUE_DTYPES}, got {value_dtype}")
    rows, cols = dense.shape
    if rows * cols >= 2**31:
        raise ValueError(f"matrix of shape {(rows, cols)} is too large for 32-bit row pointers")
    vals = dense.detach().to(value_dtype)
    nonzero = vals != 0
    keep = nonzero | _padding_positions(nonzero)  # (rows, cols) bool: entries the format stores
    counts = keep.sum(dim=1)
    row_ptr = torch.zeros(rows + 1, dtype=torch.int64, device=dense.device)
    row_ptr[1:] = torch.cumsum(counts, dim=0)
    n = int(row_ptr[-1].item())
    padded = -(-n // ALIGN) * ALIGN

    r_idx, c_idx = keep.nonzero(as_tuple=True)  # row-major order: the format's order
    prev = torch.empty_like(c_idx)
    if n:
        prev[1:] = c_idx[:-1]
        prev[row_ptr[:-1][counts > 0]] = -1  # a row's first entry counts from column -1
    codes = torch.zeros(padded, dtype=torch.uint8, device=dense.device)
    codes[:n] = (c_idx - prev - 1).to(torch.uint8)
    values = torch.zeros(padded, dtype=value_dtype, device=dense.device)
    values[:n] = vals[r_idx, c_idx]
    deltas = codes[0::2] | (codes[1::2] << DELTA_BITS)
    return MackoMatrix(values, deltas, row_ptr.to(torch.int32), (rows, cols))


def _padding_positions(nonzero: torch.Tensor) -> torch.Tensor:
    """Zero entries the format must store: every 16th column after a kept entry, before the next nonzero."""
    rows, cols = nonzero.shape
    col = torch.arange(cols, device=nonzero.device).expand(rows, cols)
    # Last nonzero column at or before each position (-1 if none): padding repeats every 16 from it.
    last_nz = torch.where(nonzero, col, torch.full_like(col, -1)).cummax(dim=1).values
    # Whether a nonzero follows strictly after the position (trailing zeros need no padding).
    nz_at_or_after = nonzero.flip(1).cumsum(dim=1).flip(1)
    nz_after = (nz_at_or_after - nonzero.to(nz_at_or_after.dtype)) > 0
    return ~nonzero & ((col - last_nz) % MAX_DELTA == 0) & nz_after


def _flat_positions(fmt: MackoMatrix) -> torch.Tensor:
    """``row * cols + col`` of every stored entry (int32: encode refuses matrices of 2**31 entries).

    One prefix sum of the column steps over the whole buffer gives each entry's position up to
    a per-row offset; the offsets are spread over their rows by a second prefix sum of the jumps
    placed at each row's first entry (cheaper than materialising a row id per entry).
    """
    rows, cols = fmt.shape
    n = fmt.stored_entries
    codes = torch.stack([fmt.deltas & 0xF, fmt.deltas >> DELTA_BITS], dim=1).reshape(-1)[:n]
    running = torch.cumsum(codes.to(torch.int32) + 1, dim=0, dtype=torch.int32)  # (n,)
    nonempty = fmt.row_ptr[1:] > fmt.row_ptr[:-1]
    starts = fmt.row_ptr[:-1][nonempty].to(torch.int64)
    before = torch.cat([running.new_zeros(1), running])[starts]  # steps taken before each row
    offset = torch.arange(rows, device=fmt.device, dtype=torch.int32)[nonempty] * cols - 1 - before
    jumps = torch.zeros(n, dtype=torch.int32, device=fmt.device)
    jumps[starts] = torch.diff(offset, prepend=offset.new_zeros(1))
    return running + torch.cumsum(jumps, dim=0, dtype=torch.int32)


def macko_decode(fmt: MackoMatrix) -> torch.Tensor:
    """The dense (rows, cols) matrix in the value dtype; exact inverse of ``macko_encode``."""
    flat = _flat_positions(fmt)
    dense = torch.zeros(fmt.shape[0] * fmt.shape[1], dtype=fmt.values.dtype, device=fmt.device)
    dense[flat] = fmt.values[: flat.numel()]
    return dense.view(fmt.shape)


def macko_spmv_ref(fmt: MackoMatrix, x: torch.Tensor) -> torch.Tensor:
    """y = M @ x for x of shape (cols,) or (..., cols), computed from the format; result in x's dtype.

    The reference the kernel is tested against: recover the columns by prefix sums of the
    deltas, gather ``x``, multiply and sum each row's segment in float64 (so that it is more
    precise than anything it checks).
    """
    rows, cols = fmt.shape
    if x.shape[-1] != cols:
        raise ValueError(f"x has {x.shape[-1]} features, the matrix has {cols} columns")
    flat = _flat_positions(fmt)
    xf = x.reshape(-1, cols).to(torch.float64)  # (B, cols)
    prods = xf[:, flat % max(cols, 1)] * fmt.values[: flat.numel()].to(torch.float64)  # (B, n)
    lengths = (fmt.row_ptr[1:] - fmt.row_ptr[:-1]).expand(xf.shape[0], rows)
    y = torch.segment_reduce(prods, "sum", lengths=lengths, axis=1, unsafe=True)  # empty rows sum to 0
    return y.to(x.dtype).reshape(*x.shape[:-1], rows)


def dense_bytes(shape: tuple[int, int], bits: int = 16) -> int:
    """Bytes of the same matrix stored dense with ``bits`` per value (the comparison point)."""
    return shape[0] * shape[1] * bits // 8
