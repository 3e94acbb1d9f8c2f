"""The assoc_recall task and its synthetic corpora: seeded and well formed, one token per word, scored right, trainable on."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from paretolab import TrialContext
from paretolab.data import encode, load_corpus
from paretolab.errors import ConfigError
from paretolab.plugin_api.manager import registries
from paretolab.plugin_api.options import parse_options
from paretolab.plugin_api.subject import Subject
from paretolab.tasks.assoc_recall import N_PAIRS, SEPARATOR, AssocRecallOptions
from paretolab.training.method import parse_train_options


@pytest.fixture(scope="module")
def scratch() -> Subject:
    return registries().models.get("scratch-1m").load()


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return TrialContext(seed=0, workdir=tmp_path)


def lines(name: str) -> list[list[str]]:
    return [line.split() for line in load_corpus(name)[0].splitlines()]


def test_corpora_are_seeded_well_formed_and_distinct() -> None:
    train, val = lines("assoc-recall-train"), lines("assoc-recall-val")
    assert (len(train), len(val)) == (20_000, 2_000)
    assert load_corpus("assoc-recall-val")[1] == load_corpus("assoc-recall-val")[1]
    assert train[:50] != val[:50]
    for words in val[:200]:
        assert len(words) == 4 * N_PAIRS + 1 and words[2 * N_PAIRS] == SEPARATOR
        pairs = dict(zip(words[0 : 2 * N_PAIRS : 2], words[1 : 2 * N_PAIRS : 2]))
        queries = list(zip(words[2 * N_PAIRS + 1 :: 2], words[2 * N_PAIRS + 2 :: 2]))
        assert len(pairs) == N_PAIRS and sorted(k for k, _ in queries) == sorted(pairs)  # distinct keys, each asked once
        assert all(pairs[k] == v for k, v in queries)


def test_every_word_is_one_token_of_the_scratch_tokenizer(scratch: Subject) -> None:
    text = load_corpus("assoc-recall-val")[0]
    sample = "\n".join(text.splitlines()[:20])
    ids = encode(scratch.tokenizer, sample)
    assert len(ids) == 20 * (4 * N_PAIRS + 1) + 19  # one token per word, one per newline
    words = sample.split("\n")[0].split()
    assert encode(scratch.tokenizer, sample.split("\n")[0]) == [encode(scratch.tokenizer, " " + w)[0] for w in words]


class Oracle(torch.nn.Module):
    """Predicts, after each query key, the value paired with it earlier in the row (and token 0 elsewhere)."""

    def __init__(self, tokenizer: object, vocab: int, wrong: bool = False) -> None:
        super().__init__()
        self.sep = encode(tokenizer, " " + SEPARATOR)[0]
        self.vocab, self.wrong = vocab, wrong
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the subject a device

    def forward(self, input_ids: torch.Tensor, **kwargs: object) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, self.vocab)
        for b, row in enumerate(input_ids.tolist()):
            sep = row.index(self.sep)
            pairs = dict(zip(row[0:sep:2], row[1:sep:2]))
            for t in range(sep + 1, len(row), 2):
                value = pairs.get(row[t], 0)
                logits[b, t, (value + 1) % self.vocab if self.wrong else value] = 1.0
        return SimpleNamespace(logits=logits)


def test_task_scores_recall_and_keeps_per_example_scores(scratch: Subject, ctx: TrialContext) -> None:
    task = registries().tasks.get("assoc_recall")
    options = parse_options(AssocRecallOptions, {"examples": 40, "batch_size": 16}, where="task")
    vocab = scratch.model.config.vocab_size
    perfect = task.evaluate(Subject(model=Oracle(scratch.tokenizer, vocab), tokenizer=scratch.tokenizer, model_name="oracle"), options, ctx)
    assert perfect["acc"] == 1.0 and perfect["n_examples"] == 40
    wrong = task.evaluate(Subject(model=Oracle(scratch.tokenizer, vocab, wrong=True), tokenizer=scratch.tokenizer, model_name="x"), options, ctx)
    assert wrong["acc"] == 0.0
    untrained = task.evaluate(scratch, options, ctx)
    assert 0.0 <= untrained["acc"] < 0.3 and untrained["acc_stderr"] >= 0.0
    saved = json.loads((ctx.workdir / "per_example.json").read_text())
    assert saved["unit"] == "example" and len(saved["scores"]["acc"]) == 40


def test_task_refuses_a_corpus_of_other_text(scratch: Subject, ctx: TrialContext) -> None:
    with pytest.raises(ConfigError, match="not an associative-recall corpus"):
        registries().tasks.get("assoc_recall").evaluate(scratch, AssocRecallOptions(corpus="pydoc", examples=4), ctx)


def test_train_stage_takes_the_synthetic_corpus(scratch: Subject) -> None:
    from paretolab.training.batches import corpus_token_ids

    assert parse_train_options({"corpus": "assoc-recall-train"}, where="train").corpus == "assoc-recall-train"
    ids = corpus_token_ids(scratch.tokenizer, "assoc-recall-train")
    assert ids.numel() == 20_000 * (4 * N_PAIRS + 2)  # 33 words and a newline per line
    with pytest.raises(ConfigError, match="assoc-recall-val"):  # the evaluated corpus is refused as training text
        from paretolab.training.method import check_not_evaluation_corpus

        check_not_evaluation_corpus("assoc-recall-val", "assoc-recall-val", where="train.corpus")
