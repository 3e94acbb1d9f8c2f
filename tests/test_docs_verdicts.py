"""The verdicts the documentation quotes and names are the ones the code prints.

- every verdict line docs/tutorials/verdicts.md quotes (a ``> … **Verdict…`` block quote) appears verbatim in the
  results document it cites (the nearest ``../results/PAGE.md`` link above it: ``pipelines/README.md`` for
  ``compression``), so a re-rendered document cannot leave the tutorial quoting a line it no longer prints;
- the README's verdict rule and the tutorial name every verdict word the code can produce: held, did not hold,
  within noise, inconclusive, and each reason of a no verdict, each phrase taken from the code's own output.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorials" / "verdicts.md"
README = ROOT / "README.md"
CITED = re.compile(r"\]\(\.\./results/([\w-]+)\.md\)")


def _results_pages() -> dict[str, Path]:
    """Results page -> the document it is (the site's hook: ``compression`` -> pipelines/README.md)."""
    spec = importlib.util.spec_from_file_location("paretolab_docs_hook", ROOT / "docs" / "_hooks" / "reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    return {page: ROOT / "pipelines" / name for name, page in hook.RESULTS.items()}


def quoted_verdicts(text: str) -> list[tuple[str, str]]:
    """(cited page, quoted line) for every block-quoted verdict line, each with the nearest results link above it."""
    found, page = [], ""
    for line in text.splitlines():
        if line.startswith("> ") and "**Verdict" in line:
            found.append((page, line[2:].strip()))
        for cited in CITED.findall(line):
            page = cited
    return found


def misquoted(text: str) -> list[str]:
    pages = _results_pages()
    wrong = []
    for page, line in quoted_verdicts(text):
        document = pages.get(page)
        if document is None:
            wrong.append(f"{line[:60]}…: cites no results document (link ../results/PAGE.md above it)")
        elif line not in document.read_text(encoding="utf-8"):
            wrong.append(f"{line[:60]}…: not in {document.relative_to(ROOT)}")
    return wrong


def test_the_tutorial_quotes_verdict_lines_its_cited_document_prints():
    text = TUTORIAL.read_text(encoding="utf-8")
    assert quoted_verdicts(text), "the tutorial quotes no verdict line of a results document"
    assert misquoted(text) == []


def test_a_verdict_line_the_document_does_not_print_is_caught():
    text = TUTORIAL.read_text(encoding="utf-8")
    page, line = quoted_verdicts(text)[0]
    changed = text.replace(line, line.replace("held", "did not hold", 1))
    assert len(misquoted(changed)) == 1
    assert misquoted(text.replace("../results/", "../elsewhere/")) != []  # a quote must cite its document


# ---- every verdict word the code can produce ---------------------------------------------------------------------

def _words() -> dict[str, str]:
    """Each verdict the code words, by what it is, as the code prints it (the phrase the docs must name)."""
    from paretolab.results.claims import budget_verdict, calibration_verdict, chance_verdict, did_not_work
    from paretolab.results.estimate import Estimate, margin_band, verdict
    from paretolab.results.pairing import Group
    from paretolab.study.report_spec import Claim

    def judged(low, high, expect="lower", margin=None, units="4 windows"):
        band = margin_band(margin, "lower", False)
        return verdict(Estimate((low + high) / 2 if low is not None else 0.0, low, high, 3, units), expect, "lower", band)

    def pair(method=None, baseline=None):
        m = {"trial": 1, "ppl": 20.0, "decode_ok": 1.0, "train_tokens": 1000.0, "run_params": {}, **(method or {})}
        b = {"trial": 0, "ppl": 20.0, "decode_ok": 1.0, "train_tokens": 1000.0, "run_params": {}, **(baseline or {})}
        return Group((), [(m, b)])

    claim = Claim("t", "ppl", "rtn", "none", "lower", ())
    return {
        "held": judged(-2.0, -1.0),
        "did not hold": judged(1.0, 2.0),
        "within noise": judged(-1.0, 1.0),
        "inconclusive": judged(-1.0, 1.0, "no_worse", 0.5),
        "did not work": did_not_work(Claim("t", "ppl", "rtn", "none", works="decode_ok"), pair({"decode_ok": 0.0})),
        "one calibration draw": calibration_verdict(pair({"run_params": {"info.calibration_draws": "pydoc:0:32"}})),
        "budgets differ": budget_verdict(Claim("t", "ppl", "rtn", "none", budget="tokens"), pair({"train_tokens": 2000.0})),
        "at chance": chance_verdict(claim, pair({"ppl": 60000.0}, {"ppl": 60000.0}), lambda metric: (49152.0, "vocabulary 49152")),
        "no variation observed": judged(1.0, 1.0),
        "one replicate and no per-example scores": judged(None, None),
    }


def test_each_verdict_word_is_what_the_code_prints():
    words = _words()
    for word, said in words.items():
        assert said is not None and word in said, (word, said)
    assert {said.startswith("no verdict") for word, said in words.items() if word not in ("held", "did not hold", "within noise", "inconclusive")} == {True}


@pytest.mark.parametrize("document", [README, TUTORIAL], ids=["README", "tutorial"])
def test_the_docs_name_every_verdict_the_code_can_produce(document):
    text = " ".join(document.read_text(encoding="utf-8").split())  # line breaks undone
    assert "no verdict" in text
    missing = [word for word in _words() if word not in text]
    assert missing == [], f"{document.relative_to(ROOT)} does not name: {missing}"
