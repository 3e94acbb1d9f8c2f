"""Processes that pull the same GGUF model at once (a study's Ray workers, parallel test processes) convert it once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from paretolab.models.gguf import SmolLM2


class _CountingSmolLM2(SmolLM2):
    """SmolLM2 whose conversion only writes the two files `is_cached` looks for, slowly, counting its calls."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, 0

    @property
    def cache_path(self) -> Path:
        return self.root / "models" / self.name

    def convert(self) -> str:
        self.calls += 1
        time.sleep(0.3)  # long enough that every other thread reaches the lock while this one converts
        self.cache_path.mkdir(parents=True, exist_ok=True)
        (self.cache_path / "config.json").write_text("{}")
        (self.cache_path / "model.safetensors").write_bytes(b"")
        return str(self.cache_path)


def test_concurrent_pulls_convert_once_and_all_get_the_converted_copy(tmp_path):
    source = _CountingSmolLM2(tmp_path)
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(source.pull())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert source.calls == 1
    assert got == [str(source.cache_path)] * 4
    assert source.pull() == str(source.cache_path) and source.calls == 1  # cached: no lock, no conversion
