"""The mixed-domain corpora the ``tiny-moe`` test bed trains on: ``moe-mix-train`` and ``moe-mix-val``.

Three domains, cut into ~2,000-character documents and shuffled together (seeded), so that a
router has something to specialise on:

- Python code: ``pystdlib-train`` / ``pystdlib-val`` (the standard library's sources, built in);
- English prose: WikiText-2 (``wikitext2``, from the data folder) split by article (an article is
  held out when the sha256 of its title mod 100 < 10); where that file is missing, the prose of
  ``pydoc`` split by paragraph the same way, so the corpus builds with no data folder (the corpus,
  its sha256 and so the trained model then differ; the checkpoint records the sha256);
- arithmetic: generated lines (``37 * 12 = 444``, ``max(5, 81, 2) = 81``), seeded per split.
"""

from __future__ import annotations

import hashlib
import random
import re

from paretolab.errors import ConfigError

DOC_CHARS = 2000  # a document: about 600 tokens, so most 128-token training windows hold one domain
# characters per domain; moe-mix-calib is a small piece of the training split (calibration: fast to tokenize, never evaluated on)
DOMAIN_CHARS = {"moe-mix-train": 1_200_000, "moe-mix-val": 80_000, "moe-mix-calib": 30_000}
VAL_PERCENT = 10
_SEEDS = {"moe-mix-train": 0, "moe-mix-val": 1, "moe-mix-calib": 2}


def corpus_text(name: str) -> str:
    """The text of ``moe-mix-train``, ``moe-mix-val`` or ``moe-mix-calib`` (deterministic on a given machine)."""
    if name not in DOMAIN_CHARS:
        raise ConfigError(f"corpus {name!r}: the mixed MoE corpora are {', '.join(map(repr, DOMAIN_CHARS))}")
    budget, seed = DOMAIN_CHARS[name], _SEEDS[name]
    split = "val" if name.endswith("val") else "train"  # moe-mix-calib: a piece of the train split
    docs = []
    for text in (_code(split), _prose(split), _arithmetic(budget, seed)):
        text = text[-budget:] if name == "moe-mix-calib" else text[:budget]  # calib: the end of the train split
        docs += _documents(text)
    random.Random(seed).shuffle(docs)
    return "\n\n".join(docs) + "\n"


def domains(split: str, chars: int) -> dict[str, str]:
    """Each domain's text on its own (``split`` is train or val): to measure which experts each one uses."""
    seed = _SEEDS[f"moe-mix-{split}"]
    return {"code": _code(split)[:chars], "prose": _prose(split)[:chars], "arithmetic": _arithmetic(chars, seed)}


def _documents(text: str) -> list[str]:
    """``text`` cut at line ends into pieces of about DOC_CHARS."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + DOC_CHARS)
        end = len(text) if end < 0 else end + 1
        piece = text[start:end].strip("\n")
        if piece:
            pieces.append(piece)
        start = end
    return pieces


def _code(split: str) -> str:
    from paretolab.data import load_corpus

    return load_corpus(f"pystdlib-{split}")[0]


def _held_out(key: str) -> bool:
    return int(hashlib.sha256(key.encode("utf-8")).hexdigest(), 16) % 100 < VAL_PERCENT


def _prose(split: str) -> str:
    """WikiText-2 articles of this split; ``pydoc`` paragraphs where WikiText-2 is not installed."""
    from paretolab.data import load_corpus

    try:
        text = load_corpus("wikitext2")[0]
        parts = re.split(r"\n(?= = [^=].* = \n)", text)  # an article starts at a level-1 heading " = Title = "
        key = lambda part: part.strip().split("\n", 1)[0]  # noqa: E731 - the title
    except (ConfigError, OSError):
        parts = load_corpus("pydoc")[0].split("\n\n")
        key = lambda part: part[:200]  # noqa: E731
    wanted = split == "val"
    return "\n".join(p for p in parts if p.strip() and _held_out(key(p)) == wanted)


def _arithmetic(chars: int, seed: int) -> str:
    """Seeded arithmetic facts, one per line, until ``chars`` characters."""
    rng = random.Random(1000 + seed)
    lines, total = [], 0
    while total < chars:
        kind = rng.randrange(4)
        a, b = rng.randrange(1000), rng.randrange(1, 100)
        if kind == 0:
            line = f"{a} + {b} = {a + b}"
        elif kind == 1:
            line = f"{a} - {b} = {a - b}"
        elif kind == 2:
            line = f"{b} * {a % 50} = {b * (a % 50)}"
        else:
            xs = [rng.randrange(100) for _ in range(rng.randrange(2, 6))]
            fn = rng.choice(("max", "min", "sum"))
            line = f"{fn}({', '.join(map(str, xs))}) = {dict(max=max, min=min, sum=sum)[fn](xs)}"
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)
