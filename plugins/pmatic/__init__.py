"""Lossless text compression with a language model: PMATIC (mismatch-robust) and its baselines.

Methods of kind ``coding`` put a coder on the subject (``subject.info["coder"]``) and name the
encoder/decoder mismatch the ``compression`` task reproduces (``subject.info["mismatch"]``):
``pmatic`` (quantised log-odds bins + helper bits, :mod:`.lm_coding`), ``arith_coding`` (plain
arithmetic coding with the same model: breaks under any mismatch), ``byte_codec`` (gzip, xz, zstd).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from optuna.distributions import CategoricalDistribution, FloatDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.pmatic.codecs import CODECS, ByteCodec
from paretolab.plugins.pmatic.lm_coding import PlainCoder, PmaticCoder
from paretolab.tasks.compression import MISMATCHES

PMATIC_PAPER = Paper(
    "Synchronizing Probabilities in Model-Driven Lossless Compression (PMATIC)", "ICLR 2026 (Adler & Tang); generalised in ICML 2026",
    "https://arxiv.org/abs/2601.10678",
)


class _LMCoding(Method):
    """A coder driven by the subject's model, run under one named encoder/decoder mismatch."""

    kind = "coding"
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {"mismatch": CategoricalDistribution(list(MISMATCHES)), "noise": FloatDistribution(0.0, 0.1)}

    def defaults(self) -> dict[str, Any]:
        return {"mismatch": "none", "noise": 5e-4}

    def coder(self, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        params = {**self.defaults(), **params}
        if params["mismatch"] not in MISMATCHES:
            raise ConfigError(f"{self.name}.mismatch: expected one of {', '.join(MISMATCHES)}, got {params['mismatch']!r}")
        subject.info["coder"] = self.coder(params)
        subject.info["coder_name"] = self.name
        subject.info["mismatch"] = str(params["mismatch"])
        subject.info["mismatch_noise"] = float(params["noise"])
        return subject


class Pmatic(_LMCoding):
    """PMATIC: robust to every logit moving by up to ``eps`` (see lm_coding for what is the paper's and what is ours)."""

    name = "pmatic"
    paper = PMATIC_PAPER

    def search_space(self) -> dict[str, Any]:
        return {**super().search_space(), "eps": FloatDistribution(1e-5, 1e-2, log=True), "bin_width": FloatDistribution(0.1, 1.5)}  # any draw keeps bin_width > 8 * eps

    def defaults(self) -> dict[str, Any]:
        return {**super().defaults(), "eps": 1e-3, "bin_width": 0.5}

    def coder(self, params: dict[str, Any]) -> Any:
        return PmaticCoder(eps=float(params["eps"]), bin_width=float(params["bin_width"]))


class ArithCoding(_LMCoding):
    """Plain token-level arithmetic coding with the model's full softmax (the baseline PMATIC fixes)."""

    name = "arith_coding"
    paper = Paper("Language Modeling Is Compression", "ICLR 2024", "https://arxiv.org/abs/2309.10668")

    def coder(self, params: dict[str, Any]) -> Any:
        return PlainCoder()


class ByteCodecMethod(Method):
    """A classic byte codec (gzip -9, xz -9e, zstd -19): no model, nothing to mismatch."""

    name = "byte_codec"
    kind = "coding"
    cost_is = "real"
    paper = Paper("gzip / xz (LZMA) / zstd, Python stdlib and zstandard")

    def search_space(self) -> dict[str, Any]:
        return {"codec": CategoricalDistribution(list(CODECS))}

    def defaults(self) -> dict[str, Any]:
        return {"codec": "zstd"}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        codec = str({**self.defaults(), **params}["codec"])
        if codec not in CODECS:
            raise ConfigError(f"byte_codec.codec: expected one of {', '.join(CODECS)}, got {codec!r}")
        subject.info["coder"] = ByteCodec(codec)
        subject.info["coder_name"] = codec
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Pmatic())
    register(ArithCoding())
    register(ByteCodecMethod())
