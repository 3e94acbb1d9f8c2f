"""A trial's peak resident memory (``peak_rss_mb``), sampled by a thread while the trial runs."""

from __future__ import annotations

import threading


class PeakMemory:
    """Samples the process's resident memory every 20 ms while active."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()

    def __enter__(self) -> PeakMemory:
        import psutil

        self._proc = psutil.Process()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.peak_mb = max(self.peak_mb, self._proc.memory_info().rss / 2**20)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
