"""Kernel tests run Triton in its interpreter on CPU tensors; the variable must be set before triton is imported."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"


