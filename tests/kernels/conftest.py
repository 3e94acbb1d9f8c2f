"""Kernel tests run Triton in its interpreter on CPU tensors; the variable must be set before triton is imported."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # benchmarks/gpu_check.sh sets 0 to compile for CUDA


