"""Speculative decoding (EAGLE draft) vs greedy decoding on SmolLM2-135M, batch 1, side by side in one run.

    python benchmarks/speculative_cpu.py                               # arithmetic and prose: chain k=2 and auto, a tree, +lookup
    python benchmarks/speculative_cpu.py --k 2,3 --trees "nodes=4,depth=3,width=2,topk=2;nodes=6" --lookup 0,4 --prompts 4

Prompt sets (eval parts, never trained on by the draft; see plugins/speculative/corpus.py):
``arithmetic`` is GSM8K questions in the chat template (the model writes its worked arithmetic),
or the generated arithmetic problems where the GSM8K file is missing; ``prose`` is WikiText-2
held-out text to continue (pydoc where WikiText-2 is missing). The JSON names the set it used.

Contenders, each decoding the same prompts greedily to the end of sequence or ``--new-tokens``:
``hf_generate`` (transformers' ``generate``), ``greedy`` (our KV-cached loop at batch 1, which
takes the lean forward; torch's matmuls: the unmodified model), ``greedy_kernel`` (the same loop,
linears through the dense CPU kernel that the speculative generator also uses), ``spec_k<k>`` (the
speculative generator with the EAGLE draft, a chain of k drafts per verify; ``spec_kauto``: k
chosen by measured acceptance and cost), ``tree_n..d..w..t..`` (an EAGLE-2 dynamic draft tree of
that many nodes, depth, width and top-k, verified in one forward with a tree mask),
``...+lookup<n>`` (the tree plus a prompt-lookup branch of up to n tokens; ``<n>/<m>``: growing to m
while a round accepts it whole, the draft model skipped meanwhile) and ``lookup<n>`` (prompt lookup
alone, no draft model).
Every prompt runs every contender ``--repeats`` times, the order rotating; a contender's time on
a prompt is the median of its repeats, end to end (prefill included), after one warm-up call of
each contender on the first prompt (its time is reported as ``cold_s``: first call in the
process). A speed-up is per prompt (``greedy_best``: the faster of greedy and greedy_kernel on
that prompt), summarised over prompts by the geometric mean with a 95 % t-interval of the log
ratios: the prompts are the replicates. ``identical``: the speculative tokens equal the
unmodified model's greedy tokens (and greedy_kernel's) on every prompt. ``time_split``: one more
instrumented pass of each speculative arm saying where a round's time goes: the target's verify
forward, the drafts (draft model and lookup), and the loop's own bookkeeping.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paretolab.generation import BatchedGenerator
from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears
from paretolab.measure.timing import cpu_name, node_lock, torch_threads
from paretolab.models import load_subject
from paretolab.plugins.speculative.choose_k import choose_k, measure_costs
from paretolab.plugins.speculative.corpus import available_sets, prompt_set
from paretolab.plugins.speculative.eagle import EagleDrafter, LoadedDraft
from paretolab.plugins.speculative.generator import SpeculativeGenerator
from paretolab.plugins.speculative.lookup import LookupOnly
from paretolab.plugins.speculative.train import load_draft
from paretolab.plugins.speculative.tree import TreeShape
from paretolab.results.estimate import t_half_width

SETS = {"arithmetic": ("gsm8k", "arithmetic"), "prose": ("wikitext2", "pydoc")}  # first whose data is here
def geo_summary(ratios: list[float]) -> dict[str, Any]:
    """Geometric mean of per-prompt ratios with the 95 % t-interval of their logs (the prompts are the replicates)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    mean = float(logs.mean())
    half = t_half_width(logs)
    if half is None:
        return {"geomean": math.exp(mean), "ci95": None, "per_prompt": ratios}
    return {"geomean": round(math.exp(mean), 4), "ci95": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
            "per_prompt": [round(r, 4) for r in ratios]}


def _lookup(text: str) -> tuple[int, int | None]:
    """``"4"`` -> (4, None): 4 lookup tokens a round; ``"4/16"`` -> (4, 16): growing to 16 while wholly accepted."""
    n, _, most = text.partition("/")
    return int(n), int(most) if most else None


