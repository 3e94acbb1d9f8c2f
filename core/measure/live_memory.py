"""Peak bytes of the tensors a block creates, counted exactly on any device (CPU included, where no allocator reports).

CUDA's caching allocator reports its peak (``torch.cuda.max_memory_allocated``); a CPU has nothing alike, and the
process's resident set is blurred by malloc keeping freed memory. ``LiveTensorBytes`` is a dispatch mode that sees
every ATen op the block runs, forward and backward (the autograd engine runs CPU backward ops on the calling
thread): each new storage an op returns is counted when it appears and uncounted when it is freed (a finalizer on
the storage), so ``peak`` is the most bytes the block's own tensors held at once. Not counted: tensors that existed
before the block (parameters, inputs; their ``.grad`` only if created inside), and scratch memory inside a fused
kernel that never becomes a tensor. Counting slows every op down, so time a block without it.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """``with LiveTensorBytes() as live: ...``; then ``live.peak`` (bytes) and ``live.now`` (bytes still alive)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.peak = 0
        self._seen: dict[int, int] = {}  # storage cdata -> bytes, while alive

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor) and item.device.type != "meta":
                self._track(item.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._seen:
            return  # a view of a storage already counted
        size = storage.nbytes()
        self._seen[key] = size
        self.now += size
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.now -= self._seen.pop(key, 0)
