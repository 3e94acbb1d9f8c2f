"""The classic byte codecs PMATIC is compared against: gzip, xz (LZMA) and zstd, at their strongest levels."""

from __future__ import annotations

import gzip
import lzma
from dataclasses import dataclass

CODECS = ("gzip", "xz", "zstd")


@dataclass(frozen=True)
class ByteCodec:
    """compress/decompress bytes with one standard codec."""

    name: str

    def compress(self, data: bytes) -> bytes:
        if self.name == "gzip":
            return gzip.compress(data, compresslevel=9, mtime=0)
        if self.name == "xz":
            return lzma.compress(data, preset=9 | lzma.PRESET_EXTREME)
        import zstandard

        return zstandard.ZstdCompressor(level=19).compress(data)

    def decompress(self, data: bytes) -> bytes:
        if self.name == "gzip":
            return gzip.decompress(data)
        if self.name == "xz":
            return lzma.decompress(data)
        import zstandard

        return zstandard.ZstdDecompressor().decompress(data)
