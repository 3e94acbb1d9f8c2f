"""Every results document opens with its verdicts and shows its pictures.

A document's first block after its title is the summary table (study, claim, verdict with its mark, effect with its
interval), its provenance a bulleted list under it; each study's verdicts one a line with a mark; a wide table is a
decision table with every measurement collapsed under it; every picture it references exists, at the path GitHub
resolves (relative to the document); each study with something to draw shows its frontier, the compression document
the cross-study SmolLM2 frontier, the engines document its engines' frontiers, the layers document its sensitivity plots.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from paretolab.results.documents import bundle_path, read_manifest
from paretolab.results.figures import FIGURES
from paretolab.results.layout import LEGEND, MARKS, NO_VERDICT, best_first, decision_tables, marked_verdicts, verdict_mark
from paretolab.results.summary import COLUMNS
from paretolab.results.verdict_words import effect_text
from tests.conftest import cli_here
from tests.results.test_documents import checkout  # noqa: F401  (the fixture: a checkout with one study's bundle)

ROOT = Path(__file__).resolve().parents[2]
PICTURE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
HEADER = "| " + " | ".join(COLUMNS) + " |"
EVERY_MARK = (*MARKS.values(), NO_VERDICT)


def layout_problems(path: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with the layout of the results document at ``path`` ([] when nothing is)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    problems = []
    if not lines or not lines[0].startswith("# "):
        return [f"{path.name}: no title on its first line"]
    body = [line for line in lines[1:] if line.strip()]
    if not body or body[0] != HEADER:
        problems.append(f"{path.name}: does not open with its summary table ({HEADER}) under its title")
    else:
        at = lines.index(HEADER) + 2
        rows = []
        while at < len(lines) and lines[at].startswith("|"):
            rows.append(lines[at])
            at += 1
        for row in rows:
            verdict = row.split(" | ")[2] if row.count(" | ") >= 3 else ""
            if verdict.strip() and not verdict.startswith(EVERY_MARK):
                problems.append(f"{path.name}: a summary row's verdict has no mark: {row[:120]}")
        if not rows or not lines[at + 1:at + 2] or not lines[at + 1].startswith(LEGEND):
            problems.append(f"{path.name}: the summary table has no row or is not followed by the marks' legend")
    if "**Provenance.**" in lines:
        at = lines.index("**Provenance.**")
        if lines[at + 1:at + 3] and (lines[at + 1] != "" or not lines[at + 2].startswith("- ")):
            problems.append(f"{path.name}: its provenance is no bulleted list (a blank line, then '- ' items)")
    for line in lines:
        if "**Verdict" in line.split(" — ")[0] and not re.match(rf"- ({'|'.join(map(re.escape, EVERY_MARK))}) \*\*Verdict", line):
            problems.append(f"{path.name}: a verdict not on its own marked line: {line[:120]}")
    if sum("<details>" in line for line in lines) != sum(line == "</details>" for line in lines):
        problems.append(f"{path.name}: a <details> block is not closed")
    for line in lines:
        if "<details>" in line and "<summary>Every measurement</summary>" not in line:
            problems.append(f"{path.name}: a collapsed block that is not the every-measurement table: {line}")
    for target in PICTURE.findall("\n".join(lines)):
        if not (path.parent / target).resolve().is_file():
            problems.append(f"{path.name}: shows a picture that does not exist: {target}")
    return problems


def expected_pictures(root: Path = ROOT) -> dict[str, set[str]]:
    """{document: pictures it must show}: each study's drawn frontier, and the manifest's cross-study figures."""
    from paretolab.results.documents import read_figures

    wanted: dict[str, set[str]] = {}
    for doc in read_manifest(root):
        mine = wanted.setdefault(doc.path, set())
        mine |= {f"{FIGURES.as_posix()}/{s}.png" for s in doc.studies if (root / FIGURES / f"{s}.json").is_file()}
        mine |= {f"{f.out}.png" for f in read_figures(root) if f.family == doc.family}
        mine |= {f"{e['sensitivity']}.png" for e in doc.extras if "sensitivity" in e}
    return wanted


def shown(path: Path, root: Path = ROOT) -> set[str]:
    return {(path.parent / t).resolve().relative_to(root).as_posix() for t in PICTURE.findall(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("doc", [d.path for d in read_manifest(ROOT)])
def test_every_committed_document_opens_with_its_verdicts_and_shows_its_pictures(doc):
    path = ROOT / doc
    studies = next(d.studies for d in read_manifest(ROOT) if d.path == doc)
    if not any(bundle_path(ROOT, s).is_file() for s in studies):  # nothing run yet: `render` leaves it under the stale banner
        pytest.skip(f"{doc}: none of its studies has a bundle yet")
    assert layout_problems(path) == []
    assert expected_pictures()[doc] <= shown(path), f"{doc} leaves out a picture: {sorted(expected_pictures()[doc] - shown(path))}"


def test_the_documents_named_in_the_issue_show_their_pictures():
    assert "results/smollm2_frontier.png" in shown(ROOT / "pipelines" / "README.md")  # the cross-study frontier
    assert "results/figures/engines_smollm2.png" in shown(ROOT / "pipelines" / "ENGINES.md")  # the engines' frontiers
    engines = json.loads((ROOT / FIGURES / "engines_smollm2.json").read_text())
    assert len(engines["panels"]) >= 4 and {p["x"] for p in engines["panels"]} >= {"llama_tok_s_c1", "vllm_tok_s_c16"}
    assert {"results/layers/sensitivity_rtn3_layers.png", "results/layers/sensitivity_rtn3_bands.png"} <= shown(ROOT / "pipelines" / "LAYERS.md")


def test_a_document_without_its_summary_or_with_a_missing_picture_or_run_together_verdicts_fails(tmp_path):
    """The check itself, on planted copies of the compression document."""
    text = (ROOT / "pipelines" / "README.md").read_text(encoding="utf-8")
    (tmp_path / "pipelines").mkdir()
    planted = tmp_path / "pipelines" / "README.md"

    def problems(changed: str) -> str:
        planted.write_text(changed, encoding="utf-8")
        return "\n".join(layout_problems(planted, tmp_path))

    summary = text.index(HEADER)
    provenance = text.index("Rendered from the studies' bundles")
    assert "does not open with its summary table" in problems(text[:summary] + text[provenance:])
    moved = text[:summary] + text[provenance:text.index("## ")] + text[summary:provenance] + text[text.index("## "):]
    assert "does not open with its summary table" in problems(moved)  # a summary below the provenance is not an opening
    assert "shows a picture that does not exist: ../results/figures/wanda_vs_magnitude.png" in problems(text)  # nothing copied
    (tmp_path / "results" / "figures").mkdir(parents=True)
    for name in set(PICTURE.findall(text)):
        (planted.parent / name).resolve().parent.mkdir(parents=True, exist_ok=True)
        (planted.parent / name).resolve().write_bytes(b"\x89PNG")
    assert problems(text) == ""
    (tmp_path / "results" / "figures" / "macko.png").unlink()
    assert problems(text) == "README.md: shows a picture that does not exist: ../results/figures/macko.png"
    (tmp_path / "results" / "figures" / "macko.png").write_bytes(b"\x89PNG")
    assert "a verdict not on its own marked line" in problems(text.replace("- ✓ **Verdict", "**Verdict", 1))
    assert "provenance is no bulleted list" in problems(text.replace("**Provenance.**\n\n", "**Provenance.**\n", 1))


def test_verdict_lines_get_their_marks_and_stand_one_a_line():
    lines = ["**Claim:** x", "", "The arms span 2 settings (k): one verdict per setting.",
             "**Verdict at k=1: held** — d", "**Verdict at k=2: no verdict: both at chance (ppl ...)** — d", "",
             "**Verdict: within noise** — d", "**Verdict: held: -42.11 MB on each of 3 seeds, deterministic** — d"]
    out = marked_verdicts(lines)
    assert out[3] == "" and out[4:6] == ["- ✓ **Verdict at k=1: held** — d", "- — **Verdict at k=2: no verdict: both at chance (ppl ...)** — d"]
    assert out[7:] == ["- ○ **Verdict: within noise** — d", "- ✓ **Verdict: held: -42.11 MB on each of 3 seeds, deterministic** — d"]
    assert [verdict_mark(v) for v in ("did not hold", "inconclusive", "mixed", "no verdict: no matched pairs")] == ["✗", "○", "○", "—"]


def test_trials_come_best_first_and_a_wide_table_folds_every_measurement():
    objectives = [("ppl", "minimize"), ("size_bytes", "minimize")]
    rows = [{"trial": 0, "method": "a", "ppl": 30.0, "size_bytes": 5.0}, {"trial": 1, "method": "b", "ppl": 20.0, "size_bytes": 9.0},
            {"trial": 2, "method": "c", "ppl": 31.0, "size_bytes": 9.5}, {"trial": 3, "method": "d", "ppl": 10.0, "size_bytes": 1.0, "feasible": False},
            {"trial": 4, "method": "e", "size_bytes": 1.0}, {"trial": 5, "method": "f", "ppl": 25.0, "size_bytes": 20.0}]
    # frontier (1, 0) by ppl, then the front under it (5, 2), then a trial missing an objective and an infeasible one
    assert [r["trial"] for r in best_first(rows, objectives)] == [1, 0, 5, 2, 3, 4]
    table = lambda rs, cs: f"{len(rs)} rows: {', '.join(cs)}"  # noqa: E731
    narrow = ["method", "params", "ppl", "size_bytes", "cost", "trial"]
    assert decision_tables(rows, narrow, objectives, table, ("cost", "trial")) == [table(rows, narrow), ""]
    wide = ["method", "params", "ppl", "Δppl vs none", "ppl ÷ none", "size_bytes", "size ÷ stored base", "size ÷ fp16 base",
            "prefill_ms", "decode_tok_s", "energy_j", "n", "cost", "trial"]
    out = decision_tables(rows, wide, objectives, table, ("cost", "trial"))
    assert out[0] == "6 rows: method, params, ppl, Δppl vs none, ppl ÷ none, size_bytes, size ÷ fp16 base, cost, trial"
    assert out[2] == "<details><summary>Every measurement</summary>" and out[4] == table(rows, wide) and out[6] == "</details>"


def test_the_summary_writes_the_effect_with_its_interval_as_a_ratio_or_a_difference():
    row = {"metric": "ppl", "method": "wanda", "baseline": "magnitude", "scale": "log", "difference": 0.7792, "low": 0.7457, "high": 0.8155}
    assert effect_text(row) == "ppl wanda ÷ magnitude = ×0.7792 [×0.7457, ×0.8155]"
    row = {"metric": "val_loss", "method": "upipe", "baseline": "none", "scale": "linear", "difference": -0.11, "low": -0.13, "high": -0.09}
    assert effect_text(row) == "val_loss upipe − none = -0.11 [-0.13, -0.09] nats/token"
    assert effect_text({**row, "low": None, "high": None}) == "val_loss upipe − none = -0.11 nats/token"


def test_render_draws_each_studys_picture_and_check_compares_its_points(checkout):  # noqa: F811
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    document = checkout / "pipelines" / "ONE.md"
    assert layout_problems(document, checkout) == []
    assert "results/figures/constrained.png" in shown(document, checkout) and "results/cross.png" in shown(document, checkout)
    figure = checkout / FIGURES / "constrained"
    data = json.loads(figure.with_suffix(".json").read_text())
    assert data["study"] == "constrained" and data["panels"] and any(p["frontier"] for p in data["panels"][0]["points"])
    png, svg = figure.with_suffix(".png").read_bytes(), figure.with_suffix(".svg").read_bytes()
    assert png[:4] == b"\x89PNG" and b"<svg" in svg
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)  # drawn again from the same points: the same bytes
    assert figure.with_suffix(".png").read_bytes() == png and figure.with_suffix(".svg").read_bytes() == svg
    assert cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout).returncode == 0
    data["panels"][0]["points"][0]["y"] *= 1.01  # a picture whose points are not the bundle's is stale
    figure.with_suffix(".json").write_text(json.dumps(data))
    proc = cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 1 and "results/figures/constrained.json" in proc.stderr
    cli_here("results", "render", "--root", str(checkout), cwd=checkout)
    figure.with_suffix(".png").unlink()  # the points are right but the picture the document shows is gone
    proc = cli_here("results", "render", "--check", "--root", str(checkout), cwd=checkout, check=False)
    assert proc.returncode == 1 and "results/figures/constrained.png" in proc.stderr
    assert "shows a picture that does not exist: ../results/figures/constrained.png" in "\n".join(layout_problems(document, checkout))
