"""The train stage's step rate beside a bare PyTorch loop on the same model, data shapes and optimizer, in one run.

    python benchmarks/train_loop.py [--model scratch-1m] [--steps 20] [--threads 1] [--seq-len 128] [--batch 16]

Both run ``--steps`` AdamW steps of next-token loss on random windows; the bare loop has none of the
stage's work (schedule, clipping, hooks, the FLOP counter and the saved-tensor meter on the first step),
so the ratio is the stage's overhead. Evaluation points are left out (``eval_every`` beyond the run).
The rows alternate (bare, stage, bare, stage) so that load on a shared machine hits both alike.
"""

from __future__ import annotations

import time

import torch
from _train_stage import arguments, train_metrics


def bare(subject, steps: int, batch: int, seq_len: int) -> float:
    """Tokens/s of the plainest loop."""
    model = subject.model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cpu").manual_seed(0)
    vocab = model.config.vocab_size
    start = time.perf_counter()
    for _ in range(steps):
        ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen, device="cpu")
        logits = model(input_ids=ids[:, :-1]).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return steps * batch * seq_len / (time.perf_counter() - start)


def main() -> None:
    args = arguments(__doc__, steps=20)
    from paretolab.models import load_subject

    torch.set_num_threads(args.threads)
    base = load_subject(args.model)
    train_metrics(base.copy(), None, 1, args.batch, args.seq_len, args.threads)  # tokenize the corpus once (cached on disk), outside the timing
    rows = []
    for _ in range(2):
        rows.append(("bare PyTorch loop", bare(base.copy(), args.steps, args.batch, args.seq_len)))
        rows.append(("train stage", train_metrics(base.copy(), None, args.steps, args.batch, args.seq_len, args.threads)["train_tok_s"]))
    reference = sum(v for name, v in rows if name.startswith("bare")) / 2
    print(f"{args.model}, {args.steps} steps of {args.batch}x{args.seq_len} tokens, {args.threads} thread(s)")
    print(f"{'loop':<20} {'tokens/s':>10} {'ratio':>7}")
    for name, value in rows:
        print(f"{name:<20} {value:>10.0f} {value / reference:>7.2f}")


if __name__ == "__main__":
    main()
