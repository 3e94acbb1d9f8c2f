"""Token trees for speculative decoding: several candidate continuations verified in one target forward.

A chain of k drafts is wasted from its first miss on; a tree spends the same verify forward on
the draft's best alternatives (EAGLE-2, Li et al. 2024: "dynamic draft trees"). A tree is a list
of draft tokens, each with the index of its parent in the list (-1: the root, the last token the
target chose). The verify block is [root, *tokens]; each block token sees the whole past plus its
own ancestors (``block_mask``) and sits at the position its depth says (``positions``). The target's
greedy token after each node then names at most one child to follow: the accepted path is walked
from the root while the target's choice is a child, and the target's choice after the last node
on the path is the bonus token. The output is the target's greedy output, exactly as for a chain.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class TreeShape:
    """How big a draft tree may grow: ``nodes`` draft tokens verified per round, at most ``depth`` deep.

    The draft expands the ``width`` most probable nodes at each depth (by the product of the draft
    probabilities along their path), ``topk`` children each, then keeps the ``nodes`` most probable
    of everything it proposed (a set closed under parents, since a child is never more probable
    than its parent).
    """

    nodes: int = 8
    depth: int = 4
    width: int = 3
    topk: int = 3

    def __post_init__(self) -> None:
        for name in ("nodes", "depth", "width", "topk"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"TreeShape.{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def parse(cls, text: str) -> TreeShape:
        """``"nodes=8,depth=4,width=3,topk=3"`` (any subset; the rest default)."""
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, value = part.partition("=")
            if key not in cls.__dataclass_fields__ or not value.strip().isdigit():
                raise ValueError(f"tree shape {text!r}: expected comma-separated name=integer with names "
                                 f"{', '.join(cls.__dataclass_fields__)}; bad part {part!r}")
            values[key] = int(value)
        return cls(**values)


@dataclass
class DraftTree:
    """Draft tokens and their parents (-1: the root); parents come before their children."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents) or any(not -1 <= p < i for i, p in enumerate(self.parents)):
            raise ValueError(f"a draft tree's parents must precede their nodes: tokens {self.tokens}, parents {self.parents}")

    @classmethod
    def chain(cls, tokens: list[int]) -> DraftTree:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)))

    def is_chain(self) -> bool:
        return self.parents == list(range(-1, len(self.parents) - 1))

    def with_chain(self, tokens: list[int]) -> DraftTree:
        """This tree with the path ``tokens`` from the root added (sharing the nodes it already has)."""
        out = DraftTree(list(self.tokens), list(self.parents))
        children = {(p, t): i for i, (p, t) in enumerate(zip(self.parents, self.tokens))}
        at = -1
        for token in tokens:
            nxt = children.get((at, token))
            if nxt is None:
                nxt = children[(at, token)] = len(out.tokens)
                out.tokens.append(token)
                out.parents.append(at)
            at = nxt
        return out

    def limit_depth(self, depth: int) -> DraftTree:
        """The nodes at most ``depth`` deep (a speculative round near max_new_tokens has room for no more)."""
        depths: list[int] = []
        keep: dict[int, int] = {}
        for i, p in enumerate(self.parents):
            depths.append(1 if p < 0 else depths[p] + 1)
            if depths[i] <= depth:
                keep[i] = len(keep)
        return DraftTree([self.tokens[i] for i in keep], [keep[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep])

    def block(self, root: int) -> tuple[list[int], list[int]]:
        """(block tokens [root, *tokens], parent of each block row: -1 for the root, row indices otherwise)."""
        return [root, *self.tokens], [-1, *(p + 1 for p in self.parents)]


def block_layout(parents: list[int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth (T,) long, mask (T, T) bool: row i sees row j iff j is i or one of its ancestors) for block parents."""
    depth: list[int] = []
    rows: list[list[bool]] = []
    for i, p in enumerate(parents):
        depth.append(depth[p] + 1 if p >= 0 else 0)
        row = list(rows[p]) if p >= 0 else [False] * len(parents)
        row[i] = True
        rows.append(row)
    return torch.tensor(depth, device=device), torch.tensor(rows, dtype=torch.bool, device=device)


def accept(block: list[int], parents: list[int], target: list[int]) -> tuple[list[int], int]:
    """(block rows on the accepted path, root first; the target's token after its last row).

    ``target[i]`` is the target's greedy token after block row i (given row i's ancestors).
    """
    children: dict[tuple[int, int], int] = {}
    for i, p in enumerate(parents):
        if p >= 0:
            children.setdefault((p, block[i]), i)  # a duplicate sibling is never reached: the first is
    path = [0]
    while (nxt := children.get((path[-1], target[path[-1]]))) is not None:
        path.append(nxt)
    return path, target[path[-1]]
