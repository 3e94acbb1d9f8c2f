"""The generator the method installs: compress each prompt, then decode the shorter prompt with the default loop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from paretolab.generation import BatchedGenerator, Generation
from paretolab.plugin_api.subject import Subject, synchronize
from paretolab.plugins.omnisift_text.flops import LMShape
from paretolab.plugins.omnisift_text.selection import Selection

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext


class CompressingGenerator:
    """Keeps ``selection``'s tokens of each prompt (in order) and decodes them as an ordinary prompt, greedy.

    ``prefill_s`` includes the selection (scoring is part of the prefill's cost). ``stats`` (the means
    over the call's prompts): ``context_kept_frac`` = kept ÷ prompt tokens, ``prefill_flops_ratio`` =
    (scoring FLOPs + prefill FLOPs of the kept tokens) ÷ prefill FLOPs of the whole prompt. Every
    prompt's pair is also kept in ``records`` for the method's ``evaluate``.
    """

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.records: list[tuple[float, float]] = []  # (kept fraction, FLOP ratio) per prompt compressed

    def to(self, device: torch.device | str) -> CompressingGenerator:
        """Move the learned selector's network with the model (Subject.to)."""
        if self.selection.net is not None:
            self.selection.net.to(device)
        return self

    def compress(self, subject: Subject, prompt: Sequence[int]) -> tuple[list[int], float, float]:
        """(compressed prompt, kept fraction, FLOP ratio) of one prompt."""
        kept, scoring = self.selection.select(subject.model, prompt)
        shape = LMShape.of(subject.model)
        ratio = (scoring + shape.prefill_flops(len(kept))) / shape.prefill_flops(len(prompt))
        return [prompt[i] for i in kept], len(kept) / len(prompt), ratio

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation:
        start = time.perf_counter()
        done = [self.compress(subject, list(p)) for p in prompts]
        synchronize(subject.device)
        select_s = time.perf_counter() - start
        out = BatchedGenerator().generate(subject, [c for c, _, _ in done], max_new_tokens=max_new_tokens, stop_ids=stop_ids, ctx=ctx)
        out.prefill_s += select_s
        pairs = [(frac, ratio) for _, frac, ratio in done]
        self.records += pairs
        out.stats = {"context_kept_frac": statistics.fmean(f for f, _ in pairs),
                     "prefill_flops_ratio": statistics.fmean(r for _, r in pairs)}
        return out
