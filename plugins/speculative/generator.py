"""Speculative decoding with exact greedy verification, for any drafter.

A drafter proposes up to ``k`` tokens; the target scores them all in one cached forward; the
longest prefix that matches the target's own greedy choices is kept, plus the target's next
token (the "bonus" token), and the target's KV cache is cropped back to the kept tokens. The
output is therefore the target's greedy output, token for token, whatever the drafter proposes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from paretolab.generation import Generation, forward_with_cache
from paretolab.generation.lean import LeanCache, lean_forward
from paretolab.kernels.dense_cpu import MAX_ROWS as KERNEL_MAX_ROWS
from paretolab.kernels.dense_cpu import fast_linears
from paretolab.kernels.lean_cpu import MAX_TOKENS as LEAN_C_MAX_TOKENS
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.speculative.lookup import NgramLookup
from paretolab.plugins.speculative.tree import DraftTree, TreeShape, accept, block_layout

if TYPE_CHECKING:
    from paretolab.plugin_api.context import TrialContext
    from paretolab.plugin_api.subject import Subject


class Drafter(Protocol):
    """Proposes continuations; keeps whatever state it needs between calls for one prompt.

    ``modules`` are the drafter's own modules (the generator runs their linears through the CPU
    kernel too; a drafter that reuses the target's weights has none). ``feature_layers`` lists target decoder layers whose outputs the drafter wants (EAGLE reads
    the target's hidden states); the generator hands them over for every position the target
    has verified. ``propose(ids, features, k)`` gets every token so far (prompt + accepted),
    the target features of the positions verified since the last call — a tensor (n, F) or
    ``None`` — and returns up to ``k`` draft tokens that would follow ``ids``.
    """

    feature_layers: tuple[int, ...]
    modules: tuple[torch.nn.Module, ...]

    def start(self, target: torch.nn.Module) -> None: ...

    def propose(self, ids: list[int], features: torch.Tensor | None, k: int) -> list[int]: ...


def crop_cache(cache: Any, length: int) -> None:
    """Cut a KV cache back to its first ``length`` positions (negative crop: transformers 4.4x and 5.x)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class TargetFeatures:
    """While active, records the outputs of chosen target decoder layers on every forward: (T, len(layers)*D)."""

    def __init__(self, model: torch.nn.Module, layers: Sequence[int]) -> None:
        self.model, self.layers = model, tuple(layers)
        self.outputs: dict[int, torch.Tensor] = {}
        self.handles: list[Any] = []

    def __enter__(self) -> TargetFeatures:
        blocks = decoder_layers(self.model)
        for index in self.layers:
            self.handles.append(blocks[index].register_forward_hook(self._recorder(index)))
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _recorder(self, index: int) -> Any:
        def record(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.outputs[index] = (output[0] if isinstance(output, tuple) else output).detach()

        return record

    def last(self) -> torch.Tensor | None:
        """Features of the last forward's positions (batch 1): (T, F), or None when no layer is watched."""
        if not self.layers:
            return None
        return torch.cat([self.outputs[i][0] for i in self.layers], dim=-1)


# Drafts a round verifies at most: the root and they (one block) stay within what the dense kernel and the lean
# forward's C operations take, whose rows get the bits they get alone, so the verify reproduces greedy decoding exactly.
MAX_DRAFTS = min(KERNEL_MAX_ROWS, LEAN_C_MAX_TOKENS) - 1


class SpeculativeGenerator:
    """Draft ``k`` tokens (or a token tree), verify them in one target forward, keep the longest greedy-matching path.

    Prompts are decoded one at a time (batch 1). ``stats`` reports ``mean_accepted_len``: the
    mean number of tokens each verification forward emits (accepted drafts plus the target's own
    token; 1.0 means no draft was ever accepted, k + 1 is the ceiling).

    ``tree``: a drafter with ``propose_tree`` (EAGLE) drafts a tree of that shape instead of a
    chain of k, verified in one forward with a tree attention mask; that needs the lean forward
    (:func:`~paretolab.generation.lean.lean_supported`), and a model without it falls back to the chain.
    ``lookup``: up to that many prompt-lookup tokens join the drafts as one more branch (also a
    tree, so also lean-only). ``lookup_max`` > ``lookup``: while a round accepts the lookup's whole
    chain, the next round looks twice as far ahead (up to ``lookup_max``) and skips the draft model
    (the text is repeating itself; transformers' assisted generation grows its draft length on
    full acceptance the same way); the first miss goes back to ``lookup`` and the model.
    A round verifies at most ``MAX_DRAFTS`` (15) drafts: a lookup chain is cut to fit beside the tree.
    """

    def __init__(self, drafter: Drafter, k: int, tree: TreeShape | None = None, lookup: int = 0, lookup_max: int | None = None) -> None:
        if k < 1:
            raise ValueError(f"speculative decoding needs k >= 1 draft tokens, got k={k}")
        if k > MAX_DRAFTS or (tree is not None and tree.nodes > MAX_DRAFTS):
            raise ValueError(f"a round verifies at most {MAX_DRAFTS} drafts (its block of drafts + 1 must stay within the kernels whose "
                             f"rows keep their bits, so that the output is greedy's); got k={k}"
                             f"{'' if tree is None else f', tree nodes={tree.nodes}'}: choose {MAX_DRAFTS} or fewer")
        if lookup < 0:
            raise ValueError(f"lookup (prompt-lookup tokens added to each draft tree) must be >= 0, got {lookup}")
        if lookup_max is not None and lookup_max < lookup:
            raise ValueError(f"lookup_max must be >= lookup ({lookup}), got {lookup_max}")
        self.drafter, self.k, self.tree, self.lookup = drafter, k, tree, lookup
        self.lookup_max = lookup if lookup_max is None else lookup_max
        self.ngrams = NgramLookup()

    def generate(
        self,
        subject: Subject,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int,
        stop_ids: Sequence[int] = (),
        ctx: TrialContext | None = None,
    ) -> Generation:
        modules = (subject.model, *getattr(self.drafter, "modules", ()))
        with fast_linears(*modules):  # a no-op where the kernel is off (PARETOLAB_CPU_KERNELS=0) or the model is not on the CPU
            total = Generation.concat([self._one(subject.model, list(prompt), max_new_tokens, set(stop_ids)) for prompt in prompts])
        rounds = total.stats["rounds"]
        total.stats = {"mean_accepted_len": total.stats["emitted"] / rounds if rounds else 1.0, "draft_tokens": total.stats["drafted"]}
        return total

    def _draft(self, ids: list[int], features: torch.Tensor | None, room: int, tree: bool, lookup: int,
               streak: bool) -> tuple[DraftTree, list[int]]:
        """(this round's drafts, the prompt-lookup chain among them): a chain, or a tree no deeper than ``room``.

        On a lookup ``streak`` (its whole chain was accepted last round) the lookup's chain alone is
        verified: the draft model is not run that round.
        """
        if room < 1:
            return DraftTree(), []
        chain = self.ngrams.propose(ids, min(lookup, room, MAX_DRAFTS)) if tree and lookup else []
        if chain and streak:
            return DraftTree.chain(chain), chain
        if tree and self.tree is not None and hasattr(self.drafter, "propose_tree"):
            drafts = self.drafter.propose_tree(ids, features, self.tree).limit_depth(room)  # type: ignore[attr-defined]
        else:
            drafts = DraftTree.chain(self.drafter.propose(ids, features, min(self.k, room)))
        while chain and len(drafts.with_chain(chain).tokens) > MAX_DRAFTS:  # the block must stay within the exact kernels
            chain = chain[:-1]
        return drafts.with_chain(chain), chain

    @torch.no_grad()
    def _one(self, model: torch.nn.Module, prompt: list[int], max_new: int, stop: set[int]) -> Generation:
        """One prompt; stats hold the counts (rounds, emitted, drafted) that :meth:`generate` turns into ratios."""
        device = next(model.parameters()).device
        run = {"rounds": 0.0, "emitted": 0.0, "drafted": 0.0}
        with TargetFeatures(model, self.drafter.feature_layers) as watch:
            start = time.perf_counter()
            logits, cache = forward_with_cache(model, torch.tensor([prompt], device=device), last_only=True)
            ids = [*prompt, int(logits[0, -1].argmax())]
            features = watch.last()  # target features of the positions the drafter has not been given yet
            prefill_s = time.perf_counter() - start
            self.drafter.start(model)
            self.ngrams.reset()
            tree = isinstance(cache, LeanCache) and (hasattr(self.drafter, "propose_tree") or self.lookup > 0)
            lookup, streak = self.lookup, False
            # Invariant: the target's cache holds every position but the last token of `ids`.
            while len(ids) - len(prompt) < max_new and ids[-1] not in stop:
                draft, chain = self._draft(ids, features, max_new - (len(ids) - len(prompt)) - 1, tree, lookup, streak)
                given = not (chain and streak)  # the drafter saw this round's features
                block, parents = draft.block(ids[-1])
                base = len(ids) - 1
                if draft.is_chain():
                    logits, cache = forward_with_cache(model, torch.tensor([block], device=device), cache)
                else:
                    depth, mask = block_layout(parents, device)
                    logits, cache = lean_forward(model, torch.tensor([block], device=device), cache, positions=base + depth, block_mask=mask)
                path, bonus = accept(block, parents, logits[0].argmax(-1).tolist())
                if path == list(range(len(path))):
                    crop_cache(cache, base + len(path))
                else:
                    cache.keep(base, path)
                accepted = [*(block[i] for i in path[1:]), bonus]
                if self.lookup_max > self.lookup:  # a lookup chain accepted whole: the text repeats, look further ahead
                    streak = bool(chain) and accepted[: len(chain)] == chain
                    lookup = min(2 * lookup, self.lookup_max) if streak else self.lookup
                feats = watch.last()
                if feats is not None:
                    features = feats[path] if given or features is None else torch.cat([features, feats[path]])
                stopped = next((i for i, token in enumerate(accepted) if token in stop), None)
                if stopped is not None:  # what follows the stop token is never output, so it is not accepted
                    accepted = accepted[: stopped + 1]
                ids.extend(accepted)
                run["rounds"] += 1
                run["emitted"] += len(accepted)
                run["drafted"] += len(draft.tokens)
                if stopped is not None:
                    break
            decode_s = time.perf_counter() - start - prefill_s
        new = ids[len(prompt) :]
        for i, token in enumerate(new):
            if token in stop:
                new = new[: i + 1]
                break
        new = new[:max_new]
        return Generation([new], len(new), 1 + int(run["rounds"]), prefill_s, decode_s, run)
