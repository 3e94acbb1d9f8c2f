"""Names from a store are untrusted text (issue 69): a study named with a newline, ANSI escapes, a bell or a bidi
override, as an old bundle or Optuna's own API can leave one, reaches the terminal, the results document and the
dashboard escaped (one row, one heading, one cell); two names equal under Unicode normalisation (NFKC) are one name."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import optuna
import pytest

from tests.conftest import cli_here
from tests.reliability.conftest import TINY, refused

HOSTILE = "x\n| forged | row\x1b[31mRED\x1b[0m\x07\u202eevil"
BARE = "y\x1b]0;pwned title\x07\u202e"  # made by optuna.create_study directly, no trial
REASON = "boom\x1b[5mblink\x07\nsecond line"
MODEL = "tiny-llama\x1b[2J"  # clears the screen
CHOICE = "magnitude\x1b[31m\n0 forged"
# What a terminal would obey: C0 controls but newline and tab, DEL, C1, bidi and zero-width characters.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]")


def _clean(text: str) -> None:
    assert not RAW.search(text), RAW.findall(text)


@pytest.fixture(scope="module")
def hostile_home(tmp_path_factory) -> Path:
    """The dashboard's fixture study ``demo`` renamed to HOSTILE in both stores (its failures' reasons made hostile too),
    and a study BARE created through Optuna's API."""
    from tests.dashboard.conftest import build_stores

    home = tmp_path_factory.mktemp("hostile")
    build_stores(home)
    with sqlite3.connect(home / "optuna.db") as conn:
        conn.execute("UPDATE studies SET study_name = ? WHERE study_name = 'demo'", (HOSTILE,))
        conn.execute("UPDATE trial_user_attributes SET value_json = ? WHERE key = 'fail_reason'", (json.dumps(REASON),))
        conn.execute("UPDATE study_user_attributes SET value_json = ? WHERE key = 'model'", (json.dumps(MODEL),))
        conn.execute("UPDATE trial_params SET distribution_json = replace(distribution_json, '\"magnitude\"', ?)",
                     (json.dumps(CHOICE),))  # a categorical choice, as Optuna hands it back
    with sqlite3.connect(home / "mlflow.db") as conn:
        conn.execute("UPDATE experiments SET name = ? WHERE name = 'demo'", (HOSTILE,))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(storage=f"sqlite:///{home / 'optuna.db'}", study_name=BARE, directions=["minimize", "minimize"])
    return home


def test_studies_lists_a_hostile_name_as_one_escaped_row(hostile_home):
    proc = cli_here("studies", "--home", str(hostile_home), cwd=hostile_home)
    _clean(proc.stdout + proc.stderr)
    lines = proc.stdout.splitlines()
    assert not any(line.startswith("| forged") for line in lines), proc.stdout  # no forged row
    rows = [line for line in lines if line.startswith(("x\\n| forged", "y\\x1b]0;"))]
    assert len(rows) == 2 and "\\x1b[31mRED\\x1b[0m\\x07\\u202eevil" in rows[0], proc.stdout
    assert any("boom\\x1b[5mblink\\x07" in line for line in lines), proc.stdout  # the failure reasons, escaped too


def test_frontier_of_a_hostile_name_is_escaped_and_found_by_its_name(hostile_home):
    proc = cli_here("frontier", HOSTILE, "--home", str(hostile_home), cwd=hostile_home)
    _clean(proc.stdout + proc.stderr)
    assert proc.stdout.startswith("Pareto set of study 'x\\n| forged | row\\x1b[31mRED")
    rows = proc.stdout.splitlines()[2:]
    assert rows and all(re.match(r"\d+ ", row) for row in rows), proc.stdout  # one line per trial: none forged
    assert any("magnitude\\x1b[31m\\n0 forged" in row for row in rows), proc.stdout
    as_json = cli_here("frontier", HOSTILE, "--json", "--home", str(hostile_home), cwd=hostile_home)
    _clean(as_json.stdout + as_json.stderr)
    assert json.loads(as_json.stdout)


def test_an_unknown_study_lists_the_hostile_names_in_one_escaped_line(hostile_home):
    line = refused("frontier", "nosuch", "--home", str(hostile_home), cwd=hostile_home)
    _clean(line)
    assert "no study 'nosuch'" in line and "x\\n| forged" in line


