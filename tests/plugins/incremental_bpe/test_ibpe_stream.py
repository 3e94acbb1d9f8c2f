"""stream(): any split of the input gives encode()'s ids, and nothing is emitted before it is final."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paretolab.plugins.incremental_bpe import IncrementalBPE

_ALPHABET = st.sampled_from(
    list(" \t\n'sSlretd1aé\u0301\u3000!?<|>😀漢x") + ["<|endoftext|>", "<|im_start|>", "'ll", "  ", "aaaa", "1111"]
)
TEXT = st.one_of(st.lists(_ALPHABET, max_size=50).map("".join), st.text(st.characters(exclude_categories=("Cs",)), max_size=60))


def _feed_split(tok: IncrementalBPE, text: str, cuts: list[int]) -> tuple[list[list[int]], list[int]]:
    stream = tok.stream()
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    emitted = [stream.feed(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    return emitted, stream.finish()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXT, cuts=st.lists(st.integers(0, 60), max_size=12))
def test_any_split_gives_the_batch_ids(text: str, cuts: list[int], tok_c: IncrementalBPE, tok_py: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    expected = hf_ids(text)
    for tok in (tok_c, tok_py):
        emitted, rest = _feed_split(tok, text, cuts)
        assert sum(emitted, []) + rest == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=TEXT, continuations=st.lists(TEXT, min_size=1, max_size=4))
def test_emitted_tokens_never_change(prefix: str, continuations: list[str], tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    emitted = tok_c.stream().feed(prefix)
    for tail in continuations:
        assert hf_ids(prefix + tail)[: len(emitted)] == emitted


def test_long_runs_are_emitted_while_streaming(tok: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    for text in ("a" * 4000, "ab" * 2000, "1" * 4000, "!" * 4000, " " * 4000, "qwertyuiop" * 400):
        stream = tok.stream()
        emitted: list[int] = []
        emitted_bytes = most_held = 0
        for at in range(0, len(text), 7):
            new = stream.feed(text[at : at + 7])
            emitted += new
            emitted_bytes += sum(len(tok.tables.token_bytes[t]) for t in new)
            most_held = max(most_held, min(at + 7, len(text)) - emitted_bytes)  # ASCII: chars == bytes
        assert emitted + stream.finish() == hf_ids(text)
        assert most_held < 200, f"{text[:10]!r}...: up to {most_held} bytes held back"


def test_an_added_token_split_across_chunks(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    text = "hi <|im_start|>user\nhello<|im_end|>  <|endoftext|>"
    for cut in range(len(text) + 1):
        stream = tok_c.stream()
        assert stream.feed(text[:cut]) + stream.feed(text[cut:]) + stream.finish() == hf_ids(text)


def test_a_stream_is_reusable_after_finish(tok_c: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    stream = tok_c.stream()
    for text in ("first text  ", "second'll", ""):
        assert stream.feed(text) + stream.finish() == hf_ids(text)


def test_one_char_at_a_time_over_a_paragraph(tok: IncrementalBPE, hf_ids: Callable[[str], list[int]]) -> None:
    text = "The quick brown fox's 12,345 jumps — über\t\tcafé…  done.\n\n    def f(x):\n        return x**2  # ok\n"
    stream = tok.stream()
    emitted = [stream.feed(ch) for ch in text]
    assert sum(emitted, []) + stream.finish() == hf_ids(text)
    assert sum(map(len, emitted)) > 0.8 * len(hf_ids(text))  # nearly everything came out eagerly
