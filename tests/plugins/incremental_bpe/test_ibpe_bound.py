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


def test_the_pages_tokenizer_figures_are_what_the_benchmarks_json_renders(tmp_path):
    """docs/methods/encodings.md carries the benchmark's figures as tokenizer_report renders them; an edit is caught."""
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    spec = importlib.util.spec_from_file_location("tokenizer_report", root / "benchmarks" / "tokenizer_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.main(["--check"]) == 0, "run `python benchmarks/tokenizer_report.py --write` and commit"
    data = json.loads(report.JSON.read_text(encoding="utf-8"))
    data["summary"]["wikitext2_first_seen_ns_b"]["tiktoken_over_ours"] = 3.5
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data), encoding="utf-8")
    assert report.main([str(edited), "--check"]) == 1, "a figure that changed in the JSON must fail the check"
    assert "WikiText-2 first-seen" not in report.describe(data).split("Not met:")[-1], "×3.5 tiktoken meets its target"
