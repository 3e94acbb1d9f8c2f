"""Seeded 1–2 digit addition with worked solutions: the SFT corpora and the RL problems (reward = exact answer).

One problem per line, operands 0–99 drawn uniformly: the prompt is ``"47+38=?"`` and the worked
solution that follows adds the units, then the tens with the carry, then states the answer::

    47+38=? 7+8=15, 4+3+1=8, answer 85
    3+4=? 3+4=7, answer 7

Two one-digit operands get the units step only. Held out by construction: a pair (a, b) whose
sha256 of ``"a+b"`` is 0 mod ``HELDOUT_MOD`` (about 1 in 10 of the 10,000 pairs) never appears in
``addition-train`` nor among RL training prompts; the RL stage's accuracy is measured on those pairs
only (``heldout_problems``). ``addition-val`` (other seed) is the corpus the train stage's val_loss
reads. Corpora: ``addition-train`` (40,000 lines, seed 0, training pairs), ``addition-val`` (2,000 lines,
seed 1, held-out pairs). The answer of a completion is read by the arithmetic task's rule (the last
number in the text, :func:`paretolab.tasks.generation.extract_number`), cut at the first newline.

Four operations with direct answers (no worked solution) make the ``numeric-train`` / ``numeric-val``
corpora that compare number encodings (:mod:`paretolab.plugins.bittokens`): one ``a op b=answer`` per
line, the op drawn uniformly from add ``47+38=85``, multiply ``47*38=1786``, exact divide
``1786/38=47`` (divisor 1–99, quotient 0–99) and compare ``47?38=>`` (answer ``<``, ``=`` or ``>``).
Held out the same way, by the sha256 of ``"a{op}b"`` (for ``+`` the very pairs held out above).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from paretolab.errors import ConfigError

HELDOUT_MOD = 10
CORPORA = {"addition-train": (40_000, 0, False), "addition-val": (2_000, 1, True)}  # name -> (lines, seed, held-out pairs)
NUMERIC_CORPORA = {"numeric-train": (40_000, 0, False), "numeric-val": (2_000, 1, True)}  # four ops, direct answers
OPS = {"add": "+", "mul": "*", "div": "/", "cmp": "?"}  # operation name -> its symbol in the text


@dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: str = "+"  # a symbol of OPS; the worked solution exists for "+" only

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}=?"

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def result(self) -> str:
        """The exact answer as text: the number for + * /, and <, = or > for the compare op ``?``."""
        a, b = self.a, self.b
        if self.op == "?":
            return "<" if a < b else ">" if a > b else "="
        return str({"+": a + b, "*": a * b, "/": a // b if b else 0}[self.op])

    @property
    def line(self) -> str:
        """The direct-answer line of the numeric corpora: ``a op b=result`` and a newline."""
        return f"{self.a}{self.op}{self.b}={self.result}\n"

    @property
    def solution(self) -> str:
        """The worked solution that follows the prompt (leading space, no newline)."""
        a, b = self.a, self.b
        units = a % 10 + b % 10
        steps = [f"{a % 10}+{b % 10}={units}"]
        if a >= 10 or b >= 10:
            steps.append(f"{a // 10}+{b // 10}+{units // 10}={a // 10 + b // 10 + units // 10}")
        return " " + ", ".join(steps) + f", answer {self.answer}"


def is_heldout(a: int, b: int, op: str = "+") -> bool:
    """Whether the pair (a, b) belongs to the held-out evaluation pairs of ``op`` (fixed by a hash, not by chance)."""
    return int(hashlib.sha256(f"{a}{op}{b}".encode()).hexdigest(), 16) % HELDOUT_MOD == 0


def draw(rng: random.Random, *, heldout: bool) -> Problem:
    """One problem from the held-out pairs or from the training pairs (rejection sampling)."""
    while True:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if is_heldout(a, b) == heldout:
            return Problem(a, b)


def problems(n: int, seed: int, *, heldout: bool) -> list[Problem]:
    """``n`` problems drawn (with replacement) from ``random.Random(f"arith-{seed}")``."""
    rng = random.Random(f"arith-{seed}-{'heldout' if heldout else 'train'}")
    return [draw(rng, heldout=heldout) for _ in range(n)]


def draw_numeric(rng: random.Random, *, heldout: bool) -> Problem:
    """One four-op problem (op uniform; a divide's dividend is divisor × quotient) from the held-out or the training pairs."""
    while True:
        op = rng.choice(list(OPS.values()))
        if op == "/":
            b, q = rng.randint(1, 99), rng.randint(0, 99)
            a = b * q
        else:
            a, b = rng.randint(0, 99), rng.randint(0, 99)
        if is_heldout(a, b, op) == heldout:
            return Problem(a, b, op)


def numeric_problems(n: int, seed: int, *, heldout: bool) -> list[Problem]:
    """``n`` four-op problems drawn (with replacement) from ``random.Random(f"numeric-{seed}-...")``."""
    rng = random.Random(f"numeric-{seed}-{'heldout' if heldout else 'train'}")
    return [draw_numeric(rng, heldout=heldout) for _ in range(n)]


def heldout_problems(n: int) -> list[Problem]:
    """The first ``n`` distinct held-out pairs in a fixed seeded order (the RL accuracy's evaluation set)."""
    pairs = [(a, b) for a in range(100) for b in range(100) if is_heldout(a, b)]
    random.Random("arith-eval").shuffle(pairs)
    if n > len(pairs):
        raise ConfigError(f"rl.eval_problems: {n} is more than the {len(pairs)} held-out pairs; lower it")
    return [Problem(a, b) for a, b in pairs[:n]]


def corpus_text(name: str) -> str:
    """The text of ``addition-train`` / ``addition-val`` (one worked problem per line) or ``numeric-train`` / ``numeric-val``."""
    if name in NUMERIC_CORPORA:
        lines, seed, heldout = NUMERIC_CORPORA[name]
        return "".join(p.line for p in numeric_problems(lines, seed, heldout=heldout))
    if name not in CORPORA:
        raise ConfigError(f"corpus {name!r} is not an arithmetic corpus ({', '.join([*CORPORA, *NUMERIC_CORPORA])})")
    lines, seed, heldout = CORPORA[name]
    return "".join(p.prompt + p.solution + "\n" for p in problems(lines, seed, heldout=heldout))


def reward(problem: Problem, completion: str) -> float:
    """1.0 when the completion's answer (first line, last number) is the sum, else 0.0."""
    from paretolab.tasks.generation import extract_number

    got = extract_number(completion.split("\n")[0])
    return 1.0 if got is not None and got == str(problem.answer) else 0.0
