"""The C engine's word cache and shared int objects: hits, bypass and engine lifetimes never change an id."""

from __future__ import annotations

import gc
import json
import random
import string
from collections.abc import Callable

from paretolab.plugins.incremental_bpe import IncrementalBPE
from paretolab.plugins.incremental_bpe._inputs import gen_base64, gen_hex

PROSE = (
    "The tower is 324 metres (1,063 ft) tall, about the same height as an 81-storey building. "
    "Its base is square, measuring 125 metres on each side; during its construction the tower "
    "surpassed the Washington Monument to become the tallest man-made structure in the world.\n"
) * 40


def _boundary_words() -> str:
    """Words at the cache's limits (22 bytes, 10 ids) and one past them, words one byte apart, repeated."""
    rng = random.Random(7)
    words = []
    for n in (20, 21, 22, 23, 24):
        letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
        words += [" " + letters[: n - 1], " " + letters, letters[:-1] + "q"]
        symbols = "".join(rng.choice("!#$%&*+-/<=>?@^|~") for _ in range(n))  # one pre-token, many ids
        words += [" " + symbols, symbols[:-1]]
    words += ["é" * k for k in (7, 10, 11)]  # multi-byte: 14, 20 and 22 bytes
    return "".join(words * 3)


def test_a_cache_hit_returns_exactly_the_ids_a_miss_computed(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    engine = tok_c.fresh()
    text = _boundary_words() + PROSE
    truth = hf_ids(text)
    assert engine.encode(text) == truth  # first time: misses, then hits on the repeats within the text
    assert engine.encode(text) == truth  # again: every short word from the cache


def test_words_that_never_repeat_switch_the_cache_off_and_back_without_changing_an_id(
    tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]
) -> None:
    engine = tok_c.fresh()
    noise = gen_base64(120_000) + gen_hex(60_000)  # tens of thousands of words, almost none repeated
    for text in (PROSE, noise, PROSE, noise[:5000] + PROSE, PROSE):
        assert engine.encode(text) == hf_ids(text), text[:80]


def test_ids_stay_correct_after_the_engines_that_made_them_are_gone(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    truth = hf_ids(PROSE)
    kept = []
    for _ in range(5):  # engines share one set of int objects: freeing one must not free them
        engine = tok_c.fresh()
        kept.append(engine.encode(PROSE))
        del engine
        gc.collect()
    assert all(ids == truth for ids in kept)
    assert tok_c.fresh().encode(PROSE) == truth


def test_long_candidate_chains_give_the_same_ids_tested_eight_at_a_time_or_one_by_one(hf_ids: Callable[[str], list[int]]) -> None:
    """Runs of '-' or '=' put ~30 candidates behind a byte; where the CPU has AVX2 they are tested 8 at once. Both ways agree
    with HF, in this process and in one where IBPE_NO_AVX2 turns the vector path off."""
    import os
    import subprocess
    import sys

    rng = random.Random(3)
    text = "".join(rng.choice(["-" * rng.randint(1, 90), "=" * rng.randint(1, 50), "#" * rng.randint(1, 40), " ", "a-b", "\n"])
                   for _ in range(3000))
    truth = hf_ids(text)
    code = ("import sys, json; from transformers import AutoTokenizer; from paretolab.models import SmolLM2; "
            "from paretolab.plugins.incremental_bpe import IncrementalBPE; "
            "t = IncrementalBPE.from_hf(AutoTokenizer.from_pretrained(SmolLM2().pull())); "
            "print(json.dumps(t.encode(sys.stdin.read())))")
    for off in ("", "1"):
        env = {**os.environ, "IBPE_NO_AVX2": off} if off else {k: v for k, v in os.environ.items() if k != "IBPE_NO_AVX2"}
        out = subprocess.run([sys.executable, "-c", code], input=text, capture_output=True, text=True, env=env, check=True)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == truth, f"IBPE_NO_AVX2={off!r}"


def _unrepeated_syllable_words(count: int, seed: int = 3) -> str:
    """Words of 6-20 bytes glued from English syllables in random case: almost none repeats (the cache switches off for
    their lengths), and unlike base64's their automaton states run 3 or more deep ("tion", "ment", "ally")."""
    rng = random.Random(seed)
    parts = ["tion", "ment", "ally", "ing", "con", "ter", "pre", "ous", "able", "ness", "str", "the", "and", "ver", "ful",
             "X", "Q", "z", "Ab", "eR", "qu", "ph", "ck"]
    words = []
    for _ in range(count):
        word = "".join(rng.choice(parts) for _ in range(rng.randint(2, 5)))[:20]
        word = "".join(c.upper() if rng.random() < 0.15 else c for c in word)
        words.append(rng.choice(("", " ")) + word)
    return "".join(w + rng.choice((" ", ".", "0", "\n")) for w in words)


def test_words_the_cache_skips_equal_hf_where_their_states_run_deep(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    """Words of lengths the cache switches itself off for (they never repeat), whose automaton states run 3 or more
    deep, beside runs of symbols with bytes the vocabulary lacks and non-ASCII ones."""
    engine = tok_c.fresh()
    text = _unrepeated_syllable_words(20_000)
    assert engine.encode(text) == hf_ids(text)
    rng = random.Random(5)  # runs of symbols with bytes the vocabulary lacks (HF drops \x04 and \x06) and non-ASCII
    symbols = "".join(" " + "".join(rng.choice("!#$%&*+-/<=>?@^|~\x04\x06×") for _ in range(9)) for _ in range(3_000))
    mixed = gen_base64(40_000) + _unrepeated_syllable_words(4_000, seed=4) + symbols
    assert engine.encode(mixed) == hf_ids(mixed)


def test_a_long_result_with_added_tokens_among_its_ids_equals_hf(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    """A result of ~100000 ids, most from words the cache skips, and added tokens between them."""
    from paretolab.plugins.incremental_bpe._vocab import SpecialToken
    from paretolab.plugins.incremental_bpe._pretokenize import SpecialSplitter

    text = gen_base64(100_000) + "-" * 70_000 + gen_hex(20_000) + PROSE
    ids = tok_c.fresh().encode(text)
    assert len(ids) > 6 * 16384 and ids == hf_ids(text)
    specials = [SpecialToken("<s1>", 1), SpecialToken("<s2>", 2)]
    engine = tok_c.fresh()._engine
    engine.set_specials([(s.content.encode(), s.id) for s in specials])
    text = "<s1>".join(gen_base64(9_000, seed=k) for k in range(12)) + "<s2>"
    plain = tok_c.fresh()._engine
    expected = [i for part in SpecialSplitter(specials).split(text) for i in ([part] if isinstance(part, int) else plain.encode_text(part))]
    assert engine.encode_text(text) == expected
