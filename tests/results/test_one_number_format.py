"""One way to write a number, on every surface a person reads (issue 72): every results document as its bundles render
it, and what `paretolab studies`, `frontier`, `report`, `plugins` and `export` print. A number written another way fails:

- e-notation (``5.3806e+08`` bytes in an infeasibility reason, ``×2.777e-05`` as an interval's bound);
- a ratio interval not written ``×a [×b, ×c]`` (``×1.24 [1.08, 1.43]``; ``1.426 [1.129, 1.787]`` in a ``÷ none`` column);
- a ratio (a ``÷`` column, a metric in ``x`` or ``ratio``, ``a ÷ b = ...``) without ``×``;
- bytes in KiB, MiB or GiB (the export printed MiB where the dashboard prints MB).

The documents are rendered here, in this process, from the committed bundles: the check holds for what the code writes
today, whatever the committed .md files still hold.
"""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest
from optuna.trial import create_trial

from paretolab.plugin_api.numbers import RATIO_UNITS, unit_of
from paretolab.results.documents import bundle_path, read_manifest, render_document
from paretolab.results.source import BundleSource
from tests.conftest import cli_here

ROOT = Path(__file__).resolve().parents[2]

# e-notation, not a version's hash (0.1.0+1d2e635, c5e808b) nor a word (e2e): no letter, digit, dot or "d+" before it
E_NOTATION = re.compile(r"(?<![\w.])(?<![\w.][+-])[-+]?\d+(?:\.\d+)?[eE][-+]?\d+(?![\w.])")
BINARY_BYTES = re.compile(r"\d\s*(?:KiB|MiB|GiB|TiB)\b")
NUM = r"[-+]?(?:\d[\d.]*[kMGTPE]?|∞)(?: [kMGTP]?B)?"
INTERVAL = re.compile(rf"(×?){NUM} \[(×?){NUM}, (×?){NUM}\]")
RATIO_SAID = [re.compile(r"÷ (?:(?! = )[^(\n|])*? = (?!×)[-+]?\d"),  # "ppl a ÷ b = 1.426 [...]"
              re.compile(r"÷ [\w.-]+ (?!×)[-+]?\d")]  # "(max ÷ min 1.23)", "r_at_1 a ÷ b 0.97"


def offenders(text: str) -> list[str]:
    """Each number in ``text`` written another way than the one formatter writes it, with its line."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        where = f"line {number}: {line.strip()[:160]}"
        found += [f"e-notation {m.group(0)!r} — {where}" for m in E_NOTATION.finditer(line)]
        found += [f"binary bytes {m.group(0)!r} — {where}" for m in BINARY_BYTES.finditer(line)]
        found += [f"ratio interval not ×a [×b, ×c]: {m.group(0)!r} — {where}" for m in INTERVAL.finditer(line) if len(set(m.groups())) > 1]
        found += [f"ratio without ×: {m.group(0)!r} — {where}" for rule in RATIO_SAID for m in rule.finditer(line)]
    return found + _table_offenders(text)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _is_ratio(header: str) -> bool:
    words = header.split()
    return "÷" in header or bool(words) and unit_of(words[-1]) in RATIO_UNITS


def _table_offenders(text: str) -> list[str]:
    """A Markdown table's ratio column (``ppl ÷ none``, ``÷ none at 1``, ``decode_speedup``): every number with ×."""
    lines, found, ratio = text.splitlines(), [], []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            ratio = []
            continue
        if i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            ratio = [_is_ratio(h) for h in _cells(line)]
            continue
        for is_ratio, cell in zip(ratio, _cells(line)):
            plain = cell.removeprefix("≈").removesuffix(" †").strip()
            if is_ratio and re.match(r"[-+]?\d", plain):
                found.append(f"ratio without ×: {cell!r} — line {i + 1}: {line[:160]}")
    return found


# ---- the checker itself: each kind of offender planted is found, the one way is not -----------------------------------

@pytest.mark.parametrize("text", [
    "✗ size_bytes 5.3806e+08 breaks size_bytes <= 1 x rtn = 1.8154e+08",
    "= ×0.03297 [×2.777e-05, ×39.13]",
    "| rtn | lr=5e-05 |",
    "| a | ÷ none at 1 |\n|---|---|\n| rtn | 1.426 [1.129, 1.787] |",
    "decode_speedup ×1.24 [1.08, 1.43]",
    "| method | ppl ÷ none |\n|---|---|\n| rtn | 1.051 |",
    "**Verdict: held** — ppl a ÷ b = 0.91 [0.85, 0.97] (95 % interval)",
    "(max ÷ min 1.23); the speedup columns divide",
    "  sizes: dense 513.2 MiB, compact 70.1 MiB",
])
def test_the_check_finds_a_number_written_another_way(text):
    assert offenders(text), text


