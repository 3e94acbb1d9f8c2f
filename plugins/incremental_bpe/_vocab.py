"""BPE tables read from a Hugging Face tokenizer, and the two facts the incremental algorithm needs.

Everything here works on token ids and raw bytes (the ByteLevel alphabet is undone once, at load).

*Merge structure.* A trained BPE vocabulary is *consistent*: every merge ``(a, b)`` produces a
distinct token and both parts were produced by earlier merges (or are single bytes). Then BPE
performs merges in increasing rank order, every token ``t`` has one creating merge
``(left[t], right[t])`` at ``rank[t]``, and its merge tree is fixed. ``from_hf`` refuses a
vocabulary that is not consistent rather than tokenizing it wrongly.

*Compatibility* (``compatible(a, b)``: BPE(bytes(a) + bytes(b)) == [a, b]). Put ``a`` left of
``b`` and let BPE run: the only thing that can go wrong is a merge across the seam. At any time
the pair across the seam is (a piece of ``a``'s right spine, a piece of ``b``'s left spine), and
a piece lives from its own rank until its parent's rank. Walking both spines top-down in
reverse time order visits every seam pair once; the pair ``(x, y)`` merges iff its merge rank
``r`` comes before both parents: ``r < parent_rank(x)`` (a tie means the same merge ``(x, x)``
just to the left, and BPE takes the leftmost first) and ``r <= parent_rank(y)`` (a tie means
``(y, y)`` to the right: the seam pair is further left, so it wins). Cost: the two spine depths.

*Reachability.* A token BPE can never output as a whole (``BPE(bytes(t)) != [t]``) must not be a
candidate. ``t`` is reachable iff both parts are and no seam merge happens below the top
(``_no_seam_merge_below_top``).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from paretolab.errors import ConfigError

NO_RANK = -1  # rank of a single-byte token (made by no merge)
INF = 1 << 62


class UnsupportedTokenizerError(ConfigError):
    """The tokenizer uses a feature IncrementalBPE does not reproduce exactly."""


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-char map used by the ByteLevel pre-tokenizer."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@dataclass
class SpecialToken:
    """An added token matched verbatim in the raw text before pre-tokenization."""

    content: str
    id: int


@dataclass
class BPETables:
    """Token bytes and merge structure of one byte-level BPE vocabulary."""

    token_bytes: list[bytes]  # by id; b"" for ids that are not byte-level vocabulary entries
    byte_token: list[int]  # byte value -> token id, -1 when the vocab lacks that byte (HF drops it)
    rank: list[int]  # by id: rank of the creating merge, NO_RANK for single bytes
    left: list[int]  # by id: creating merge's parts (-1 for bytes)
    right: list[int]
    merge_rank: dict[tuple[int, int], int]  # (a, b) -> rank
    merge_result: dict[tuple[int, int], int]  # (a, b) -> merged token id
    reachable: list[bool]  # BPE(bytes(t)) == [t]
    specials: list[SpecialToken]

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def compatible(self, a: int, b: int) -> bool:
        """True iff BPE(bytes(a) + bytes(b)) == [a, b] (both reachable); see the module docstring."""
        return self._seam_clean(a, b, INF, INF)

    def _seam_clean(self, x: int, y: int, px: int, py: int) -> bool:
        rank, left, right, merge_rank = self.rank, self.left, self.right, self.merge_rank
        while True:
            r = merge_rank.get((x, y))
            if r is not None and r < px and r <= py:
                return False
            rx, ry = rank[x], rank[y]
            if rx == NO_RANK and ry == NO_RANK:
                return True
            if rx > ry:  # x was formed after y: before that, the seam pair was (right[x], y)
                px, x = rx, right[x]
            else:
                py, y = ry, left[y]

    def _no_seam_merge_below_top(self, t: int) -> bool:
        """The parts of ``t`` stay apart until their own merge (the top pair itself is allowed)."""
        x, y = self.left[t], self.right[t]
        rx, ry = self.rank[x], self.rank[y]
        if rx == NO_RANK and ry == NO_RANK:
            return True
        if rx > ry:
            return self._seam_clean(self.right[x], y, rx, INF)
        return self._seam_clean(x, self.left[y], INF, ry)


def tables_from_hf(hf_tokenizer: Any) -> BPETables:
    """Read a `transformers`/`tokenizers` tokenizer, refusing anything not reproduced exactly."""
    return tables_from_spec(hf_spec(hf_tokenizer))


def hf_spec(hf_tokenizer: Any) -> str:
    """The tokenizer's serialized spec (``tokenizers.Tokenizer.to_str()``)."""
    return str(getattr(hf_tokenizer, "backend_tokenizer", hf_tokenizer).to_str())


def tables_from_spec(spec_json: str) -> BPETables:
    """Tables from a serialized ``tokenizers`` spec, refusing anything not reproduced exactly."""
    spec = json.loads(spec_json)
    check_supported(spec)
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    specials = [SpecialToken(a["content"], a["id"]) for a in spec.get("added_tokens") or []]
    return build_tables(vocab, merges, specials)


