"""Worst-case inputs for the incremental BPE that no part of it was tuned on (benchmarks and tests).

Each generator returns about ``size`` bytes of seeded text (the same text for the same size):
base64 and hex (random bytes encoded), URLs (random words, ids and hex in paths and queries, one a
line), minified code (a random JavaScript-like program without spaces or newlines), CJK without
spaces (random ideographs, 3 bytes each) and a run of one emoji.
"""

from __future__ import annotations

import base64
import random
import string
from collections.abc import Callable


def _words(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 10))) for _ in range(n)]


def gen_base64(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    return base64.b64encode(rng.randbytes(size * 3 // 4 + 3)).decode()[:size]


def gen_hex(size: int, seed: int = 2) -> str:
    rng = random.Random(seed)
    return rng.randbytes(size // 2 + 1).hex()[:size]


def gen_urls(size: int, seed: int = 3) -> str:
    rng = random.Random(seed)
    words = _words(rng, 5000)

    def w() -> str:
        return rng.choice(words)

    out, n = [], 0
    while n < size:
        url = (
            f"https://{rng.choice(['www', 'api', 'cdn', w()])}.{w()}.{rng.choice(['com', 'org', 'io', 'net', 'de'])}/"
            + "/".join(w() for _ in range(rng.randint(1, 4)))
            + f"/{rng.randbytes(rng.randint(3, 8)).hex()}?{w()}={rng.randint(0, 99999)}&{w()}={w()}-{w()}"
        )
        out.append(url)
        n += len(url) + 1
    return "\n".join(out)[:size]


def gen_minified(size: int, seed: int = 4) -> str:
    rng = random.Random(seed)
    def ident() -> str:
        return rng.choice(string.ascii_letters + "_$") + "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(rng.randint(0, 3)))

    def expr(d: int = 0) -> str:
        k = rng.randint(0, 5 if d < 3 else 1)
        if k == 0: return ident()
        if k == 1: return str(rng.randint(0, 999))
        if k == 2: return f"{expr(d+1)}{rng.choice('+-*/%<>&|^')}{expr(d+1)}"
        if k == 3: return f"{ident()}({','.join(expr(d+1) for _ in range(rng.randint(0, 3)))})"
        if k == 4: return f"{ident()}.{ident()}[{expr(d+1)}]"
        return f'"{ident()}"'
    def stmt(d: int = 0) -> str:
        k = rng.randint(0, 4 if d < 2 else 1)
        if k == 0: return f"var {ident()}={expr()};"
        if k == 1: return f"{ident()}={expr()};"
        if k == 2: return f"if({expr()}){{{''.join(stmt(d+1) for _ in range(rng.randint(1, 3)))}}}else{{return {expr()}}}"
        if k == 3: return f"for(var {ident()}=0;{ident()}<{expr()};{ident()}++){{{stmt(d+1)}}}"
        return f"function {ident()}({','.join(ident() for _ in range(rng.randint(0, 3)))}){{{''.join(stmt(d+1) for _ in range(rng.randint(1, 4)))}return {expr()}}}"
    out, n = [], 0
    while n < size:
        s = stmt()
        out.append(s)
        n += len(s)
    return "".join(out)[:size]


def gen_cjk(size: int, seed: int = 5) -> str:
    rng = random.Random(seed)  # random CJK unified ideographs, 3 bytes each, no spaces
    return "".join(chr(rng.randint(0x4E00, 0x9FA5)) for _ in range(size // 3))


def gen_emoji(size: int) -> str:
    return "😀" * (size // 4)


def gen_letters(size: int, seed: int = 0) -> str:
    """Random lowercase letters without spaces (tuned on: the profile's input)."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(size))


UNTUNED: dict[str, Callable[[int], str]] = {
    "base64": gen_base64,
    "hex": gen_hex,
    "urls": gen_urls,
    "minified code": gen_minified,
    "cjk unspaced": gen_cjk,
    "emoji run": gen_emoji,
}
