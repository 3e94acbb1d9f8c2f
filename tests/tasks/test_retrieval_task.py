"""kv_retrieval: greedy retrieval of a value from long key-value contexts, exact match and prefill time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation import Generation
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.tasks.retrieval import (
    KVRetrieval,
    KVRetrievalOptions,
    is_correct,
    load_rows,
    positions_of,
)
from tests.conftest import needs_data


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path / "trial")


class Oracle:
    """A generator that answers from a table keyed by the prompt's last line (and says its prefill took 5 ms)."""

    def __init__(self, subject: Subject, replies: dict[str, str]) -> None:
        self.tok, self.replies = subject.tokenizer, replies
        self.budgets: list[int] = []

    def generate(self, subject: Subject, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stop_ids: Sequence[int] = (), ctx: Any = None) -> Generation:
        self.budgets.append(max_new_tokens)
        key = self.tok.decode(list(prompts[0])).splitlines()[-2]
        ids = self.tok.encode(self.replies[key], add_special_tokens=False)[:max_new_tokens]
        return Generation([ids], len(ids), len(ids), prefill_s=0.005, decode_s=0.01)


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_scores_exact_matches_after_normalisation(tiny: Subject, ctx: TrialContext, tmp_path: Path) -> None:
    rows = [
        {"context": 'JSON data: {...}\nKey: "k1"\nCorresponding Value: ', "answer": "ab12-cd34"},
        {"context": 'JSON data: {...}\nKey: "k2"\nCorresponding Value: ', "continuation": "ef56-0789"},
        {"context": 'JSON data: {...}\nKey: "k3"\nCorresponding Value: ', "answer": "aaaa-bbbb"},
    ]
    path = write_rows(tmp_path / "kv.jsonl", rows)
    tiny.generator = Oracle(tiny, {'Key: "k1"': ' "ab12-cd34", "next', 'Key: "k2"': '\n{\n  "EF56-0789": "x"', 'Key: "k3"': " aaaa-bbbc"})
    metrics = KVRetrieval().evaluate(tiny, KVRetrievalOptions(path=str(path)), ctx)
    # hits 1, 1, 0: sample std sqrt(1/3), over sqrt(3) rows = 1/3
    assert metrics == {"acc": pytest.approx(2 / 3), "acc_stderr": pytest.approx(1 / 3), "n_examples": 3, "prefill_ms": pytest.approx(5.0)}
    assert json.loads((ctx.workdir / "per_example.json").read_text())["scores"] == {"acc": [1.0, 1.0, 0.0]}
    assert tiny.generator.budgets == [len(tiny.tokenizer.encode(" ab12-cd34", add_special_tokens=False)) + 8] * 3


@pytest.mark.parametrize(
    ("text", "answer", "correct"),
    [(' "96658371-4f33"', "96658371-4f33", True), ("9665837-14f33", "96658371-4f33", True), ("96658371-4f3", "96658371-4f33", False), ("x", "", False)],
)
def test_normalisation_ignores_punctuation_and_case_only(text: str, answer: str, correct: bool) -> None:
    assert is_correct(text, answer) is correct


def test_positions_come_as_a_list_or_comma_separated() -> None:
    assert positions_of("end") == ["end"]
    assert positions_of("beginning, end") == ["beginning", "end"]
    assert positions_of(["middle"]) == ["middle"]
    with pytest.raises(ConfigError, match="task.positions"):
        positions_of("centre")
    opts = parse_options(KVRetrievalOptions, {"positions": ["end"], "limit": 2}, where="task")
    assert opts.positions == ["end"] and opts.limit == 2


def test_missing_data_names_the_file_and_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARETOLAB_DATA_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("PARETOLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("paretolab.data.files.CHECKOUT", None)  # no shared/data beside the checkout either
    with pytest.raises(ConfigError, match=r"longctx/kv_pairs_middle_len_2048\.jsonl.*PARETOLAB_DATA_DIR.*task\.path"):
        load_rows(KVRetrievalOptions(positions="middle"))


def test_bad_rows_and_options_are_refused(tiny: Subject, ctx: TrialContext, tmp_path: Path) -> None:
    path = write_rows(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}])
    with pytest.raises(ConfigError, match="context and answer"):
        load_rows(KVRetrievalOptions(path=str(path)))
    with pytest.raises(ConfigError, match="task.limit"):
        KVRetrieval().evaluate(tiny, KVRetrievalOptions(limit=-1), ctx)


def test_runs_on_the_shared_files_with_a_real_model(tiny: Subject, ctx: TrialContext) -> None:
    """Needs longctx/ from the shared data folder; skipped with the reason without it."""
    needs_data(*(f"longctx/kv_pairs_{p}_len_2048.jsonl" for p in ("beginning", "middle", "end")))
    metrics = KVRetrieval().evaluate(tiny, KVRetrievalOptions(limit=1, max_new_tokens=2), ctx)
    assert metrics["acc"] == 0.0  # a random model does not retrieve UUIDs
    assert metrics["prefill_ms"] > 0
    assert [len(load_rows(KVRetrievalOptions(positions=p, limit=3))) for p in ("beginning", "middle", "end")] == [3, 3, 3]


def test_is_registered() -> None:
    from paretolab.plugin_api.manager import registries

    task = registries().tasks.get("kv_retrieval")
    assert set(task.metrics) == {"acc", "acc_stderr", "n_examples", "prefill_ms"}