@pytest.mark.parametrize("text", [
    "paretolab 0.1.0+1d2e635, 0.1.0+c5e808b and 0.1.0+12e4567 on e2e",
    "| a | ÷ none at 1 | decode_speedup |\n|---|---|---|\n| rtn | ×1.426 [×1.129, ×1.787] | ≈×1.02 † |",
    "ppl a ÷ b = ×0.91 [×0.85, ×0.97] (95 % interval: ...), mean over n = 3 pair(s)",
    "+0.0003974 [-0.0002603, +0.001403] within noise; 538.1 MB [181.5 MB, 1.2 GB]; ×0.5 [×0.1, ×∞]",
    "peak_rss_mb [MiB]  minimize: peak resident memory",  # a metric's registered unit, no number in it
])
def test_the_check_passes_the_one_way(text):
    assert offenders(text) == []


# ---- every results document, rendered now ------------------------------------------------------------------------

DOCUMENTS = read_manifest(ROOT)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=[d.family for d in DOCUMENTS])
def test_every_rendered_document_writes_each_number_one_way(doc):
    source = BundleSource([p for p in (bundle_path(ROOT, s) for s in doc.studies) if p.is_file()])
    if not source.names():
        pytest.skip(f"{doc.path}: none of its studies has a bundle yet (the committed document says so)")
    assert offenders(render_document(doc, source, ROOT)) == []


# ---- what the CLI prints on a study store ----------------------------------------------------------------------

EXTREME = [  # (stage0, sparsity, stage1, bits, ppl, size_bytes): numbers far from 1 both ways, as the documents hold them
    ("none", None, "none", None, 2.5e-05, 5.3806e8),
    ("magnitude", 0.5, "none", None, 3.1e-05, 1.8154e8),
    ("none", None, "rtn", 4, 1.2e-05, 6.7e7),
]
OLD_REASON = "size_bytes 5.3806e+08 breaks size_bytes <= 1 x none = 1.8154e+08"  # as older code stored it


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    from paretolab.stores import resolve_stores
    from tests.dashboard.conftest import _params, add_study, build_constrained_stores, build_stores

    home = tmp_path_factory.mktemp("one_number_store")
    stores = build_stores(home)
    build_constrained_stores(home)
    add_study(stores, "extreme", EXTREME)
    study = optuna.load_study(study_name="extreme", storage=stores.optuna_url)
    study.set_user_attr("constraints", ["size_bytes <= 2e+08"])
    params, dists = _params("none", None, "none", None)  # infeasible, on the frontier without the bound: left off, with why
    study.add_trial(create_trial(params=params, distributions=dists, values=[1e-06, 5.3806e8],
                                 user_attrs={"feasible": False, "infeasible_because": OLD_REASON}))
    assert resolve_stores(home=str(home)).optuna_url == stores.optuna_url
    return home


COMMANDS = [["studies"], ["frontier", "demo"], ["frontier", "extreme"], ["frontier", "constrained"], ["frontier", "training"],
            ["report", "demo", "extreme", "constrained", "training", "single"], ["report", "extreme", "--trials", "all"],
            ["plugins"], ["plugins", "engine"], ["plugins", "rtn"], ["plugins", "--kind", "training"]]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(a) for a in COMMANDS])
def test_every_read_command_writes_each_number_one_way(home, args):
    proc = cli_here(*args, "--home", str(home), cwd=home) if args[0] != "plugins" else cli_here(*args, cwd=home)
    assert proc.stdout.strip()
    assert offenders(proc.stdout + proc.stderr) == []


def test_a_reason_older_code_stored_in_e_notation_reads_in_the_metrics_unit(home):
    out = cli_here("frontier", "extreme", "--home", str(home), cwd=home).stdout
    assert "size_bytes 538.1 MB breaks size_bytes <= 1 x none = 181.5 MB" in out, out
    assert "feasible frontier under: size_bytes <= 200 MB" in out, out


def test_the_export_summary_writes_each_number_one_way(tmp_path):
    from paretolab.api.export import Exported

    done = Exported(out=tmp_path / "demo-7", study="demo", trial=7, metric="ppl", recorded=20.21, reproduced=20.2100003,
                    interval=(1.2e-05, 3.4e-05), within=True, sizes={"dense": 538060032.0, "compact": 73400320.0, "fp16": 269030016.0},
                    compact={"model.layers.0.mlp.up_proj.weight": "int4 (pack-quantized)"}, logit_gap={"dense": 3.1e-07, "compact": 2.2e-06})
    text = "\n".join(done.lines())
    assert offenders(text) == [], text
    assert "sizes: dense 538.1 MB, compact 73.4 MB, fp16 269 MB" in text, text