def test_report_of_a_hostile_name_is_one_heading_and_a_table_of_one_row_per_trial(hostile_home):
    proc = cli_here("report", HOSTILE, "--home", str(hostile_home), cwd=hostile_home)
    _clean(proc.stdout + proc.stderr)
    text = proc.stdout
    assert text.startswith("## x\\n\\| forged \\| row\\x1b[31mRED"), text[:200]
    assert "boom\\x1b[5mblink\\x07" in text  # the failures' reason in the summary line
    assert "Model `tiny-llama\\x1b[2J`" in text
    tables: list[list[str]] = [[]]  # the decision table, then every measurement: each row as many columns as its header
    for line in text.splitlines():
        if line.startswith("|"):
            tables[-1].append(line)
        elif tables[-1]:
            tables.append([])
    tables = [t for t in tables if t]
    assert tables and all(len(t) > 3 for t in tables), tables
    for table in tables:
        columns = {len(re.findall(r"(?<!\\)\|", line)) for line in table}
        assert len(columns) == 1, table


def test_a_rendered_section_escapes_names_reasons_and_cells(hostile_home):
    from paretolab.results.section import markdown_table, study_section
    from paretolab.stores import resolve_stores

    section = study_section(HOSTILE, resolve_stores(home=str(hostile_home), create=False), ["ppl"])
    _clean(section)
    assert section.splitlines()[0] == "## x\\n\\| forged \\| row\\x1b[31mRED\\x1b[0m\\x07\\u202eevil"
    table = markdown_table([{"method": "a|b\nc", "cost": "\x1b[31mreal"}], ["method", "cost"])
    assert table.splitlines()[2] == "| a\\|b\\nc | \\x1b[31mreal |"


def test_the_dashboard_shows_names_as_the_characters_they_are(hostile_home, monkeypatch):
    from paretolab.dashboard.context import file_part, label

    shown = label(HOSTILE + " *bold* [link](http://x) <b>")
    _clean(shown)
    assert "\\*bold\\*" in shown and "\\[link\\]\\(http://x\\)" in shown and "\\<b\\>" in shown and "\\|" in shown
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", file_part(HOSTILE)), file_part(HOSTILE)
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.test_app import APP, TIMEOUT

    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", f"sqlite:///{hostile_home / 'optuna.db'}")
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", f"sqlite:///{hostile_home / 'mlflow.db'}")
    monkeypatch.delenv("PARETOLAB_RAY_ADDRESS", raising=False)
    for page in ("Frontier", "Trial"):
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.query_params["page"] = page
        at.query_params["study"] = HOSTILE
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        header = at.header[0].value
        _clean(header)
        assert header.endswith("x\\\\n\\| forged \\| row\\\\x1b\\[31mRED\\\\x1b\\[0m\\\\x07\\\\u202eevil"), header
        for kind in ("info", "error", "warning", "caption", "markdown", "subheader"):
            for element in getattr(at, kind):
                _clean(str(element.value))


@pytest.fixture
def twin_home(hostile_home, tmp_path) -> Path:
    """The stores holding a study ``ｄｅｍｏ`` (fullwidth: ``demo`` under NFKC)."""
    home = Path(shutil.copytree(hostile_home, tmp_path / "home"))
    with sqlite3.connect(home / "optuna.db") as conn:
        conn.execute("UPDATE studies SET study_name = ? WHERE study_name = ?", ("ｄｅｍｏ", HOSTILE))
    return home


def test_a_study_is_found_by_a_name_equal_under_unicode_normalisation(twin_home, monkeypatch):
    proc = cli_here("frontier", "demo", "--home", str(twin_home), cwd=twin_home)
    assert proc.stdout.startswith("Pareto set of study 'demo'"), proc.stdout
    from streamlit.testing.v1 import AppTest

    from tests.dashboard.test_app import APP, TIMEOUT

    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", f"sqlite:///{twin_home / 'optuna.db'}")
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", f"sqlite:///{twin_home / 'mlflow.db'}")
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["page"] = "Frontier"
    at.query_params["study"] = "demo"  # a link written with the plain spelling
    at.run()
    assert not at.exception and at.header[0].value == "Frontier · ｄｅｍｏ" and not at.warning, [w.value for w in at.warning]


def test_no_study_is_created_beside_its_unicode_twin(twin_home):
    pipeline = twin_home / "demo.yaml"
    pipeline.write_text(TINY.replace("name: tiny", "name: demo"))
    line = refused("check", str(pipeline), "--home", str(twin_home), cwd=twin_home)
    assert "'ｄｅｍｏ', the same name under Unicode normalisation" in line
    from paretolab.errors import ConfigError
    from paretolab.stores import resolve_stores
    from paretolab.study.optuna_study import open_study
    from paretolab.study.preflight import validated_spec

    stores = resolve_stores(home=str(twin_home), create=False)
    with pytest.raises(ConfigError, match="same name under Unicode normalisation"):  # what `run` calls before any trial
        open_study(validated_spec(str(pipeline)), stores, resume=False)
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{twin_home / 'optuna.db'}")]
    assert "demo" not in names and "ｄｅｍｏ" in names