def spec_arms(ks: list[int | str], auto_k: int | None, trees: list[str], lookups: list[str]) -> dict[str, Callable[[LoadedDraft], SpeculativeGenerator]]:
    """Name -> a factory of the speculative generator that arm runs (a fresh drafter per arm: no shared state)."""
    arms: dict[str, Callable[[LoadedDraft], SpeculativeGenerator]] = {}
    for k in ks:
        kk = auto_k if k == "auto" else int(k)
        if kk is not None:
            arms[f"spec_k{k}"] = lambda loaded, kk=kk: SpeculativeGenerator(EagleDrafter(loaded), kk)
    for text in trees:
        shape = TreeShape.parse(text)
        label = f"tree_n{shape.nodes}d{shape.depth}w{shape.width}t{shape.topk}"
        for lookup in lookups:
            n, most = _lookup(lookup)
            name = label + (f"+lookup{lookup}" if n else "")
            arms[name] = lambda loaded, shape=shape, n=n, most=most: SpeculativeGenerator(EagleDrafter(loaded), 1, shape, lookup=n, lookup_max=most)
    for lookup in lookups:
        n, most = _lookup(lookup)
        if n:
            arms[f"lookup{lookup}"] = lambda loaded, n=n, most=most: SpeculativeGenerator(LookupOnly(), 1, lookup=n, lookup_max=most)
    return arms


def contenders(subject: Any, arms: dict[str, Callable[[LoadedDraft], SpeculativeGenerator]]) -> dict[str, Callable[[list[int], int], list[int]]]:
    model, eos = subject.model, subject.tokenizer.eos_token_id

    def hf(prompt: list[int], n: int) -> list[int]:
        ids = torch.tensor([prompt], dtype=torch.long, device=subject.device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, temperature=None,
                             top_p=None, top_k=None, eos_token_id=eos, pad_token_id=eos)
        return out[0, ids.shape[1]:].tolist()

    def greedy(prompt: list[int], n: int) -> list[int]:
        return BatchedGenerator(batch_size=1).generate(subject, [prompt], max_new_tokens=n, stop_ids=[eos]).sequences[0]

    def greedy_kernel(prompt: list[int], n: int) -> list[int]:
        with fast_linears(model):
            return greedy(prompt, n)

    out: dict[str, Callable[[list[int], int], list[int]]] = {"hf_generate": hf, "greedy": greedy}
    if dense_cpu_kernel() is not None:
        out["greedy_kernel"] = greedy_kernel
    loaded = load_draft(subject.model_name, model)
    for name, make in arms.items():
        generator = make(loaded)
        stats: dict[str, list[float]] = {}

        def spec(prompt: list[int], n: int, generator: SpeculativeGenerator = generator, stats: dict[str, list[float]] = stats) -> list[int]:
            result = generator.generate(subject, [prompt], max_new_tokens=n, stop_ids=[eos])
            stats.setdefault("accepted", []).append(result.stats["mean_accepted_len"])
            stats.setdefault("drafted", []).append(result.stats["draft_tokens"])
            return result.sequences[0]

        spec.stats = stats  # type: ignore[attr-defined]
        out[name] = spec
    return out


