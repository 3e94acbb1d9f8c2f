"""Our batched KV-cached greedy loop vs transformers' ``generate``, batch 1 and batch 8, in one run.

    python benchmarks/decode.py [--model smollm2-135m] [--new-tokens 32] [--prompt-tokens 64] [--repeats 3] [--threads 1]

Both decode the same prompts (slices of the built-in pydoc corpus, equal length, so no padding)
greedily for exactly ``--new-tokens`` tokens (no early stop), after one warm-up call each. A row
reports the best of ``--repeats`` end-to-end wall times (prefill included) as generated tokens
per second, our speed-up over ``generate``, and whether the two produced the same tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from paretolab.data import encode, load_corpus
from paretolab.generation import BatchedGenerator
from paretolab.models import load_subject


def prompts_of(tokenizer: Any, batch: int, length: int) -> list[list[int]]:
    ids = encode(tokenizer, load_corpus("pydoc")[0][: 200 * length * batch])
    return [ids[i * length : (i + 1) * length] for i in range(batch)]


def ours(subject: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    return BatchedGenerator(batch_size=len(prompts)).generate(subject, prompts, max_new_tokens=new_tokens).sequences


@torch.no_grad()
def theirs(subject: Any, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    ids = torch.tensor(prompts, dtype=torch.long)
    out = subject.model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=subject.tokenizer.eos_token_id,
    )
    return out[:, ids.shape[1]:].tolist()


def best_time(fn: Any, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    subject = load_subject(args.model)
    rows = []
    for batch in (1, 8):
        prompts = prompts_of(subject.tokenizer, batch, args.prompt_tokens)
        ours_s, ours_ids = best_time(lambda: ours(subject, prompts, args.new_tokens), args.repeats)
        hf_s, hf_ids = best_time(lambda: theirs(subject, prompts, args.new_tokens), args.repeats)
        tokens = batch * args.new_tokens
        rows.append({
            "batch": batch, "ours_tok_s": tokens / ours_s, "hf_generate_tok_s": tokens / hf_s,
            "speedup": hf_s / ours_s, "same_tokens": ours_ids == hf_ids,
        })
    if args.json:
        print(json.dumps({"model": args.model, "threads": torch.get_num_threads(), "new_tokens": args.new_tokens, "rows": rows}))
        return
    print(f"{args.model}, {args.prompt_tokens}-token prompts, {args.new_tokens} new tokens, {torch.get_num_threads()} thread(s), best of {args.repeats}")
    print(f"{'batch':>5}  {'ours tok/s':>10}  {'generate tok/s':>14}  {'speed-up':>8}  same tokens")
    for r in rows:
        print(f"{r['batch']:>5}  {r['ours_tok_s']:>10.1f}  {r['hf_generate_tok_s']:>14.1f}  {r['speedup']:>7.2f}x  {r['same_tokens']}")


if __name__ == "__main__":
    main()
