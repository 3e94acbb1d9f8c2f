"""Draft trees and prompt lookup: a tree verify gives each branch its own chain's logits, the accepted branch's cache
is moved into place, and whatever the tree or lookup proposes, the output is the target's greedy output."""

from __future__ import annotations

import pytest
import torch

from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.generation.decoding import forward_with_cache
from paretolab.generation.lean import LeanCache, lean_forward
from paretolab.kernels.dense_cpu import dense_cpu_kernel, fast_linears
from paretolab.kernels.dense_cpu import linear as kernel_linear
from paretolab.plugin_api.context import TrialContext
from paretolab.plugins.speculative import Speculative
from paretolab.plugins.speculative.eagle import EagleConfig, EagleDraft, EagleDrafter, LoadedDraft
from paretolab.plugins.speculative.generator import SpeculativeGenerator
from paretolab.plugins.speculative.lookup import LookupOnly, NgramLookup
from paretolab.plugins.speculative.tree import DraftTree, TreeShape, accept, block_layout

PROMPTS = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8], [40, 41, 42]]
PROMPT = [5, 9, 2, 7, 11, 3]
# root r, then: a1 (0), a2 under a1 (1), b1 (2), b2 under b1 (3), c under a1 (4)
TREE = DraftTree([21, 22, 31, 32, 41], [-1, 0, -1, 2, 0])
PATHS = {"a": [0, 1, 2], "b": [0, 3, 4], "c": [0, 1, 5]}  # block rows (root = 0) of each branch


def _prefilled(model):
    logits, cache = forward_with_cache(model, torch.tensor([PROMPT]), last_only=True)
    return int(logits[0, -1].argmax()), cache


