"""Incremental BPE of one pre-token, in plain Python: the readable reference for the C fast path.

For every prefix end ``i`` of a word we keep ``last[i]``, the last token of BPE(word[:i]) as a
node of the suffix forest (``_forest.py``). Then BPE(word[:i]) is the chain ``last[i]``,
``last[i - len(last[i])]``, ... back to 0, because BPE is closed under cutting at its own token
boundaries (merges never cross a final boundary, so the prefix replays exactly its own merges).
``last[i]`` is the longest token ending at ``i`` that passes the forest's interval test
(``SuffixForest.ends_here``: one lookup of ``last`` and two comparisons). An Aho–Corasick
automaton over the vocabulary lists the candidates: its state is the longest suffix that is a
prefix of some token, and dictionary links walk the tokens that are suffixes of it, longest
first. Work per byte: one amortised automaton step plus at most ``max_candidates`` tests.

Eager output (``EagerWord``): a token can still change only if a future token could start
before its end. Future tokens start inside the *window* ``[i - depth(state), i]`` (``depth`` is
the length of the automaton's state). Every position in the window keeps its chain alive
(reference counts: children + window membership); positions that leave the window release
their chain, dead chains are freed at once. When the last emitted boundary (the root) is out of
the window and has a single live child, every possible future chain goes through that child:
its token is final. Each position is created, released and emitted once: amortised O(1) work
per byte besides the candidate tests.
"""

from __future__ import annotations

from paretolab.plugins.incremental_bpe._forest import Positions, SuffixForest, build_forest
from paretolab.plugins.incremental_bpe._vocab import BPETables


class Automaton:
    """Aho–Corasick automaton over the bytes of every reachable token; ``token`` holds forest nodes."""

    def __init__(self, tables: BPETables, forest: SuffixForest) -> None:
        self.children: list[dict[int, int]] = [{}]
        self.token: list[int] = [-1]  # token whose bytes equal this state's string
        self.depth: list[int] = [0]
        for tid, data in enumerate(tables.token_bytes):
            if not data or not tables.reachable[tid]:
                continue
            node = 0
            for b in data:
                nxt = self.children[node].get(b)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][b] = nxt
                    self.children.append({})
                    self.token.append(-1)
                    self.depth.append(self.depth[node] + 1)
                node = nxt
            self.token[node] = forest.node_of[tid]
        self.fail = [0] * len(self.children)
        self.dict_link = [-1] * len(self.children)  # longest proper suffix state that is a token
        order = list(self.children[0].values())
        for node in order:  # breadth-first: a node's fail link is computed before its children's
            for b, child in self.children[node].items():
                f = self.fail[node]
                while f and b not in self.children[f]:
                    f = self.fail[f]
                target = self.children[f].get(b, 0)
                self.fail[child] = target if target != child else 0
                link = self.fail[child]
                self.dict_link[child] = link if self.token[link] >= 0 else self.dict_link[link]
                order.append(child)

    def step(self, state: int, byte: int) -> int:
        """The state after reading ``byte``."""
        children, fail = self.children, self.fail
        while state and byte not in children[state]:
            state = fail[state]
        return children[state].get(byte, 0)

    def tokens_ending_here(self, state: int) -> list[int]:
        """Every token (as a forest node) that is a suffix of the text read so far, longest first."""
        out = []
        node = state if self.token[state] >= 0 else self.dict_link[state]
        while node > 0:
            out.append(self.token[node])
            node = self.dict_link[node]
        return out


