"""pmatic: encode -> decode identity under real and synthetic encoder/decoder mismatch; plain arithmetic coding breaks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paretolab import TrialContext
from paretolab.errors import ConfigError
from paretolab.models import TinyLlama
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.pmatic import ArithCoding, ByteCodecMethod, Pmatic
from paretolab.plugins.pmatic.lm_coding import PlainCoder, PmaticCoder
from paretolab.tasks.compression import Compression, CompressionOptions
from paretolab.testing import MethodContract

TASK = CompressionOptions(n_texts=1, text_chars=96, threads=2)


@pytest.fixture(scope="module")
def tiny() -> Subject:
    return TinyLlama(layers=2, hidden=64).load()


def compress(method: Any, subject: Subject, tmp_path: Path, **params: Any) -> dict[str, float]:
    ctx = TrialContext(seed=0, workdir=tmp_path)
    own = method.transform(subject.copy(), params, ctx)
    return Compression().evaluate(own, TASK, ctx)


@pytest.mark.parametrize("mismatch", ["prefill", "threads", "bf16", "noise"])
def test_pmatic_decodes_exactly_under_mismatch(tiny: Subject, tmp_path: Path, mismatch: str) -> None:
    # tiny-llama's bf16 copy moves logits by ~5e-3, inside eps = 0.01 (SmolLM2's by ~1.35: outside)
    out = compress(Pmatic(), tiny, tmp_path, mismatch=mismatch, eps=0.01, bin_width=0.5, noise=0.005)
    assert out["decode_ok"] == 1.0
    assert out["logit_mismatch"] <= 0.01
    if mismatch in ("bf16", "noise"):
        assert out["logit_mismatch"] > 1e-4  # the decoder really saw other logits


@pytest.mark.parametrize("mismatch", ["bf16", "noise"])
def test_plain_arithmetic_coding_fails_under_mismatch(tiny: Subject, tmp_path: Path, mismatch: str) -> None:
    out = compress(ArithCoding(), tiny, tmp_path, mismatch=mismatch, noise=0.005)
    assert out["decode_ok"] == 0.0


def test_both_decode_without_mismatch_and_pmatic_costs_bits(tiny: Subject, tmp_path: Path) -> None:
    plain = compress(ArithCoding(), tiny, tmp_path, mismatch="none")
    robust = compress(Pmatic(), tiny, tmp_path, mismatch="none", eps=0.01, bin_width=0.5)
    assert plain["decode_ok"] == robust["decode_ok"] == 1.0
    assert robust["bpb"] > plain["bpb"] and robust["helper_bpb"] > 0


def test_coders_round_trip_random_logits_within_the_bound() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 4, size=(60, 300))
    tokens = [int(rng.choice(300, p=np.exp(r - r.max()) / np.exp(r - r.max()).sum())) for r in logits]
    coder = PmaticCoder(eps=0.02, bin_width=0.5)
    coded = coder.encode(tokens, logits)
    for trial in range(3):
        noisy = iter(logits + rng.uniform(-0.02, 0.02, size=logits.shape))
        first = next(noisy)
        assert coder.decode(coded, first, lambda _token: next(noisy)) == tokens
    plain = PlainCoder().encode(tokens, logits)
    rows = iter(logits)
    assert PlainCoder().decode(plain, next(rows), lambda _token: next(rows)) == tokens


def test_bin_width_must_exceed_eight_eps() -> None:
    with pytest.raises(ConfigError, match="bin_width must exceed 8 \\* eps"):
        PmaticCoder(eps=0.1, bin_width=0.5)


@pytest.mark.parametrize("codec", ["gzip", "xz", "zstd"])
def test_byte_codecs_round_trip(tiny: Subject, tmp_path: Path, codec: str) -> None:
    out = compress(ByteCodecMethod(), tiny, tmp_path, codec=codec)
    assert out["decode_ok"] == 1.0 and 0 < out["bpb"] < 16


def test_compression_needs_a_coder(tiny: Subject, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no coder"):
        Compression().evaluate(tiny.copy(), TASK, TrialContext(seed=0, workdir=tmp_path))


class TestPmaticContract(MethodContract):
    @pytest.fixture
    def method(self) -> Pmatic:
        return Pmatic()


class TestArithCodingContract(MethodContract):
    @pytest.fixture
    def method(self) -> ArithCoding:
        return ArithCoding()


class TestByteCodecContract(MethodContract):
    @pytest.fixture
    def method(self) -> ByteCodecMethod:
        return ByteCodecMethod()
