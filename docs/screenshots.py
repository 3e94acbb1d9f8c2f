"""Take the documentation's dashboard screenshots from the demo, in Chromium, so they cannot go stale: `make screenshots`.

Serves the demo's stores (`make demo` writes them to .paretolab/; ``--home`` to use others) with `paretolab dashboard`
on a free loopback port, opens each page in headless Chromium (Playwright driving the system browser, nothing
downloaded) 1280 pixels wide and writes docs/img/<page>.png (the server and the browser: paretolab.dashboard.background,
as the browser tests use them; the server's whole process group is stopped on every path).
Needs the `dev` extra (playwright) and Chromium (`apt-get install -y chromium`, or PARETOLAB_CHROMIUM=/path).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from paretolab.dashboard.background import CHROMIUM, chromium_page, serve

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "img"
WIDTH = 1280  # the width the Studies page must fit (issue 59)
# (file name, URL query, text that says the page has rendered, wait for a plot, window height: Streamlit scrolls
# inside its own container, so a page taller than the window is taken in a taller window)
PAGES = (
    ("studies", "page=Studies", "Studies", False, 900),
    ("frontier", "page=Frontier&study={study}", "Frontier · {study}", True, 900),
    ("trial", "page=Trial&study={study}&trial={trial}", "Trial · {study}", False, 900),
    ("compare", "page=Compare&study={study}", "Compare · {study}", True, 1380),
)


def take(url: str, study: str, trial: int, out: Path) -> list[Path]:
    from playwright.sync_api import expect

    written = []
    with chromium_page(WIDTH, 900) as page:
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
    with tempfile.TemporaryDirectory() as tmp:  # the server's log and working folder
        try:
            with serve(home, Path(tmp) / "dashboard.log") as url:
                take(url, args.study, args.trial, out)
        except RuntimeError as exc:
            print(f"screenshots: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
