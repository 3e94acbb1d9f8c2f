"""Coding token ids with a language model's next-token logits: plain arithmetic coding and PMATIC.

Plain (the baseline): the softmax is turned into integer frequencies over the whole vocabulary;
one differing floor() anywhere between encoder and decoder breaks every later token.

PMATIC (Adler & Tang, ICLR 2026, arXiv 2601.10678; no official code, this is our construction from
the paper's summary: "quantize bit probabilities into bins and use low-entropy helper bits to
synchronise both ends on the same quantised probability"):
- a token id is coded as its B = ceil(log2 V) bits, most significant first (a binary tree over the
  vocabulary; ours — the paper's binarisation is not known to us);
- each binary decision's log-odds lambda = LSE(logits of the 1-subtree) - LSE(logits of the 0-subtree)
  moves by at most 2*eps when every logit moves by at most eps (the paper's bounded-mismatch
  assumption |u - v|_inf <= eps);
- lambda is clipped to +-C and quantised to bins of width w (ours: uniform bins in log-odds);
  when lambda is within 2*eps of a bin boundary the encoder sends helper bit 1 and both sides code
  with the boundary's probability, else helper bit 0 and both code with the bin centre's;
  the decoder's lambda' is then provably in the same bin, or nearest the same boundary (w > 8*eps);
- bins are uniform in t = g(lambda), g squashing large |lambda| (ours), so a bin is wider where a
  decision is confident: the coding loss per decision stays small and a confident decision is
  rarely near a boundary (the test uses the local slope of g);
- helper bits are arithmetic-coded with an adaptive count per tree depth and a skewed prior (ours),
  so they cost about the entropy of the rare "near a boundary" event.
Exceeding the bound (mismatch > eps) can break decoding; that is what the decode_ok metric counts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from paretolab.errors import ConfigError
from paretolab.plugins.pmatic.coder import (
    AdaptiveBit,
    Decoder,
    Encoder,
    decode_bit,
    encode_bit,
)

NextLogits = Callable[[int], np.ndarray]  # decoder side: logits for the next token, given the token just decoded

_PLAIN_TOTAL = 1 << 30
_BIT_TOTAL = 1 << 16
# Prior counts (zeros, ones) of each depth's helper-bit model (ours): on SmolLM2 at eps 1e-3 about
# 1 decision in a few hundred is near a boundary; a flat (1, 1) prior spent ~0.2 bits/byte learning that.
_HELPER_PRIOR = (256, 1)


@dataclass
class Coded:
    """A coded text: its bits and, for PMATIC, the estimated bits spent on helper bits."""

    bits: list[int]
    n_tokens: int
    helper_bits: float = 0.0


class PlainCoder:
    """Token-level arithmetic coding with the full softmax as integer frequencies (the baseline)."""

    name = "arith_coding"

    def _cumulative(self, logits: np.ndarray) -> np.ndarray:
        z = logits.astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        freq = np.floor(p * (_PLAIN_TOTAL - len(p))).astype(np.int64) + 1  # every token codable
        return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(freq)])

    def encode(self, tokens: Sequence[int], logits: Sequence[np.ndarray]) -> Coded:
        encoder = Encoder()
        for token, row in zip(tokens, logits):
            cum = self._cumulative(row)
            encoder.encode(int(cum[token]), int(cum[token + 1]), int(cum[-1]))
        return Coded(encoder.finish(), len(tokens))

    def decode(self, coded: Coded, first: np.ndarray, next_logits: NextLogits) -> list[int]:
        decoder, tokens, row = Decoder(coded.bits), [], first
        for step in range(coded.n_tokens):
            cum = self._cumulative(row)
            total = int(cum[-1])
            token = int(np.searchsorted(cum, decoder.target(total), side="right") - 1)
            decoder.consume(int(cum[token]), int(cum[token + 1]), total)
            tokens.append(token)
            if step + 1 < coded.n_tokens:
                row = next_logits(token)
        return tokens


@dataclass
class PmaticCoder:
    """PMATIC over the binary tree of token ids: quantised log-odds bins plus adaptive helper bits."""

    eps: float = 1e-3  # tolerated mismatch of every logit (|u - v|_inf), nats
    bin_width: float = 0.5  # u: width of a bin of t = g(log-odds) (see _squash); must exceed 8 * eps
    clip: float = 30.0  # log-odds beyond +-clip are coded as +-clip
    name: str = field(default="pmatic", init=False)

    def __post_init__(self) -> None:
        if self.eps < 0:
            raise ConfigError(f"pmatic.eps must be >= 0, got {self.eps}")
        if self.bin_width <= 8 * self.eps:
            raise ConfigError(f"pmatic.bin_width must exceed 8 * eps = {8 * self.eps:g} (a decoder must find one nearest boundary), got {self.bin_width}")
        self._freq: dict[int, int] = {}

    # Bins are uniform in t = g(lambda) = sign(lambda) * 2 * (1 - exp(-|lambda| / 2)) (ours): a bin spans
    # ~u * exp(|lambda| / 2) nats of log-odds, so the coding loss per decision stays ~u^2/96 nats
    # (it scales with p(1-p) * error^2) while confident decisions are rarely near a boundary.
    @staticmethod
    def _squash(log_odds: float) -> float:
        return math.copysign(2.0 * (1.0 - math.exp(-abs(log_odds) / 2.0)), log_odds)

    def _one_freq(self, half_steps: int) -> int:
        """Integer frequency (of 2**16) of bit 1 at t = half_steps * u / 2: the same integers on both sides."""
        if half_steps not in self._freq:
            t = min(abs(half_steps) * self.bin_width / 2, 2.0 - 1e-12)
            log_odds = math.copysign(-2.0 * math.log(1.0 - t / 2.0), half_steps)
            p_one = 1.0 / (1.0 + math.exp(-log_odds))
            self._freq[half_steps] = min(max(round(p_one * _BIT_TOTAL), 1), _BIT_TOTAL - 1)
        return self._freq[half_steps]

    def _levels(self, logits: np.ndarray) -> list[np.ndarray]:
        """levels[d][j]: log-sum-exp of the logits under tree node j at depth d (leaves padded with -inf)."""
        depth = max(1, math.ceil(math.log2(len(logits))))
        leaves = np.full(1 << depth, -np.inf)
        leaves[: len(logits)] = logits.astype(np.float64)
        levels = [leaves]
        with np.errstate(invalid="ignore"):
            while len(levels[0]) > 1:
                levels.insert(0, np.logaddexp(levels[0][0::2], levels[0][1::2]))
        return levels

    def _log_odds(self, levels: list[np.ndarray], depth: int, node: int) -> float:
        children = levels[depth + 1]
        with np.errstate(invalid="ignore"):
            value = float(children[2 * node + 1] - children[2 * node])
        return min(max(value, -self.clip), self.clip) if not math.isnan(value) else 0.0

    def _bin_of(self, log_odds: float, near_boundary: bool) -> int:
        """The quantised t as half-steps of u: even = a boundary, odd = a bin centre."""
        t = self._squash(log_odds) / self.bin_width
        return 2 * round(t) if near_boundary else 2 * math.floor(t) + 1

    def _near_boundary(self, log_odds: float) -> bool:
        """Whether a decoder whose log-odds differ by up to 2*eps could see another bin (the encoder's side of the test)."""
        spread = 2 * self.eps
        local = spread * math.exp(-max(abs(log_odds) - spread, 0.0) / 2.0)  # |g'| <= exp(-|lambda|/2) nearby
        t = self._squash(log_odds)
        return abs(t - round(t / self.bin_width) * self.bin_width) <= local

    def _interval(self, log_odds: float, helper: int, bit: int) -> tuple[int, int, int]:
        one = self._one_freq(self._bin_of(log_odds, bool(helper)))
        return (0, _BIT_TOTAL - one, _BIT_TOTAL) if bit == 0 else (_BIT_TOTAL - one, _BIT_TOTAL, _BIT_TOTAL)

    def encode(self, tokens: Sequence[int], logits: Sequence[np.ndarray]) -> Coded:
        encoder, helpers, helper_bits = Encoder(), None, 0.0
        for token, row in zip(tokens, logits):
            levels = self._levels(row)
            depth = len(levels) - 1
            helpers = helpers or [AdaptiveBit(*_HELPER_PRIOR) for _ in range(depth)]
            node = 0
            for d in range(depth):
                bit = (token >> (depth - 1 - d)) & 1
                log_odds = self._log_odds(levels, d, node)
                helper = int(self._near_boundary(log_odds))
                low, high, total = helpers[d].interval(helper)
                helper_bits -= math.log2((high - low) / total)
                encode_bit(encoder, helpers[d], helper)
                encoder.encode(*self._interval(log_odds, helper, bit))
                node = 2 * node + bit
        return Coded(encoder.finish(), len(tokens), helper_bits)

    def decode(self, coded: Coded, first: np.ndarray, next_logits: NextLogits) -> list[int]:
        decoder, tokens, row, helpers = Decoder(coded.bits), [], first, None
        for step in range(coded.n_tokens):
            levels = self._levels(row)
            depth = len(levels) - 1
            helpers = helpers or [AdaptiveBit(*_HELPER_PRIOR) for _ in range(depth)]
            node = 0
            for d in range(depth):
                helper = decode_bit(decoder, helpers[d])
                log_odds = self._log_odds(levels, d, node)
                bit = int(decoder.target(_BIT_TOTAL) >= self._interval(log_odds, helper, 0)[1])
                decoder.consume(*self._interval(log_odds, helper, bit))
                node = 2 * node + bit
            tokens.append(node)
            if step + 1 < coded.n_tokens:
                row = next_logits(node)
        return tokens