def check_supported(spec: dict[str, Any]) -> None:
    """Raise UnsupportedTokenizerError unless the pipeline is ByteLevel(regex) + BPE, as in GPT-2/SmolLM2."""

    def refuse(what: str, value: object) -> None:
        raise UnsupportedTokenizerError(f"IncrementalBPE reproduces ByteLevel BPE only; {what} is {value!r}")

    if spec.get("normalizer") is not None:
        refuse("normalizer", spec["normalizer"])
    pre = spec.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        refuse("pre_tokenizer", pre)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        refuse("model.type", model.get("type"))
    for key, allowed in (("dropout", (None,)), ("continuing_subword_prefix", ("", None)),
                         ("end_of_word_suffix", ("", None)), ("byte_fallback", (False, None)),
                         ("ignore_merges", (False, None))):  # fmt: skip
        if model.get(key) not in allowed:
            refuse(f"model.{key}", model.get(key))
    for added in spec.get("added_tokens") or []:
        if added.get("normalized") or added.get("lstrip") or added.get("rstrip") or added.get("single_word"):
            refuse("an added token with lstrip/rstrip/single_word/normalized", added["content"])


def build_tables(vocab: dict[str, int], merges: Sequence[tuple[str, str]], specials: Iterable[SpecialToken] = ()) -> BPETables:
    """Tables from a byte-level vocab (GPT-2 alphabet) and ranked merges."""
    byte_to_char = bytes_to_unicode()
    char_to_byte = {c: b for b, c in byte_to_char.items()}
    size = max(vocab.values()) + 1
    token_bytes = [b""] * size
    for text, tid in vocab.items():
        if all(c in char_to_byte for c in text):
            token_bytes[tid] = bytes(char_to_byte[c] for c in text)
    byte_token = [vocab.get(byte_to_char[b], -1) for b in range(256)]
    rank = [NO_RANK] * size
    left = [-1] * size
    right = [-1] * size
    made = [False] * size
    merge_rank: dict[tuple[int, int], int] = {}
    merge_result: dict[tuple[int, int], int] = {}
    for r, (sa, sb) in enumerate(merges):
        a, b, t = vocab.get(sa), vocab.get(sb), vocab.get(sa + sb)
        if a is None or b is None or t is None:
            raise UnsupportedTokenizerError(f"merge #{r} {(sa, sb)!r} names a token missing from the vocabulary")
        parts_ready = all(made[p] or len(token_bytes[p]) == 1 for p in (a, b))
        if made[t] or not parts_ready or len(token_bytes[t]) != len(token_bytes[a]) + len(token_bytes[b]):
            raise UnsupportedTokenizerError(
                f"merge #{r} {(sa, sb)!r} breaks merge consistency (result made twice, or a part made later)"
            )
        made[t] = True
        rank[t], left[t], right[t] = r, a, b
        merge_rank[(a, b)] = r
        merge_result[(a, b)] = t
    tables = BPETables(token_bytes, byte_token, rank, left, right, merge_rank, merge_result, [False] * size, list(specials))
    reachable = tables.reachable
    for b in range(256):
        if byte_token[b] >= 0:
            reachable[byte_token[b]] = True
    for t in sorted((t for t in range(size) if made[t]), key=lambda t: rank[t]):
        reachable[t] = reachable[left[t]] and reachable[right[t]] and tables._no_seam_merge_below_top(t)
    return tables


def bpe_by_merging(tables: BPETables, word: bytes) -> list[int]:
    """Plain BPE of one pre-token, exactly as `tokenizers` does it: the oracle for tests and docs.

    Bytes missing from the vocabulary are dropped (no unk token, no byte fallback), then the
    lowest-rank adjacent pair is merged, leftmost first, until none is left. O(n log n).
    """
    ids = [tables.byte_token[b] for b in word if tables.byte_token[b] >= 0]
    if len(ids) < 2:
        return ids
    nxt = list(range(1, len(ids) + 1))
    prv = list(range(-1, len(ids) - 1))
    alive = [True] * len(ids)
    heap: list[tuple[int, int, int]] = []

    def push(i: int) -> None:
        j = nxt[i]
        if j < len(ids):
            r = tables.merge_rank.get((ids[i], ids[j]))
            if r is not None:
                heapq.heappush(heap, (r, i, tables.merge_result[(ids[i], ids[j])]))

    for i in range(len(ids) - 1):
        push(i)
    while heap:
        r, i, result = heapq.heappop(heap)
        j = nxt[i] if alive[i] else len(ids)
        if j >= len(ids) or tables.merge_result.get((ids[i], ids[j])) != result:
            continue  # stale entry
        ids[i] = result
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] < len(ids):
            prv[nxt[j]] = i
        if prv[i] >= 0:
            push(prv[i])
        push(i)
    return [ids[i] for i in range(len(ids)) if alive[i]]
