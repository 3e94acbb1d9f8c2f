"""A bit-level integer arithmetic coder (Witten–Neal–Cleary with pending bits), exact in Python ints.

Both PMATIC and the plain token-level baseline drive it with integer frequencies, so the encoder
and the decoder agree bit for bit whenever they feed it the same integers.
"""

from __future__ import annotations

PRECISION = 48  # bits of the coding interval: frequencies up to 2**40 leave room to spare
_FULL = (1 << PRECISION) - 1
_HALF = 1 << (PRECISION - 1)
_QUARTER = 1 << (PRECISION - 2)


class Encoder:
    """Narrows [low, high] by each symbol's [cum_low, cum_high) / total and emits settled bits."""

    def __init__(self) -> None:
        self.low, self.high, self.pending = 0, _FULL, 0
        self.bits: list[int] = []

    def encode(self, cum_low: int, cum_high: int, total: int) -> None:
        """Code a symbol whose frequency interval is [cum_low, cum_high) out of ``total``."""
        if not 0 <= cum_low < cum_high <= total:
            raise ValueError(f"empty or bad interval [{cum_low}, {cum_high}) of {total}")
        span = self.high - self.low + 1
        self.high = self.low + span * cum_high // total - 1
        self.low = self.low + span * cum_low // total
        while True:
            if self.high < _HALF:
                self._emit(0)
            elif self.low >= _HALF:
                self._emit(1)
                self.low -= _HALF
                self.high -= _HALF
            elif self.low >= _QUARTER and self.high < _HALF + _QUARTER:
                self.pending += 1
                self.low -= _QUARTER
                self.high -= _QUARTER
            else:
                break
            self.low, self.high = 2 * self.low, 2 * self.high + 1

    def _emit(self, bit: int) -> None:
        self.bits.append(bit)
        self.bits.extend([1 - bit] * self.pending)
        self.pending = 0

    def finish(self) -> list[int]:
        """Flush enough bits to single out the final interval; returns all bits."""
        self.pending += 1
        self._emit(0 if self.low < _QUARTER else 1)
        return self.bits


class Decoder:
    """Mirrors Encoder: ``target(total)`` finds the frequency a symbol must cover, ``consume`` removes it."""

    def __init__(self, bits: list[int]) -> None:
        self.bits, self.position = bits, 0
        self.low, self.high, self.value = 0, _FULL, 0
        for _ in range(PRECISION):
            self.value = 2 * self.value + self._next_bit()

    def _next_bit(self) -> int:
        bit = self.bits[self.position] if self.position < len(self.bits) else 0
        self.position += 1
        return bit

    def target(self, total: int) -> int:
        """The cumulative frequency in [0, total) the next symbol's interval contains."""
        span = self.high - self.low + 1
        return min(((self.value - self.low + 1) * total - 1) // span, total - 1)

    def consume(self, cum_low: int, cum_high: int, total: int) -> None:
        """Remove the decoded symbol's interval, exactly as the encoder narrowed it."""
        span = self.high - self.low + 1
        self.high = self.low + span * cum_high // total - 1
        self.low = self.low + span * cum_low // total
        while True:
            if self.high < _HALF:
                pass
            elif self.low >= _HALF:
                self.low -= _HALF
                self.high -= _HALF
                self.value -= _HALF
            elif self.low >= _QUARTER and self.high < _HALF + _QUARTER:
                self.low -= _QUARTER
                self.high -= _QUARTER
                self.value -= _QUARTER
            else:
                break
            self.low, self.high = 2 * self.low, 2 * self.high + 1
            self.value = 2 * self.value + self._next_bit()


class AdaptiveBit:
    """A binary model whose counts both sides update identically (used for PMATIC's helper bits)."""

    def __init__(self, zeros: int = 1, ones: int = 1) -> None:
        self.counts = [zeros, ones]  # prior counts: a skewed prior saves learning cost on short texts

    def interval(self, bit: int) -> tuple[int, int, int]:
        zero, total = self.counts[0], self.counts[0] + self.counts[1]
        return (0, zero, total) if bit == 0 else (zero, total, total)

    def update(self, bit: int) -> None:
        self.counts[bit] += 1
        if self.counts[0] + self.counts[1] > 1 << 16:  # keep adapting to the recent rate
            self.counts = [max(1, c // 2) for c in self.counts]


def encode_bit(encoder: Encoder, model: AdaptiveBit, bit: int) -> None:
    """Code one bit under an adaptive model and update it."""
    encoder.encode(*model.interval(bit))
    model.update(bit)


def decode_bit(decoder: Decoder, model: AdaptiveBit) -> int:
    """Decode one bit coded by encode_bit."""
    zero, total = model.counts[0], model.counts[0] + model.counts[1]
    bit = 0 if decoder.target(total) < zero else 1
    decoder.consume(*model.interval(bit))
    model.update(bit)
    return bit