def run_set(subject: Any, name: str, prompts: list[list[int]], new_tokens: int, repeats: int,
            spec: dict[str, Callable[[LoadedDraft], SpeculativeGenerator]]) -> dict[str, Any]:
    arms = contenders(subject, spec)
    names = list(arms)
    cold = {}
    for arm, fn in arms.items():
        start = time.perf_counter()
        fn(prompts[0], new_tokens)
        cold[arm] = round(time.perf_counter() - start, 3)
    times: dict[str, list[float]] = {arm: [] for arm in names}
    tokens: dict[str, list[list[int]]] = {arm: [] for arm in names}
    for i, prompt in enumerate(prompts):
        per: dict[str, list[float]] = {arm: [] for arm in names}
        for r in range(repeats):
            shift = (i * repeats + r) % len(names)
            for arm in names[shift:] + names[:shift]:
                start = time.perf_counter()
                seq = arms[arm](prompt, new_tokens)
                per[arm].append(time.perf_counter() - start)
                if r == 0:
                    tokens[arm].append(seq)
        for arm in names:
            times[arm].append(statistics.median(per[arm]))
    n_tokens = [len(seq) for seq in tokens["greedy"]]
    rate = {arm: [n / t for n, t in zip(n_tokens, times[arm], strict=True)] for arm in names}
    best = [max(g, k) for g, k in zip(rate["greedy"], rate.get("greedy_kernel", rate["greedy"]), strict=True)]
    result: dict[str, Any] = {
        "prompt_set": name, "prompts": len(prompts), "new_tokens_max": new_tokens, "tokens_per_prompt": n_tokens,
        "tok_s": {arm: round(sum(n_tokens) / sum(times[arm]), 2) for arm in names}, "cold_s": cold,
        "greedy_kernel_over_greedy": geo_summary([k / g for k, g in zip(rate.get("greedy_kernel", rate["greedy"]), rate["greedy"], strict=True)]),
        "greedy_over_hf_generate": geo_summary([g / h for g, h in zip(rate["greedy"], rate["hf_generate"], strict=True)]),
        "spec": {},
    }
    for arm in spec:
        fn = arms[arm]
        result["spec"][arm] = {
            "accepted_len": round(statistics.fmean(fn.stats["accepted"][1:]), 3),  # type: ignore[attr-defined]  (warm-up call left out)
            "draft_tokens_per_prompt": round(statistics.fmean(fn.stats["drafted"][1:]), 1),  # type: ignore[attr-defined]
            "over_greedy_best": geo_summary([s / b for s, b in zip(rate[arm], best, strict=True)]),
            "over_greedy_torch": geo_summary([s / g for s, g in zip(rate[arm], rate["greedy"], strict=True)]),
            "over_hf_generate": geo_summary([s / h for s, h in zip(rate[arm], rate["hf_generate"], strict=True)]),
            "identical_to_greedy": tokens[arm] == tokens["greedy"],
            "identical_to_greedy_kernel": tokens[arm] == tokens.get("greedy_kernel", tokens["greedy"]),
        }
    result["hf_identical_to_greedy"] = tokens["hf_generate"] == tokens["greedy"]
    return result


