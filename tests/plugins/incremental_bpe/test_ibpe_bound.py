"""The worst-case bound: interval tests per byte never exceed the vocabulary's candidate bound."""

from __future__ import annotations

import random
import string

import pytest

from paretolab.plugins.incremental_bpe import IncrementalBPE
from paretolab.plugins.incremental_bpe._forest import max_candidates
from paretolab.plugins.incremental_bpe._reference import ReferenceBPE


@pytest.fixture(scope="module")
def reference(tok_py: IncrementalBPE) -> ReferenceBPE:
    return tok_py._engine.bpe  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def bound(tok_py: IncrementalBPE) -> int:
    return max_candidates(tok_py.tables)


def test_the_bound_is_the_longest_candidate_list_of_any_automaton_state(reference: ReferenceBPE, bound: int) -> None:
    automaton = reference.automaton
    longest = max(len(automaton.tokens_ending_here(s)) for s in range(len(automaton.depth)))
    assert longest == bound == 45  # SmolLM2: 45 dash tokens end inside a run of dashes


_LETTERS = "".join(random.Random(0).choice(string.ascii_lowercase) for _ in range(20_000))
UNITS = {"dashes": "-", "spaces": " ", "angles": "<", "letters": _LETTERS, "digits": "7", "pairs": "ab", "é": "é"}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_tests_per_byte_stay_under_the_bound_and_do_not_grow(name: str, reference: ReferenceBPE, bound: int) -> None:
    per_byte = []
    for n in (2_000, 20_000):
        word = (UNITS[name] * n)[:n].encode()
        reference.tests = 0
        reference.encode_word(word)
        per_byte.append(reference.tests / len(word))
    assert max(per_byte) <= bound
    assert per_byte[1] <= per_byte[0] * 1.02 + 0.01, per_byte  # 10x the input, not more work per byte
