"""LiveTensorBytes: the most bytes a block's own tensors held at once, forward and backward, views counted once."""

from __future__ import annotations

import torch

from paretolab.measure.live_memory import LiveTensorBytes

MB = 2**20


def test_freed_tensors_leave_the_count_and_views_are_counted_once():
    with LiveTensorBytes() as live:
        big = torch.empty(1024, 1024)  # 4 MB
        view = big[:512]  # same storage
        del big, view
        kept = torch.zeros(512, 1024)  # 2 MB
    assert live.peak == 4 * MB and live.now == 2 * MB
    del kept
    assert live.now == 0


def test_the_backward_pass_is_counted():
    x = torch.randn(1024, 1024, requires_grad=True)  # made before: not counted
    with LiveTensorBytes() as forward_only:
        (x * 2).sum()
    assert forward_only.peak == 4 * MB + 4 and forward_only.now == 0  # x * 2, then the scalar; both freed
    with LiveTensorBytes() as both:
        (x * 2).sum().backward()
    assert both.now == 4 * MB and x.grad is not None  # the gradient the backward pass made is still alive in x.grad