class ReferenceBPE:
    """Word-level incremental BPE over a byte-level vocabulary."""

    def __init__(self, tables: BPETables) -> None:
        self.tables = tables
        self.forest = build_forest(tables)
        self.automaton = Automaton(tables, self.forest)
        self.length = self.forest.length  # by node
        self.tests = 0  # interval tests made so far (the per-byte bound is checked on this)

    def last_token(self, last: Positions, end: int, state: int) -> int:
        """The node of the last token of BPE(word[:end]) given ``last`` for every shorter prefix."""
        for u in self.automaton.tokens_ending_here(state):
            self.tests += 1
            if self.forest.ends_here(u, last, end):
                return u
        raise AssertionError("no candidate passes: the vocabulary breaks BPE's invariants")

    def encode_word(self, word: bytes) -> list[int]:
        """BPE of one pre-token (its raw bytes)."""
        byte_token = self.tables.byte_token
        last = [0]
        state = 0
        for b in word:
            if byte_token[b] < 0:
                continue  # `tokenizers` drops bytes missing from the vocabulary
            state = self.automaton.step(state, b)
            last.append(self.last_token(last, len(last), state))
        out = []
        end = len(last) - 1
        while end > 0:
            out.append(self.forest.token[last[end]])
            end -= self.length[last[end]]
        return out[::-1]

    def eager_word(self) -> EagerWord:
        return EagerWord(self)


class EagerWord:
    """BPE of one pre-token fed in pieces; ``push`` returns tokens that can no longer change."""

    def __init__(self, bpe: ReferenceBPE) -> None:
        self._bpe = bpe
        self._reset()

    def _reset(self) -> None:
        self._state = 0
        self._end = 0  # bytes in the word so far (after dropping unknown bytes)
        self._base = 0  # position of _last[0] / _refs[0]
        self._last = [0]  # node of the last token of BPE(word[:pos]) at index pos - base
        self._refs = [1]  # live children + 1 if the position is in the window
        self._root = 0  # last emitted boundary
        self._window = 0  # left end of the window
        self._scan = 1  # no live position lies in (root, scan) (dead ones are skipped once)

    def push(self, data: bytes) -> list[int]:
        """Append bytes; return the tokens that became final."""
        bpe = self._bpe
        byte_token, length, step = bpe.tables.byte_token, bpe.length, bpe.automaton.step
        depth = bpe.automaton.depth
        out: list[int] = []
        for b in data:
            if byte_token[b] < 0:
                continue
            self._state = step(self._state, b)
            self._end += 1
            end, base = self._end, self._base
            u = bpe.last_token(_Shifted(self._last, base), end, self._state)
            self._last.append(u)
            self._refs.append(1)
            self._refs[end - length[u] - base] += 1
            window = end - depth[self._state]
            for pos in range(self._window, window):
                self._release(pos)
            self._window = window
            self._emit(out)
        return out

    def finish(self) -> list[int]:
        """The word ended: return every token not returned yet and start a new word."""
        length, base = self._bpe.length, self._base
        out = []
        pos = self._end
        while pos > self._root:
            u = self._last[pos - base]
            out.append(self._bpe.forest.token[u])
            pos -= length[u]
        self._reset()
        return out[::-1]

    def _release(self, pos: int) -> None:
        length, base, refs, last = self._bpe.length, self._base, self._refs, self._last
        while True:
            refs[pos - base] -= 1
            if refs[pos - base] or pos <= self._root:
                return
            pos -= length[last[pos - base]]

    def _emit(self, out: list[int]) -> None:
        refs, base = self._refs, self._base
        while self._root < self._window and refs[self._root - base] == 1:
            pos = max(self._scan, self._root + 1)
            while refs[pos - base] == 0:
                pos += 1
            out.append(self._bpe.forest.token[self._last[pos - base]])
            self._root, self._scan = pos, pos + 1
        if self._root - base > 4096 and self._root - base > len(self._last) // 2:
            cut = self._root - base  # forget emitted positions (keeps memory bounded on long words)
            del self._last[:cut], self._refs[:cut]
            self._base = self._root


class _Shifted:
    """``seq[i - base]`` seen as ``seq[i]`` (absolute positions over a trimmed list)."""

    __slots__ = ("base", "seq")

    def __init__(self, seq: list[int], base: int) -> None:
        self.seq, self.base = seq, base

    def __getitem__(self, i: int) -> int:
        return self.seq[i - self.base]
