"""The dashboard served in the background and a headless Chromium page to look at it: what the browser tests and
`make screenshots` (docs/screenshots.py) share.

``serve`` runs the real CLI (`paretolab dashboard --home HOME`) on a free loopback port and stops its whole process
group on every path. ``chromium_page`` drives the system's Chromium through Playwright (never a downloaded browser;
Playwright is in the `dev` extra, Chromium from `apt-get install -y chromium` or PARETOLAB_CHROMIUM=/path).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("PARETOLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
STORE_ENV = ("PARETOLAB_OPTUNA_STORAGE", "PARETOLAB_TRACKING_URI", "MLFLOW_TRACKING_URI")  # --home alone names the stores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(home: Path, log: Path, *, timeout_s: float = 120) -> Iterator[str]:
    """`paretolab dashboard --home HOME` on a free loopback port, its output in ``log``; yields its URL once it answers.
    A server that exits or does not answer in ``timeout_s`` raises RuntimeError with its log."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in STORE_ENV}
    with log.open("w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "paretolab"), "dashboard", "--home", str(home), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, cwd=log.parent, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the dashboard did not start (exit {proc.poll()}); its log:\n{log.read_text()}")
                time.sleep(0.5)
            yield url
        finally:  # the whole process group: the server and anything it started
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def chromium_page(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A Playwright page in headless Chromium (the system's); the browser is closed after."""
    if not Path(CHROMIUM).is_file():
        raise FileNotFoundError(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (or set PARETOLAB_CHROMIUM)")
    from playwright.sync_api import sync_playwright  # the `dev` extra

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()