def time_split(subject: Any, make: Callable[[LoadedDraft], SpeculativeGenerator], prompts: list[list[int]], new_tokens: int) -> dict[str, float]:
    """Where a speculative round's time goes (one extra run per prompt, instrumented): verify, draft, the loop's own.

    ``draft`` is the drafter's proposal (chain or tree) and the prompt lookup; ``verify`` the
    target's forward (a tree's included); ``loop`` the rest (acceptance, cache roll-back, bookkeeping).
    """
    import paretolab.plugins.speculative.generator as gen

    spent = {"verify": 0.0, "draft": 0.0}
    real_forward, real_lean = gen.forward_with_cache, gen.lean_forward
    generator = make(load_draft(subject.model_name, subject.model))

    def timed(fn: Callable[..., Any], key: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        return run

    generator._draft = timed(generator._draft, "draft")  # type: ignore[method-assign]
    gen.forward_with_cache, gen.lean_forward = timed(real_forward, "verify"), timed(real_lean, "verify")
    try:
        generator.generate(subject, prompts[:1], max_new_tokens=8)
        spent.update(verify=0.0, draft=0.0)
        rounds, total, prefill = 0.0, 0.0, 0.0
        for prompt in prompts:
            start = time.perf_counter()
            out = generator.generate(subject, [prompt], max_new_tokens=new_tokens, stop_ids=[subject.tokenizer.eos_token_id])
            total += time.perf_counter() - start
            prefill += out.prefill_s
            rounds += out.tokens_sequential - 1
    finally:
        gen.forward_with_cache, gen.lean_forward = real_forward, real_lean
    verify = spent["verify"] - prefill  # the prefill's forward is the same call
    return {"rounds": rounds, "verify_ms_per_round": 1e3 * verify / rounds, "draft_ms_per_round": 1e3 * spent["draft"] / rounds,
            "loop_ms_per_round": 1e3 * (total - prefill - verify - spent["draft"]) / rounds, "prefill_ms_per_prompt": 1e3 * prefill / len(prompts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sets", default="arithmetic,prose", help="comma-separated: arithmetic, prose")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per set (default 8)")
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--prompt-tokens", type=int, default=64, help="length of a prose prompt")
    parser.add_argument("--k", default="2,auto", help="chain draft lengths; auto: chosen by measured acceptance and cost; '' for none")
    parser.add_argument("--trees", default="nodes=4,depth=3,width=2,topk=2",
                        help="EAGLE draft-tree shapes, ';'-separated, each nodes=,depth=,width=,topk= (see plugins/speculative/tree.py); '' for none")
    parser.add_argument("--lookup", default="0,4/16",
                        help="prompt-lookup tokens added to each tree (0: none; n/m: n a round, growing to m while wholly accepted); "
                             "each n > 0 also runs lookup alone")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="speculative_cpu.json")
    args = parser.parse_args()
    with node_lock(), torch_threads(args.threads):  # no other timed run on this node meanwhile
        report = measure(args)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    subject = load_subject(args.model)
    ks: list[int | str] = [k if k == "auto" else int(k) for k in filter(None, args.k.split(","))]
    trees = [t for t in args.trees.split(";") if t.strip()]
    lookups = [n.strip() for n in args.lookup.split(",") if n.strip()]
    loaded = load_draft(subject.model_name, subject.model)
    report: dict[str, Any] = {
        "model": args.model, "cpu": cpu_name(), "threads": torch.get_num_threads(), "kernel": dense_cpu_kernel(), "load_before": os.getloadavg(),
        "draft": {key: loaded.meta.get(key) for key in ("steps", "tokens", "train_s", "data", "prompt_sets", "heldout_step_acc", "heldout_accepted_len", "curve")},
        "sets": {},
    }
    auto_k = None
    if "auto" in ks:
        warm = prompt_set(subject.tokenizer, "pydoc", "eval", 1, length=args.prompt_tokens)[0]
        costs = measure_costs(subject.model, EagleDrafter(loaded), warm, len(loaded.meta["heldout_accepted_len"]))
        auto_k, rates = choose_k(loaded.meta["heldout_accepted_len"], costs)
        report["k_auto"] = {"k": auto_k, "predicted_tok_s": rates, "verify_ms": {t: v * 1e3 for t, v in costs["verify_s"].items()},
                            "draft_step_ms": costs["draft_step_s"] * 1e3, "draft_first_ms": costs["draft_first_s"] * 1e3}
        print(f"k auto = {auto_k}: predicted tok/s {', '.join(f'k={k}: {r:.1f}' for k, r in rates.items())}")
    for kind in args.sets.split(","):
        name = available_sets(SETS[kind])[0]
        prompts = prompt_set(subject.tokenizer, name, "eval", args.prompts, length=args.prompt_tokens)
        arms = spec_arms(ks, auto_k, trees, lookups)
        result = run_set(subject, name, prompts, args.new_tokens, args.repeats, arms)
        result["time_split"] = {arm: time_split(subject, arms[arm], prompts, args.new_tokens) for arm in arms}
        report["sets"][kind] = result
        print(f"{kind} ({name}): tok/s {result['tok_s']}")
        for arm, r in result["spec"].items():
            print(f"  {arm}: accepted {r['accepted_len']}, x{r['over_greedy_best']['geomean']} {r['over_greedy_best']['ci95']} the faster greedy, "
                  f"x{r['over_hf_generate']['geomean']} hf generate, identical {r['identical_to_greedy']}")
    report["load_after"] = os.getloadavg()
    return report


if __name__ == "__main__":
    main()
