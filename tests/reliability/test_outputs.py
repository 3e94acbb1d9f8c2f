"""Every output path is checked before the work: export --force replaces only an earlier export, never the working or
home directory; a target another export is writing is refused; report --output fails in one line, leaving nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.conftest import cli_here
from tests.reliability.conftest import leftovers, refused
from tests.reliability.test_stores import good_home, home  # noqa: F401 - fixtures


def export(tmp_path, out, *extra, cwd=None, env=None):
    return refused("export", "demo", "1", "--out", str(out), *extra, "--home", str(tmp_path / "nohome"), cwd=cwd or tmp_path, env=env)


def keep(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("mine")
    return folder


def test_force_never_empties_the_working_directory(tmp_path):
    keep(tmp_path)
    assert "is the working directory" in export(tmp_path, ".", "--force")
    assert (tmp_path / "precious.txt").read_text() == "mine"


def test_force_never_empties_a_folder_above_the_working_directory(tmp_path):
    work = keep(tmp_path / "a" / "work")
    assert "a folder above them" in export(tmp_path, tmp_path / "a", "--force", cwd=work)
    assert (work / "precious.txt").is_file()


def test_force_never_empties_home(tmp_path):
    home_dir = keep(tmp_path / "home")
    assert "home directory" in export(tmp_path, "~", "--force", env={"HOME": str(home_dir)})
    assert (home_dir / "precious.txt").is_file()


def test_force_refuses_a_folder_that_is_not_an_export(tmp_path):
    target = keep(tmp_path / "d")
    assert "has no paretolab.json" in export(tmp_path, target, "--force")
    assert (target / "precious.txt").is_file()


def test_force_with_dotdot_folds_the_path_and_refuses(tmp_path):
    target = keep(tmp_path / "d")
    (target / "inner").mkdir()
    line = export(tmp_path, f"{target}/inner/..", "--force")
    assert f"--out {target}:" in line and "has no paretolab.json" in line
    assert (target / "precious.txt").is_file() and not leftovers(tmp_path)


def test_force_passes_an_earlier_export_and_keeps_it_when_the_export_fails(tmp_path):
    import json

    from paretolab.data.outputs import manifest

    earlier = tmp_path / "e"
    earlier.mkdir()
    (earlier / "model.safetensors").write_bytes(b"weights")
    record = json.dumps({"files": manifest(earlier, skip="paretolab.json")})  # an export's record lists the files it wrote
    (earlier / "paretolab.json").write_text(record)
    line = export(tmp_path, earlier, "--force")
    assert "--out" not in line and "no " in line  # past the output checks: the (missing) study is what stops it
    assert (earlier / "paretolab.json").read_text() == record


def test_an_existing_target_without_force_is_refused(tmp_path):
    target = keep(tmp_path / "d")
    assert "exists; pick a new directory or pass --force" in export(tmp_path, target)


def test_out_under_a_regular_file_is_refused_before_the_work(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is a file, not a folder" in export(tmp_path, tmp_path / "f" / "out")


def test_out_where_nothing_can_be_written_is_refused_before_the_work(tmp_path):
    assert "cannot write in /proc" in export(tmp_path, "/proc/paretolab-export")


def test_a_bad_save_as_is_refused_before_the_work_naming_the_flag(tmp_path):
    line = export(tmp_path, tmp_path / "o", "--save-as", "../x")
    assert line.startswith("paretolab: error: --save-as:") and "train.save_as" not in line
    assert not (tmp_path / "o").exists()


def test_a_second_export_into_the_same_target_is_refused(tmp_path):
    from paretolab.data.outputs import writing

    out = tmp_path / "o"
    with writing(out):
        assert "another export is writing it now" in export(tmp_path, out)
    assert not leftovers(tmp_path, ".*.lock", "*.partial")


# report --output

def test_report_output_into_an_unwritable_place_is_one_line(home):
    assert "cannot write in /proc" in refused("report", "demo", "--output", "/proc/x/report.md", "--home", str(home), cwd=home)


def test_report_output_that_is_a_folder_is_one_line(home):
    assert "is a folder; give a file name" in refused("report", "demo", "--output", str(home), "--home", str(home), cwd=home)


def test_report_output_into_a_missing_folder_creates_it(home):
    cli_here("report", "demo", "--output", str(home / "new" / "r.md"), "--home", str(home), cwd=home)
    assert (home / "new" / "r.md").read_text().startswith("# Results")


def test_report_output_on_a_full_disk_is_one_line_and_leaves_nothing(home, monkeypatch):
    target = home / "out"
    target.mkdir()
    (target / "r.md").write_text("earlier")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full)
    line = refused("report", "demo", "--output", str(target / "r.md"), "--home", str(home), cwd=home)
    assert "No space left on device" in line
    assert (target / "r.md").read_text() == "earlier" and sorted(p.name for p in target.iterdir()) == ["r.md"]


# the command line itself

@pytest.mark.parametrize("argv", [["run", "p.yaml", "--trial", "20"], ["frontier", "demo", "--js"], ["export", "s", "1", "--ou", "x"]])
def test_abbreviated_flags_are_refused(argv, tmp_path):
    proc = cli_here(*argv, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and ("unrecognized arguments" in proc.stderr or "required: --out" in proc.stderr)
    assert "Traceback" not in proc.stderr


def test_dashboard_on_every_interface_warns(home, monkeypatch):
    def exec_stub(*args):
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", exec_stub)
    proc = cli_here("dashboard", "--host", "0.0.0.0", "--home", str(home), cwd=home, check=False)
    assert proc.returncode == 0 and "warning: --host 0.0.0.0: the dashboard has no login" in proc.stderr


def test_dashboard_trial_query_with_a_superscript_digit(home, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from paretolab.stores import resolve_stores

    stores = resolve_stores(home=str(home))
    monkeypatch.setenv("PARETOLAB_OPTUNA_STORAGE", stores.optuna_url)
    monkeypatch.setenv("PARETOLAB_TRACKING_URI", stores.tracking_uri)
    at = AppTest.from_file(str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py"), default_timeout=60)
    at.query_params["page"] = "Trial"
    at.query_params["trial"] = "²"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
