"""docs/plugins.md section 10 is true as written: its tool and its method, run with a second Python standing in for
the library's environment, put fp16 weights into the trial's model and report the artefact's bytes; without that
environment the trial's error is one line naming the make target."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from paretolab.plugin_api.external import ToolError
from paretolab.testing import logits_of, reported_bytes
from tests.plugin_api.test_plugin_guide import blocks, section

TITLE = "A method whose library lives in another environment"


@pytest.fixture
def guide_method(tmp_path, monkeypatch):
    tool, method = blocks(section(TITLE), "python")
    assert tool.startswith("# my_fp16_tool.py") and method.startswith("# my_fp16.py")
    (tmp_path / "my_fp16_tool.py").write_text(tool)
    (tmp_path / "my_fp16.py").write_text(method)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_fp16", None)
    return importlib.import_module("my_fp16").HalfPrecision()


def test_the_guide_s_external_method_runs_its_tool_and_reports_the_artefact_s_bytes(guide_method, tiny, ctx, monkeypatch):
    monkeypatch.setenv("PARETOLAB_MYFP16_PYTHON", sys.executable)  # this Python stands in for the library's environment
    before, size_before = logits_of(tiny), reported_bytes(tiny, ctx)
    linears = {f"{n}.weight": m.weight.numel() for n, m in tiny.model.named_modules()
               if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head")}
    out = guide_method.transform(tiny.copy(), {}, ctx)
    saved = sum(4 * n - 2 * n for n in linears.values())  # fp32 -> the fp16 the artefact stores
    assert reported_bytes(out, ctx) == size_before - saved
    assert all(out.storage_of(name).stored_bytes == 2 * n for name, n in linears.items())
    gap = float((logits_of(out) - before).abs().max() / before.abs().max())
    assert 0 < gap < 1e-2, gap  # the fp16 rounding the tool made, and nothing more
    assert (ctx.workdir / "my_fp16" / "out" / "halves.pt").is_file()
    assert guide_method.library().startswith(f"torch {torch.__version__.split('+')[0]}")


def test_without_its_environment_the_guide_s_method_names_the_make_target(guide_method, tiny, ctx, monkeypatch, tmp_path):
    monkeypatch.setenv("PARETOLAB_ENGINES", str(tmp_path / "no-engines"))
    monkeypatch.delenv("PARETOLAB_MYFP16_PYTHON", raising=False)
    with pytest.raises(ToolError) as err:
        guide_method.transform(tiny.copy(), {}, ctx)
    assert "torch is not installed" in str(err.value) and "run `make my-fp16-env`" in str(err.value)
    assert "\n" not in str(err.value)
    assert "not installed" in guide_method.library()


def test_the_contract_checks_an_artefact_sized_method_against_its_artefact(guide_method, tiny, ctx, monkeypatch):
    """sized_by_artifact: the contract passes the guide's method, and fails one whose artefact is gone or smaller than
    the bytes it reports (a size with no file behind it)."""
    from paretolab.plugin_api.cost_claims import check_artifact_sizes

    monkeypatch.setenv("PARETOLAB_MYFP16_PYTHON", sys.executable)
    assert guide_method.sized_by_artifact
    out = guide_method.transform(tiny.copy(), {}, ctx)
    check_artifact_sizes(guide_method, out)
    artefact = ctx.workdir / "my_fp16" / "out" / "halves.pt"
    artefact.write_bytes(b"x" * 10)  # a stand-in file far smaller than what the trial reports
    with pytest.raises(AssertionError, match="reports .* stored bytes but its artefact holds 10"):
        check_artifact_sizes(guide_method, out)
    artefact.unlink()
    with pytest.raises(AssertionError, match="does not exist"):
        check_artifact_sizes(guide_method, out)
    out.info.pop("my_fp16_artifact")
    with pytest.raises(AssertionError, match="left no subject.info"):
        check_artifact_sizes(guide_method, out)


@pytest.mark.parametrize("artifact", ["../../etc/passwd", "/tmp/elsewhere", ""])
def test_a_report_naming_an_artefact_outside_its_out_folder_is_refused(tmp_path, tiny, artifact):
    """A tool's report is another program's output: the artefact it names must lie inside its out folder."""
    from paretolab.plugin_api.external import take_back

    (tmp_path / "out").mkdir()
    report = {"out": str(tmp_path / "out"), "stored_bytes": {}, "artifact": artifact, "library": "x", "version": "1"}
    with pytest.raises(ToolError, match="not a path inside its out folder"):
        take_back(tiny.copy(), report, "my_fp16")
