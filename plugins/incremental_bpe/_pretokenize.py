"""The GPT-2 pre-tokenizer as a resumable scanner, plus verbatim splitting on added tokens.

`tokenizers`' ByteLevel pre-tokenizer splits text with (Oniguruma, leftmost-first alternation)::

    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

Read as rules at the start of a pre-token:

1. ``'`` followed by s, t, m, d (or re, ve, ll; case-sensitive) is a contraction;
2. an optional single space (U+0020 only) then a run of one class: letters, numbers or OTHER
   (anything else that is not whitespace; ``'`` included);
3. otherwise a whitespace run; if a non-space char follows it, the run's last char is left to
   start the next pre-token (the ``(?!\\S)`` backtrack) unless the run is that one char.

A stream only knows a pre-token has ended once it sees the char after it, and only knows a char
belongs to the current pre-token in some cases (a letter after letters: yes; the last char of a
whitespace run: not yet; ``'l``: not until the next char). ``Scanner.feed`` hands out exactly the
chars that are certain, so BPE can start on a long pre-token before it ends.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from paretolab.plugins.incremental_bpe._unicode_classes import (
    LETTER,
    LETTER_RANGES,
    NUMBER,
    NUMBER_RANGES,
    OTHER,
    SPACE,
    SPACE_RANGES,
    class_table,
)
from paretolab.plugins.incremental_bpe._vocab import SpecialToken

END = None  # marks the end of a pre-token in a Scanner's output
_NONE, _RUN, _WS = 0, 1, 2


@lru_cache(maxsize=1)
def char_classes() -> bytearray:
    """The class of every code point (shared, built once: 1.1 MB)."""
    return class_table()


def _charset(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ranges)


@lru_cache(maxsize=1)
def _run_patterns() -> dict[int, re.Pattern[str]]:
    letters, numbers, spaces = _charset(LETTER_RANGES), _charset(NUMBER_RANGES), _charset(SPACE_RANGES)
    return {
        LETTER: re.compile(f"[{letters}]*"),
        NUMBER: re.compile(f"[{numbers}]*"),
        SPACE: re.compile(f"[{spaces}]*"),
        OTHER: re.compile(f"[^{letters}{numbers}{spaces}]*"),
    }


class Scanner:
    """Splits a stream of text into pre-tokens; ``feed`` returns certain pieces and END marks.

    Concatenating the pieces between two END marks gives one pre-token. Nothing is returned
    twice and nothing is returned before it is certain; ``feed(..., at_end=True)`` flushes.
    """

    def __init__(self) -> None:
        self._classes = char_classes()
        self._runs = _run_patterns()
        self._held = ""  # chars seen but not yet handed out
        self._mode = _NONE
        self._run_class = OTHER
        self._ws_len = 0  # chars of the current whitespace pre-token seen (the last one may be held)

    def feed(self, new: str, at_end: bool = False) -> list[str | None]:
        """Scan ``new`` after what came before; ``at_end`` says no more text follows."""
        text = self._held + new
        n = len(text)
        out: list[str | None] = []
        i = 1 if self._mode == _WS and self._ws_len >= 2 else 0
        while True:
            if self._mode == _RUN:
                j = self._runs[self._run_class].match(text, i).end()
                if j > i:
                    out.append(text[i:j])
                i = j
                if j == n and not at_end:
                    self._held = ""
                    return out
                out.append(END)
                self._mode = _NONE
            elif self._mode == _WS:
                j = self._runs[SPACE].match(text, i).end()
                if j > i:
                    # All but the newest whitespace char are now certain; the newest is held.
                    start = i - 1 if self._ws_len >= 2 else i
                    if j - 1 > start:
                        out.append(text[start : j - 1])
                    self._ws_len += j - i
                if j == n and not at_end:
                    self._held = text[n - 1 :] if self._ws_len >= 2 else ""
                    return out
                if j == n:  # end of text: the whole run is the pre-token
                    if self._ws_len >= 2:
                        out.append(text[n - 1 :])
                    i = n
                elif self._ws_len >= 2:  # the last whitespace char starts the next pre-token
                    i = j - 1
                else:
                    i = j
                out.append(END)
                self._mode = _NONE
            else:
                if i == n:
                    self._held = ""
                    return out
                step = self._start(text, i, at_end, out)
                if step == 0:
                    self._held = text[i:]
                    return out
                i += step

    def _start(self, text: str, i: int, at_end: bool, out: list[str | None]) -> int:
        """Begin a pre-token at ``i``; return chars consumed, 0 when more text is needed."""
        n = len(text)
        c = text[i]
        if c == "'":
            a = text[i + 1] if i + 1 < n else ""
            b = text[i + 2] if i + 2 < n else ""
            if a in ("s", "t", "m", "d") and a:
                out.extend((text[i : i + 2], END))
                return 2
            if not at_end and (a == "" or (a in ("r", "v", "l") and b == "")):
                return 0
            if a + b in ("re", "ve", "ll"):
                out.extend((text[i : i + 3], END))
                return 3
        elif c == " ":
            if i + 1 == n:
                if not at_end:
                    return 0
                out.extend((" ", END))
                return 1
            nxt = self._classes[ord(text[i + 1])]
            if nxt != SPACE:
                self._mode, self._run_class = _RUN, nxt
                out.append(text[i : i + 2])
                return 2
        kind = self._classes[ord(c)]
        if kind == SPACE:
            self._mode, self._ws_len = _WS, 1
        else:
            self._mode, self._run_class = _RUN, kind
        out.append(c)
        return 1


def pretokenize(text: str) -> list[str]:
    """Split a whole text into pre-tokens (the batch view of ``Scanner``)."""
    words: list[str] = []
    current: list[str] = []
    for piece in Scanner().feed(text, at_end=True):
        if piece is END:
            words.append("".join(current))
            current = []
        else:
            current.append(piece)
    return words


class SpecialSplitter:
    """Finds added tokens in raw text the way `tokenizers` does: leftmost, then longest.

    One regex factored as a trie (``<`` then one branch per next character, ...): at every
    position the engine reads each character once, so runs of the tokens' first character
    (``"<" * 20000``) cost no more than other text; a flat alternation retried all 17 tokens
    at every ``<`` (3x the per-byte cost of prose).
    """

    def __init__(self, specials: list[SpecialToken]) -> None:
        self._ids = {s.content: s.id for s in specials if s.content}
        self._pattern = re.compile(_trie_regex(sorted(self._ids))) if self._ids else None
        self._prefixes = {s[:k] for s in self._ids for k in range(1, len(s))}
        self._longest = max(map(len, self._ids), default=0)

    @property
    def active(self) -> bool:
        return self._pattern is not None

    def matches(self, text: str) -> Iterator[tuple[int, int, int]]:
        """``(start, end, id)`` of every added token in ``text``, leftmost-longest, non-overlapping."""
        if self._pattern is not None:
            for m in self._pattern.finditer(text):
                yield m.start(), m.end(), self._ids[m.group()]

    def split(self, text: str) -> list[str | int]:
        """Text pieces and special-token ids, in order (empty text pieces left out)."""
        parts: list[str | int] = []
        at = 0
        for start, end, tid in self.matches(text):
            if start > at:
                parts.append(text[at:start])
            parts.append(tid)
            at = end
        if at < len(text):
            parts.append(text[at:])
        return parts

    def first(self, text: str) -> tuple[int, int, int | None]:
        """For streaming: ``(start, end, id)`` of the first added token, or of text that might
        still become one (then ``id`` is None and ``end == len(text)``); ``(len, len, None)``
        when neither occurs."""
        n = len(text)
        m = next(self.matches(text), None)
        full_at = m[0] if m else n
        for p in range(max(0, n - self._longest + 1), min(full_at + 1, n)):
            if text[p:] in self._prefixes:
                return p, n, None  # a longer or earlier added token may still be completed
        if m:
            return m
        return n, n, None


def _trie_regex(words: list[str]) -> str:
    """A regex matching any of ``words``, longest first, with shared prefixes factored out."""
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def render(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + render(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:  # a word ends here: try the longer ones first, then stop here
            return "(?:" + body + ")?"
        return body

    return render(trie)