@torch.no_grad()
def test_a_tree_verify_gives_every_branch_the_logits_of_its_own_chain(tiny):
    model = tiny.model
    root, cache = _prefilled(model)
    block, parents = TREE.block(root)
    depth, mask = block_layout(parents, torch.device("cpu"))
    assert depth.tolist() == [0, 1, 2, 1, 2, 2]
    tree_logits, _ = lean_forward(model, torch.tensor([block]), cache, positions=len(PROMPT) + depth, block_mask=mask)
    for rows in PATHS.values():
        _, chain_cache = _prefilled(model)
        chain_logits, _ = forward_with_cache(model, torch.tensor([[block[i] for i in rows]]), chain_cache)
        torch.testing.assert_close(tree_logits[0, rows], chain_logits[0], rtol=0, atol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("branch", ["b", "c"])
def test_keeping_a_branch_leaves_the_cache_a_chain_would_have(tiny, branch):
    model = tiny.model
    root, cache = _prefilled(model)
    block, parents = TREE.block(root)
    depth, mask = block_layout(parents, torch.device("cpu"))
    lean_forward(model, torch.tensor([block]), cache, positions=len(PROMPT) + depth, block_mask=mask)
    cache.keep(len(PROMPT), PATHS[branch])
    assert cache.get_seq_length() == len(PROMPT) + 3
    after_tree, _ = forward_with_cache(model, torch.tensor([[77, 78]]), cache)
    _, chain_cache = _prefilled(model)
    forward_with_cache(model, torch.tensor([[block[i] for i in PATHS[branch]]]), chain_cache)
    after_chain, _ = forward_with_cache(model, torch.tensor([[77, 78]]), chain_cache)
    torch.testing.assert_close(after_tree, after_chain, rtol=0, atol=1e-5)


def test_cache_keep_refuses_offsets_it_cannot_honour():
    cache = LeanCache(1)
    cache.append(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    cache.length = 5
    for bad in ([2, 1], [0, 5], [-1, 0]):
        with pytest.raises(ValueError, match="LeanCache.keep"):
            cache.keep(1, bad)


def test_accept_walks_the_targets_choices_through_the_tree():
    block, parents = TREE.block(10)
    # the target picks b1 after the root, b2 after b1, then 99 (no such child): path root-b1-b2, bonus 99
    target = {0: 31, 3: 32, 4: 99}
    assert accept(block, parents, [target.get(i, -1) for i in range(len(block))]) == ([0, 3, 4], 99)
    assert accept(block, parents, [21, 41, 0, 0, 0, 5]) == ([0, 1, 5], 5)  # a1, then c under a1, then 5
    assert accept(block, parents, [50] * len(block)) == ([0], 50)  # nothing accepted: the target's own token


def test_tree_shapes_merge_chains_and_refuse_nonsense():
    merged = TREE.with_chain([21, 22, 23, 24])
    assert merged.tokens[:5] == TREE.tokens and merged.tokens[5:] == [23, 24] and merged.parents[5:] == [1, 5]
    assert TREE.with_chain([]).tokens == TREE.tokens
    assert DraftTree.chain([4, 5, 6]).is_chain() and not TREE.is_chain()
    assert TREE.limit_depth(1).tokens == [21, 31]
    assert TreeShape.parse("nodes=6,depth=2") == TreeShape(nodes=6, depth=2)
    for bad in ("nodes=0", "leaves=3", "nodes=x"):
        with pytest.raises(ValueError):
            TreeShape.parse(bad)
    with pytest.raises(ValueError, match="parents must precede"):
        DraftTree([1, 2], [1, -1])


class BranchOracle:
    """A tree whose first branch is always wrong and whose second holds the greedy continuation: only a tree reaches it."""

    feature_layers = ()

    def __init__(self, reference: dict[tuple[int, ...], list[int]], depth: int) -> None:
        self.reference, self.depth = reference, depth

    def start(self, target):
        pass

    def propose(self, ids, features, k):
        raise AssertionError("a tree drafter is asked for trees")

    def propose_tree(self, ids, features, shape):
        prompt, continuation = next((p, c) for p, c in self.reference.items() if tuple(ids[: len(p)]) == p)
        right = continuation[len(ids) - len(prompt) : len(ids) - len(prompt) + self.depth]
        wrong = [(t + 1) % 256 for t in right]
        return DraftTree.chain(wrong).with_chain(right)


def test_a_right_second_branch_is_found_and_the_cache_follows_it(tiny):
    reference = generate(tiny, PROMPTS, max_new_tokens=25)
    oracle = BranchOracle({tuple(p): s for p, s in zip(PROMPTS, reference.sequences, strict=True)}, depth=3)
    out = SpeculativeGenerator(oracle, 1, TreeShape()).generate(tiny, PROMPTS, max_new_tokens=25)
    assert out.sequences == reference.sequences
    assert out.stats["mean_accepted_len"] > 3.5  # 3 drafts + the target's token a round (the last round is shorter)


@pytest.mark.parametrize(("shape", "lookup"), [(TreeShape(4, 3, 2, 2), 0), (TreeShape(8, 4, 3, 3), 4), (TreeShape(3, 3, 1, 2), 6)])
def test_eagle_trees_with_and_without_lookup_give_the_greedy_output(tiny, shape, lookup):
    torch.manual_seed(0)
    loaded = LoadedDraft(EagleDraft(EagleConfig.for_target(tiny.model)), torch.arange(200), {})
    reference = generate(tiny, PROMPTS, max_new_tokens=30)
    out = SpeculativeGenerator(EagleDrafter(loaded), 1, shape, lookup=lookup).generate(tiny, PROMPTS, max_new_tokens=30)
    assert out.sequences == reference.sequences
    assert out.stats["draft_tokens"] > 0


def test_lookup_proposes_what_followed_the_latest_occurrence():
    lookup = NgramLookup(max_ngram=3, min_ngram=2)
    assert lookup.propose([1, 2, 3, 4, 9, 1, 2, 3], 3) == [4, 9, 1]  # the 3-gram 1 2 3 was followed by 4 9 1
    lookup.reset()
    ids = [1, 2, 5, 1, 2, 6, 1, 2]
    assert lookup.propose(ids, 2) == [6, 1]  # the latest 1 2 was followed by 6, not 5
    ids += [7, 8]
    assert lookup.propose(ids, 4) == []  # "2 7 8" / "7 8" never seen before
    ids += [1, 2, 7]
    assert lookup.propose(ids, 4) == [8, 1, 2, 7]  # the index grew with ids: "2 7" was followed by 8
    assert lookup.propose(ids, 0) == []
    assert lookup.propose([7, 5, 5, 5], 4) == [5, 5, 5, 5]  # period 1 (a model stuck on a token): continued cyclically
    assert lookup.propose([1, 2, 3, 1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]  # period 3, past the end


def test_prompt_lookup_alone_is_exact_and_accepts_repeats(tiny):
    prompts = [[3, 4, 5, 6] * 4, [9, 8, 7]]
    reference = generate(tiny, prompts, max_new_tokens=30)
    out = SpeculativeGenerator(LookupOnly(), 1, lookup=4).generate(tiny, prompts, max_new_tokens=30)
    assert out.sequences == reference.sequences
    assert out.stats["mean_accepted_len"] > 1.0  # the random tiny model repeats itself, the lookup finds it


def test_method_takes_tree_and_lookup_and_names_bad_values(tiny, tmp_path):
    ctx = TrialContext(seed=0, workdir=tmp_path / "trial")
    method = Speculative()
    subject = method.transform(tiny, {"draft": "lookup", "lookup": 3, "prompts": 2, "new_tokens": 12}, ctx)
    assert subject.info["speculative"]["lookup"] == 3 and subject.info["speculative"]["tree"] is None
    assert method.measure(subject, ctx)["spec_matches_greedy"] == 1.0
    subject = method.transform(tiny, {"draft": "self", "skip": 1, "tree": "nodes=4", "lookup": 2}, ctx)
    assert subject.info["speculative"]["tree"] is None and subject.generator.tree is None  # only EAGLE drafts trees; a search may pair them
    for params, field in [({"draft": "eagle", "tree": "nodes=0"}, "speculative.tree"), ({"draft": "self", "lookup": -1}, "speculative.lookup"),
                          ({"draft": "lookup", "lookup": 0}, "speculative.lookup"), ({"draft": "self", "lookup_max": -2}, "speculative.lookup_max")]:
        with pytest.raises(ConfigError, match=field):
            method.transform(tiny, params, ctx)


@pytest.mark.skipif(dense_cpu_kernel() is None, reason="the dense CPU kernel is not built here: the draft keeps fp32 weights")
def test_the_draft_reads_bf16_weights_through_the_kernel_and_widens_them_elsewhere(tiny):
    loaded = LoadedDraft(EagleDraft(EagleConfig.for_target(tiny.model)), torch.arange(200), {})
    drafter = EagleDrafter(loaded)
    assert drafter.bf16 and drafter.draft.qkv.weight.dtype == torch.bfloat16
    assert loaded.draft.qkv.weight.dtype == torch.float32  # a copy: the loaded draft is untouched
    weight = drafter.draft.qkv.weight
    x = torch.randn(40, weight.shape[1])  # more rows than the kernel takes: torch's path, the weight widened
    with torch.no_grad():
        torch.testing.assert_close(kernel_linear(x, weight), x @ weight.float().T)
        with fast_linears(drafter.draft):
            torch.testing.assert_close(drafter.draft.qkv(x[:3]), x[:3] @ weight.float().T, rtol=1e-5, atol=1e-5)


class CountingDrafter:
    """A chain drafter that is always wrong and counts how often it is asked."""

    feature_layers = ()

    def __init__(self) -> None:
        self.calls = 0

    def start(self, target):
        pass

    def propose(self, ids, features, k):
        self.calls += 1
        return [255] * k


def test_a_growing_lookup_looks_further_on_a_streak_and_skips_the_draft_model(tiny):
    prompts = [[3, 4, 5, 6] * 4, [9, 8, 7]]
    reference = generate(tiny, prompts, max_new_tokens=40)
    fixed, growing = CountingDrafter(), CountingDrafter()
    out_fixed = SpeculativeGenerator(fixed, 1, lookup=2).generate(tiny, prompts, max_new_tokens=40)
    out_growing = SpeculativeGenerator(growing, 1, lookup=2, lookup_max=8).generate(tiny, prompts, max_new_tokens=40)
    assert out_fixed.sequences == out_growing.sequences == reference.sequences
    assert out_growing.stats["mean_accepted_len"] > out_fixed.stats["mean_accepted_len"]  # up to 8 + 1 a round instead of 2 + 1
    rounds = out_growing.tokens_sequential - len(prompts)
    assert fixed.calls == out_fixed.tokens_sequential - len(prompts)  # without growth the model drafts every round
    assert growing.calls < rounds  # on a streak the lookup alone is verified
    with pytest.raises(ValueError, match="lookup_max"):
        SpeculativeGenerator(fixed, 1, lookup=4, lookup_max=2)


def test_a_round_never_verifies_more_than_the_exact_kernels_take(tiny, monkeypatch):
    """A lookup streak growing to 32 would verify 33 tokens, past the rows whose bits the kernels keep: it is cut to 15."""
    import paretolab.plugins.speculative.generator as generator

    blocks = []
    real_lean, real_forward = generator.lean_forward, generator.forward_with_cache
    monkeypatch.setattr(generator, "lean_forward", lambda m, ids, *a, **k: (blocks.append(ids.shape[1]), real_lean(m, ids, *a, **k))[1])
    monkeypatch.setattr(generator, "forward_with_cache", lambda m, ids, *a, **k: (blocks.append(ids.shape[1]), real_forward(m, ids, *a, **k))[1])
    prompts = [[3, 4, 5, 6] * 8]
    reference = generate(tiny, prompts, max_new_tokens=80)
    out = SpeculativeGenerator(CountingDrafter(), 1, lookup=4, lookup_max=32).generate(tiny, prompts, max_new_tokens=80)
    assert out.sequences == reference.sequences
    assert max(blocks[1:]) == generator.MAX_DRAFTS + 1 == 16  # the prefill aside, the streak reached the cap and stayed there
    with pytest.raises(ValueError, match="at most 15 drafts"):
        SpeculativeGenerator(CountingDrafter(), 16)
    with pytest.raises(ValueError, match="tree nodes=20"):
        SpeculativeGenerator(CountingDrafter(), 2, tree=TreeShape(nodes=20))
