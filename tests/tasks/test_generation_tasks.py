"""Generation tasks: prompts, the answer rule, generated arithmetic, files, and scoring through the subject's generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.generation import Generation
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.options import parse_options
from paretolab.tasks.generation import (
    ARITHMETIC_LEVELS,
    QA,
    Arithmetic,
    Gsm8k,
    arithmetic_problem,
    extract_number,
    extract_text,
    prompt_ids,
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("3 + 4 = 7. The answer is 7.", "7"),
        ("The answer is $1,250.00 in total", "1250"),
        ("#### 18", "18"),
        ("first 12, then 15, so 20", "20"),  # no marker: the last number
        ("The answer is 9.\n\nQuestion: What is 5 + 5?\nAnswer: 10", "9"),  # a new question is cut off
        ("the answer is -3", "-3"),
        ("The answer is 2.50", "2.5"),
        ("no digits here", None),
    ],
)
def test_numeric_answer_rule(text, answer):
    assert extract_number(text) == answer


def test_text_answer_rule():
    assert extract_text("Hmm. The answer is The Eiffel Tower!\nMore text") == "eiffel tower"
    assert extract_text("Paris") == "paris"


@pytest.mark.parametrize("level", sorted(ARITHMETIC_LEVELS))
def test_arithmetic_problems_are_right_and_worked(level):
    import random

    for _ in range(20):
        ex = arithmetic_problem(random.Random(level), level)
        expr = ex.question.removeprefix("What is ").removesuffix("?")
        assert str(eval(expr)) == ex.answer  # noqa: S307 (our own generated expression)
        assert extract_number(ex.solution) == ex.answer


def test_arithmetic_is_seeded_and_shots_do_not_move_with_the_seed():
    def examples(**kw):
        return Arithmetic().examples(parse_options(Arithmetic.options, {"limit": 5, **kw}, where="task"))

    assert examples(seed=1) == examples(seed=1)
    assert examples(seed=1)[1] != examples(seed=2)[1]
    assert examples(seed=1)[0] == examples(seed=2)[0]
    with pytest.raises(ConfigError, match="task.level"):
        examples(level=9)


def test_fewshot_prompt_puts_worked_answers_on_one_line(tiny):
    task = Arithmetic()
    shots, examples = task.examples(parse_options(task.options, {"limit": 1, "shots": 2, "level": 3}, where="task"))
    text = tiny.tokenizer.decode(prompt_ids(tiny.tokenizer, examples[0], shots, "fewshot"))
    assert text.count("Question:") == 3 and text.endswith(f"Question: {examples[0].question}\nAnswer:")
    assert all(s.solution in text for s in shots)


def _gsm8k_file(folder: Path) -> Path:
    path = folder / "gsm8k.jsonl"
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A box holds 1,200 pens; 200 are sold. How many are left?", "answer": "1200 - 200 = <<1200-200=1000>>1000\n#### 1,000"},
        {"question": "What is 6 times 7?", "answer": "6 * 7 = 42\n#### 42"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_rows_become_shots_and_examples(tmp_path):
    options = parse_options(Gsm8k.options, {"dataset": str(_gsm8k_file(tmp_path)), "shots": 1, "limit": 5}, where="task")
    shots, examples = Gsm8k().examples(options)
    assert shots[0].solution == "3 + 4 = 7\nThe answer is 7."  # calculator annotations dropped
    assert [e.answer for e in examples] == ["1000", "42"]


def test_gsm8k_without_the_answer_marker_names_the_row(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(ConfigError, match="row 1"):
        Gsm8k().examples(parse_options(Gsm8k.options, {"dataset": str(bad)}, where="task"))


class Oracle:
    """A generator that answers every prompt from a lookup table, to check the scoring path."""

    def __init__(self, tokenizer, answers: list[str]) -> None:
        self.tokenizer, self.answers = tokenizer, answers

    def generate(self, subject, prompts, *, max_new_tokens, stop_ids=(), ctx=None):
        seqs = [self.tokenizer.encode(f"The answer is {a}.", add_special_tokens=False) for a in self.answers]
        return Generation(seqs, 30, 10, 0.5, 2.0, stats={"probe_tokens": 4.0})


def test_task_scores_the_subjects_generator_and_reports_costs(tiny, tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps({"question": f"capital {i}?", "answer": a}) + "\n" for i, a in enumerate(["x", "Paris", "Rome", "Oslo"])))
    subject = tiny.copy()
    subject.generator = Oracle(tiny.tokenizer, ["paris", "Milan", "Oslo"])
    options = parse_options(QA.options, {"dataset": str(path), "shots": 1}, where="task")
    metrics = QA().evaluate(subject, options, TrialContext(seed=0, workdir=tmp_path / "w"))
    assert metrics["acc"] == pytest.approx(2 / 3)  # text answers: case and punctuation ignored
    assert metrics["tokens_total"] == 10 and metrics["tokens_sequential"] == pytest.approx(10 / 3)
    assert metrics["decode_tok_s"] == 15 and metrics["prefill_ms"] == pytest.approx(500 / 3)
    assert metrics["probe_tokens"] == 4.0
    assert set(metrics) <= set(registries().metrics.names())


def test_qa_needs_a_dataset_and_chat_needs_a_template(tiny, tmp_path):
    with pytest.raises(ConfigError, match="task.dataset"):
        QA().examples(parse_options(QA.options, {}, where="task"))
    options = parse_options(Arithmetic.options, {"limit": 1, "prompt": "chat"}, where="task")
    with pytest.raises(ConfigError, match="chat template"):
        Arithmetic().evaluate(tiny, options, TrialContext(seed=0, workdir=tmp_path))


def test_arithmetic_runs_as_a_trial_with_the_default_generator(tiny):
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    settings = TrialSettings("gen", "arithmetic", {"limit": 3, "max_new_tokens": 6, "shots": 1}, {"params": {}}, seed=0)
    result = run_trial(tiny, [StagePlan("stage0", "none", {})], settings, number=0)
    assert not result.failed, result.traceback
    assert 0 <= result.metrics["acc"] <= 1 and result.metrics["tokens_total"] == 6.0  # the random model never stops early
    assert "arithmetic_samples.txt" in result.artifacts


@pytest.mark.slow
def test_smollm2_solves_easy_arithmetic_with_the_chat_prompt(tmp_path):
    from paretolab.models import load_subject

    subject = load_subject("smollm2-135m")
    options = parse_options(Arithmetic.options, {"level": 1, "limit": 8, "max_new_tokens": 24}, where="task")
    metrics = Arithmetic().evaluate(subject, options, TrialContext(seed=0, workdir=tmp_path))
    assert metrics["acc"] >= 0.75  # 16/16 measured on level 1 with 16 problems
    assert metrics["tokens_total"] < 24  # stops at the end of its turn


def test_a_task_that_times_its_own_generation_keeps_its_numbers(tiny, monkeypatch):
    """The latency measure fills prefill_ms/decode_tok_s only where the task did not report them."""
    from paretolab.measure.measures import Latency
    from paretolab.records import StagePlan, TrialSettings
    from paretolab.study.trial import run_trial

    monkeypatch.setattr(Latency, "measure", lambda self, subject, options, ctx: {"prefill_ms": -1.0, "decode_tok_s": -1.0, "prefill_ms_iqr": -2.0})
    measures = {"latency": {}}
    generation = TrialSettings("gen", "arithmetic", {"limit": 2, "max_new_tokens": 4, "shots": 1}, measures, seed=0)
    perplexity = TrialSettings("ppl", "perplexity", {"max_tokens": 256, "context": 128, "stride": 128}, measures, seed=0)
    by_task = run_trial(tiny, [StagePlan("stage0", "none", {})], generation, number=0)
    by_measure = run_trial(tiny, [StagePlan("stage0", "none", {})], perplexity, number=0)
    assert not by_task.failed and not by_measure.failed, (by_task.traceback, by_measure.traceback)
    assert by_task.metrics["prefill_ms"] > 0 and by_task.metrics["decode_tok_s"] > 0
    assert by_measure.metrics["prefill_ms"] == -1.0 and by_measure.metrics["decode_tok_s"] == -1.0
    # the measure's spread goes with its own prefill_ms, never beside the task's
    assert "prefill_ms_iqr" not in by_task.metrics and by_measure.metrics["prefill_ms_iqr"] == -2.0
