"""Generated arithmetic worked solutions as corpora (seeded): a new task to fine-tune a pretrained model on.

``arith-train`` (4,000 problems, seed ``arith-train``) and ``arith-val`` (500 problems, seed
``arith-val``, none of whose questions is in ``arith-train``: held out) are usable wherever a corpus
is (``train.corpus``, ``task.corpus`` of ``perplexity``). Problems come from the ``arithmetic``
task's generator (:func:`paretolab.tasks.generation.arithmetic_problem`), levels 4 and 5 alternated
(a * b + c in two steps; two two-digit numbers added), and are written exactly as that task's
``fewshot`` prompt writes a worked shot, so a model fine-tuned here answers that prompt:

    Question: What is 7 * 8 + 13?
    Answer: 7 * 8 = 56. 56 + 13 = 69. The answer is 69.

(one blank line between problems). :func:`val_problems` gives the held-out problems themselves,
for exact-answer accuracy.
"""

from __future__ import annotations

import random
from functools import lru_cache

from paretolab.errors import ConfigError
from paretolab.tasks.generation import Example, arithmetic_problem

LEVELS = (4, 5)
CORPORA = {"arith-train": 4_000, "arith-val": 500}  # name -> problems


def block(example: Example) -> str:
    """One problem as the ``fewshot`` prompt writes a worked shot."""
    return f"Question: {example.question}\nAnswer: {' '.join(example.solution.split())}\n\n"


@lru_cache(maxsize=2)
def problems(name: str) -> tuple[Example, ...]:
    """The problems of ``arith-train`` or ``arith-val`` (the latter never repeats a training question)."""
    if name not in CORPORA:
        raise ConfigError(f"corpus {name!r} is not an arithmetic corpus ({', '.join(CORPORA)})")
    rng = random.Random(name)
    seen = {ex.question for ex in problems("arith-train")} if name == "arith-val" else set()
    out: list[Example] = []
    while len(out) < CORPORA[name]:
        ex = arithmetic_problem(rng, LEVELS[len(out) % len(LEVELS)])
        if ex.question not in seen:
            out.append(ex)
    return tuple(out)


def val_problems(n: int) -> list[Example]:
    """The first ``n`` held-out problems (``arith-val``)."""
    return list(problems("arith-val")[:n])


def corpus_text(name: str) -> str:
    """The text of ``arith-train`` / ``arith-val``: every problem as a worked ``Question:``/``Answer:`` block."""
    return "".join(block(ex) for ex in problems(name))
