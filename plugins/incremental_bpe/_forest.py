"""The suffix forest: a constant-time test for "BPE(text[:i]) ends with token u".

This is the data structure of the incremental-BPE paper (ModelTC/mtc-incremental-bpe calls it the
successor forest), rebuilt from its definition. Every reachable token ``u`` made by the merge
``(left[u], right[u])`` hangs below its *right* part; single bytes are roots. Walking up from a
token therefore visits its right part, that part's right part, ... down to its last byte: the
pieces that sit at the right end of ``u`` while BPE builds it. Children are ordered by merge rank,
latest merge first, and nodes are numbered in that depth-first order, so every subtree, and every
run of children that merge after a given rank, is one interval of node numbers.

*The test.* Let ``L(j)`` be the last token of BPE(text[:j]) and let ``u = p·s`` end at ``i``.
While BPE runs on text[:i], ``u`` appears at its end exactly when ``p`` appears at the end of
text[:i - |s|] and survives there past ``u``'s own merge: ``L(i - |s|)`` lies below ``p`` (its
right spine passes through ``p``) and the merge that took ``p`` into a longer token, if any, comes
after ``u``'s. In node numbers: ``lo[u] <= node(L(i - |s|)) < hi[u]``, where ``[lo, hi)`` covers
``p`` and the subtrees of ``p``'s children that merge after ``u``. The last token of
BPE(text[:i]) is the longest token ending at ``i`` that passes (tokens at the end only grow).

*The bound.* The candidates at ``i`` are the tokens that are suffixes of the automaton's state,
so the work per byte is one automaton step (amortised O(1)) plus at most ``max_candidates``
interval tests, a constant of the vocabulary (computed here; SmolLM2's is in the benchmark), for
any input. The paper reaches O(log² t) per byte with centroid trees over the candidate chains;
with chains this short a linear scan of O(1) tests does fewer steps, and the benchmark measures
the result on inputs built to lengthen them.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Protocol

from paretolab.plugins.incremental_bpe._vocab import NO_RANK, BPETables


class Positions(Protocol):
    """``node_at[j]``: the node of the last token of BPE(word[:j]) (a list, or a trimmed view of one)."""

    def __getitem__(self, j: int) -> int: ...


@dataclass(frozen=True)
class SuffixForest:
    """Node-numbered views of the reachable tokens (node 0 is the virtual root, no token)."""

    token: list[int]  # node -> token id
    node_of: list[int]  # token id -> node, 0 for tokens BPE never outputs whole
    length: list[int]  # node -> bytes
    right_len: list[int]  # node -> bytes of its right part; 0 for single bytes (always pass)
    lo: list[int]  # node -> the interval L(i - right_len) must fall in
    hi: list[int]

    def ends_here(self, u: int, node_at: Positions, end: int) -> bool:
        """The test for node ``u`` ending at ``end``."""
        r = self.right_len[u]
        return r == 0 or self.lo[u] <= node_at[end - r] < self.hi[u]


def build_forest(tables: BPETables) -> SuffixForest:
    """Number the reachable tokens depth-first below their right parts, latest merge first."""
    n = tables.vocab_size
    rank, left, right = tables.rank, tables.left, tables.right
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for t in range(n):
        if not tables.reachable[t] or not tables.token_bytes[t]:
            continue
        (roots if rank[t] == NO_RANK else kids[right[t]]).append(t)
    for children in kids:
        children.sort(key=lambda t: -rank[t])
    neg_ranks = [[-rank[c] for c in children] for children in kids]
    token, node_of, subtree_end = [-1], [0] * n, [0] * n
    stack: list[tuple[int, bool]] = [(t, False) for t in reversed(sorted(roots))]
    while stack:
        t, done = stack.pop()
        if done:
            subtree_end[t] = len(token)
            continue
        node_of[t] = len(token)
        token.append(t)
        stack.append((t, True))
        stack.extend((c, False) for c in reversed(kids[t]))
    size = len(token)
    length = [len(tables.token_bytes[t]) if t >= 0 else 0 for t in token]
    right_len, lo, hi = [0] * size, [0] * size, [size] * size
    for node in range(1, size):
        u = token[node]
        if rank[u] == NO_RANK:
            continue
        p = left[u]
        later = kids[p]  # sorted latest merge first: those merging after u form a prefix
        cut = bisect_left(neg_ranks[p], -rank[u])  # strictly later: a tie is the same merge just left of u, which BPE takes first
        right_len[node] = len(tables.token_bytes[right[u]])
        lo[node] = node_of[p]
        hi[node] = node_of[later[cut]] if cut < len(later) else subtree_end[p]
    return SuffixForest(token, node_of, length, right_len, lo, hi)


def max_candidates(tables: BPETables) -> int:
    """The most tokens that can end at one position: the bound on interval tests per byte.

    A position's candidates are the reachable tokens that are suffixes of the automaton's state,
    which is a prefix of some token; so the bound is the most token suffixes of any token prefix.
    """
    tokens = {b for t, b in enumerate(tables.token_bytes) if b and tables.reachable[t]}
    best = 0
    for data in tokens:
        ends = [0] * (len(data) + 1)  # ends[j]: tokens that are suffixes of data[:j]
        for j in range(1, len(data) + 1):
            ends[j] = sum(data[k:j] in tokens for k in range(j))
        best = max(best, *ends)
    return best
