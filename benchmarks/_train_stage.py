"""What the training benchmarks share: their command line and one short run of the ``train`` stage."""

from __future__ import annotations

import argparse
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any


def arguments(doc: str | None, *, steps: int) -> argparse.Namespace:
    """``--model --steps --threads --seq-len --batch``, with the calling benchmark's docstring as help."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="scratch-1m")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    return parser.parse_args()


def train_metrics(subject: Any, arm: tuple[str, dict[str, Any]] | None, steps: int, batch: int, seq_len: int, threads: int) -> dict[str, float]:
    """The train stage's metrics after ``steps`` steps, the method ``arm`` (name, params) applied first; no evaluation points."""
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.manager import registries

    with TemporaryDirectory() as tmp:
        ctx = TrialContext(seed=0, workdir=Path(tmp), task={"name": "perplexity", "corpus": "pystdlib-val"}, cpus=threads, stage="s")
        if arm is not None:
            subject = registries().methods.get(arm[0]).transform(subject, dict(arm[1]), ctx)
        params = {"tokens": steps * batch * seq_len, "seq_len": seq_len, "batch": batch, "eval_every": steps + 1, "eval_tokens": seq_len,
                  "corpus": "pystdlib-train"}
        out = registries().methods.get("train").transform(subject, params, ctx)
    return out.training.metrics
