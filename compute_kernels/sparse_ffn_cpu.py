"""The one-token FFN of a ReLU-gated GLU on the CPU, reading only active units' weights (C: ``compute_kernels/_sparse_ffn_cpu.c``).

``sparse_ffn_cpu(x, gate_w, up_w, down_t, act)`` returns ``down(act(x W_gate) * (x W_up))`` for one
token ``x`` (any shape with H elements): every row of ``gate_w`` (I, H) is read (which units are
active is only known after it), then only the active units' rows of ``up_w`` (I, H) and of
``down_t`` (I, H, down_proj's weight transposed, so a unit's weights are contiguous). All fp32.
Units are shared among ``threads`` (default: torch's), then columns of the output; the result
does not depend on the thread count.

Where the extension is not built or ``PARETOLAB_CPU_KERNELS=0``, ``sparse_ffn_kernel()`` is None
and the caller keeps its PyTorch path (``plugins/l1_sparsity.py``: ``index_select`` of the rows).
``ffn_bytes(hidden, units, active)`` is the honest accounting: weight bytes this kernel reads
against the dense FFN's.
"""

from __future__ import annotations

import torch

from paretolab.kernels.cpu_ext import extension, path_cap

NAME = "_sparse_ffn_cpu"
ACTS = {"relu": False, "relu2": True}  # act name -> squared
PARALLEL_MIN = 1 << 16  # gate weights below which one thread does it all


def sparse_ffn_kernel() -> str | None:
    """The path ``sparse_ffn_cpu`` takes now: ``"avx512"``, ``"avx2"`` or ``"scalar"``, or None (not built, or switched off)."""
    ext = extension(NAME)
    return None if ext is None else ext.isa()


def fits(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the kernel takes these tensors as they are: CPU, fp32, contiguous weights of one shape."""
    w = weights[0]
    return (x.device.type == "cpu" and x.dtype == torch.float32 and w.dim() == 2 and w.shape[1] == x.numel()
            and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() and t.shape == w.shape for t in weights))


def sparse_ffn_cpu(x: torch.Tensor, gate_w: torch.Tensor, up_w: torch.Tensor, down_t: torch.Tensor, act: str,
                   *, threads: int | None = None, path: str | None = None) -> torch.Tensor:
    """The FFN's output for one token, shaped like ``x``; ``path`` caps the kernel's instruction path (tests run each)."""
    ext = extension(NAME)
    if ext is None:
        raise RuntimeError("sparse_ffn_cpu: the C extension paretolab.kernels._sparse_ffn_cpu is not built or PARETOLAB_CPU_KERNELS=0; "
                           "check sparse_ffn_kernel() first, or rebuild with `pip install -e . --no-deps --no-build-isolation`")
    if act not in ACTS:
        raise ValueError(f"act must be one of {', '.join(ACTS)}, got {act!r}")
    if not fits(x, gate_w, up_w, down_t):
        raise ValueError(f"sparse_ffn_cpu needs fp32 CPU tensors: x with H elements and contiguous gate_w, up_w, down_t of shape (I, H); "
                         f"got x {tuple(x.shape)} {x.dtype} on {x.device}, gate_w {tuple(gate_w.shape)}, up_w {tuple(up_w.shape)}, "
                         f"down_t {tuple(down_t.shape)}")
    cap = path_cap(ext, path)
    units, hidden = gate_w.shape
    if threads is None:
        threads = torch.get_num_threads() if units * hidden >= PARALLEL_MIN else 1
    elif threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}; pass None for torch's thread count")
    xc = x.contiguous()
    out = torch.empty(x.shape, dtype=torch.float32)
    ext.ffn(xc.data_ptr(), gate_w.data_ptr(), up_w.data_ptr(), down_t.data_ptr(), out.data_ptr(), hidden, units, ACTS[act], threads, cap)
    return out


def ffn_bytes(hidden: int, units: int, active: int, element_size: int = 4) -> dict[str, float]:
    """Weight bytes of one token's FFN: the kernel (all of gate, ``active`` rows of up and down) vs dense (all three)."""
    dense = 3 * units * hidden * element_size
    sparse = (units + 2 * active) * hidden * element_size
    return {"dense_bytes": dense, "sparse_bytes": sparse, "avoided_share": 1 - sparse / dense if dense else 0.0}
