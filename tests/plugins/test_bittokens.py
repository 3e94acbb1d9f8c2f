"""bittokens: the float64 codec round-trips exactly; encodings count tokens as claimed; a short train stage runs under each encoding."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.method import Method
from paretolab.plugins.bittokens import (
    BITS,
    BitTokens,
    DigitTokens,
    Encoded,
    answer_accuracy,
    bits_float,
    decode_logits,
    float_bits,
    number_features,
    number_tokenizer,
)
from paretolab.testing import MethodContract
from paretolab.training.arithmetic import Problem, is_heldout, numeric_problems

# every kind of float64 the codec supports: signs, zeros, subnormals, the extremes, infinities
VALUES = [0.0, -0.0, 1.0, -1.0, 85.0, 9801.0, -2.5, 0.1, -1 / 3, math.pi, 1e-300, -5e-324, 2.2250738585072014e-308,
          1.7976931348623157e308, -1.7976931348623157e308, 123456789.123, float("inf"), float("-inf")]


def test_float64_round_trip_is_exact() -> None:
    x = torch.tensor(VALUES, dtype=torch.float64)
    assert torch.equal(bits_float(float_bits(x)).view(torch.int64), x.view(torch.int64))  # bit for bit, -0.0 and subnormals too
    # bits -> the ±1 sign pattern of the embedding -> a head that reads that sign pattern decodes the same float
    signs = number_features(x, reciprocal=False)
    assert signs.shape == (len(VALUES), BITS) and set(signs.unique().tolist()) == {-1.0, 1.0}
    assert torch.equal(decode_logits(signs).view(torch.int64), x.view(torch.int64))
    random = torch.randn(2000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 1e6
    assert torch.equal(decode_logits(number_features(random, reciprocal=False)), random)


def test_reciprocal_channels_hold_one_over_x() -> None:
    x = torch.tensor([4.0, -0.125, 3.0], dtype=torch.float64)
    feats = number_features(x, reciprocal=True)
    assert feats.shape == (3, 2 * BITS)
    assert torch.equal(decode_logits(feats[:, BITS:]), 1 / x)


def test_a_number_is_one_token_only_under_bits() -> None:
    line = "47*38=1786\n"
    counts = {enc: len(Encoded(enc, number_tokenizer(enc)).ids([line])[0]) for enc in ("bits", "digit", "digit3")}
    assert counts == {"bits": 6, "digit": 11, "digit3": 7}  # 47 * 38 = 178 6 \\n
    enc = Encoded("bits", number_tokenizer("bits"))
    ids = enc.ids(["1786/38=47\n"])[0]
    assert ids.count(enc.num_id) == 3 and enc.values("1786/38=47\n") == [1786.0, 38.0, 47.0]
    digits = number_tokenizer("digit3")
    assert digits.decode(digits("10050?3=<\n", add_special_tokens=False)["input_ids"]) == "10050?3=<\n"


def test_numeric_problems_have_exact_answers_and_keep_the_addition_split() -> None:
    problems = numeric_problems(400, 0, heldout=False)
    assert {p.op for p in problems} == {"+", "*", "/", "?"}
    for p in problems:
        if p.op == "/":
            assert int(p.result) * p.b == p.a
        assert not is_heldout(p.a, p.b, p.op)
    assert Problem(47, 38, "?").line == "47?38=>\n" and Problem(3, 3, "?").result == "="
    assert is_heldout(3, 4) == is_heldout(3, 4, "+")  # the addition corpora's held-out pairs did not move


def test_digit3_refuses_a_small_vocabulary(tmp_path: Any) -> None:
    subject = TinyLlama(layers=1, hidden=64).load()
    with pytest.raises(ConfigError, match="digit3 needs"):
        DigitTokens().transform(subject, {"group": 3}, TrialContext(seed=0, workdir=tmp_path))


# last/first curve-point train loss (each the mean of 5 steps), measured on train seeds 0-3: bits 0.09-0.12, digit 0.55-0.62
LEARNED_RATIO = {"bits": 0.25, "digit": 0.8}


@pytest.mark.parametrize("encoding", ["bits", "digit"])
def test_train_stage_learns_under_each_encoding(encoding: str, tmp_path: Any) -> None:
    from paretolab.training.loop import train
    from paretolab.training.method import parse_train_options

    subject = TinyLlama(layers=1, hidden=64).load()
    ctx = TrialContext(seed=0, workdir=tmp_path)
    method = BitTokens() if encoding == "bits" else DigitTokens()
    subject = method.transform(subject, {}, ctx)
    opts = parse_train_options({"tokens": 24 * 8 * 65, "seq_len": 24, "batch": 8, "lr": 1e-2, "eval_every": 5, "eval_tokens": 64}, where="t")
    train(subject, opts, ctx, val_corpus="numeric-val")
    losses = [row["train_loss"] for row in subject.training.curve]
    assert len(losses) == 13 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < LEARNED_RATIO[encoding] * losses[0], losses  # the numbers hook's loss fell: the model learned numeric-train
    # 65 steps learn no exact answers (exact_acc is 0 trained or not), so only the tokens per problem are checked here
    scores = answer_accuracy(subject, numeric_problems(16, 1, heldout=True), encoding=encoding, reciprocal=False)
    assert 0.0 <= scores["exact_acc"] <= 1.0
    if encoding == "bits":
        assert scores["tokens_per_problem"] == 6.0  # <num> op <num> = <num> \n
    else:
        assert scores["tokens_per_problem"] > 8


class TestBitTokensContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return BitTokens()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"reciprocal": False, "eval_problems": 16}  # TinyLlama's hidden 64 holds the 64 bits, not 1/x's too


class TestDigitTokensContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return DigitTokens()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {"group": 1, "eval_problems": 16}  # TinyLlama's byte vocabulary is too small for group 3
