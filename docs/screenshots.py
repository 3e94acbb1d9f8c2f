"""Take the documentation's dashboard screenshots from the demo, in Chromium, so they cannot go stale: `make screenshots`.

Serves the demo's stores (`make demo` writes them to .paretolab/; ``--home`` to use others) with `paretolab dashboard`
on a free loopback port, opens each page in headless Chromium (Playwright driving the system browser, nothing
downloaded) 1280 pixels wide and writes docs/img/<page>.png. The server's whole process group is stopped on every path.
Needs the `dev` extra (playwright) and Chromium (`apt-get install -y chromium`, or PARETOLAB_CHROMIUM=/path).
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
CHROMIUM = os.environ.get("PARETOLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
WIDTH = 1280  # the width the Studies page must fit (issue 59)
# (file name, URL query, text that says the page has rendered, wait for a plot, window height: Streamlit scrolls
# inside its own container, so a page taller than the window is taken in a taller window)
PAGES = (
    ("studies", "page=Studies", "Studies", False, 900),
    ("frontier", "page=Frontier&study={study}", "Frontier · {study}", True, 900),
    ("trial", "page=Trial&study={study}&trial={trial}", "Trial · {study}", False, 900),
    ("compare", "page=Compare&study={study}", "Compare · {study}", True, 1380),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(home: Path, log: Path, timeout_s: float = 120) -> Iterator[str]:
    """`paretolab dashboard --home HOME` on a free loopback port; yields its URL, stops its process group after."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PARETOLAB_OPTUNA_STORAGE", "PARETOLAB_TRACKING_URI", "MLFLOW_TRACKING_URI")}
    with log.open("w") as out:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "paretolab"), "dashboard", "--home", str(home), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
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
                    raise SystemExit(f"screenshots: the dashboard did not start (exit {proc.poll()}); its log:\n{log.read_text()}")
                time.sleep(0.5)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def take(url: str, study: str, trial: int, out: Path) -> list[Path]:
    from playwright.sync_api import expect, sync_playwright

    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": 900})
            for name, query, ready, plot, height in PAGES:
                page.set_viewport_size({"width": WIDTH, "height": height})
                page.goto(f"{url}/?{query.format(study=study, trial=trial)}", wait_until="domcontentloaded")
                expect(page.get_by_text(ready.format(study=study), exact=True).first).to_be_visible(timeout=90_000)
                if plot:
                    expect(page.locator(".js-plotly-plot").first).to_be_visible(timeout=90_000)
                page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=90_000)  # the run finished
                time.sleep(1.5)  # charts finish their transition
                path = out / f"{name}.png"
                page.screenshot(path=str(path), full_page=False)
                written.append(path)
                print(f"wrote {path.relative_to(ROOT)}", flush=True)
        finally:
            browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", default=str(ROOT / ".paretolab"), help="the stores to serve (default: .paretolab, where `make demo` writes)")
    parser.add_argument("--study", default="demo")
    parser.add_argument("--trial", type=int, default=1, help="the trial the Trial page shows (default 1: the demo's 8-bit RTN)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args(argv)
    home = Path(args.home)
    if not (home / "optuna.db").is_file():
        print(f"screenshots: no stores in {home}: run `make demo` first (or give --home)", file=sys.stderr)
        return 2
    if not Path(CHROMIUM).is_file():
        print(f"screenshots: no Chromium at {CHROMIUM}: apt-get install -y chromium, or set PARETOLAB_CHROMIUM", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with serve(home, out / ".dashboard.log") as url:
        take(url, args.study, args.trial, out)
    (out / ".dashboard.log").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
