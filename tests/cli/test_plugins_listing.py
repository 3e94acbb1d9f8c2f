"""`paretolab plugins`: one method's details by name, one kind's methods, the per-layer mark, metric families on one line,
and no line longer than 200 characters (it printed 898 lines, one of them 7,055 characters)."""

from __future__ import annotations

import json

import pytest

from paretolab.cli.listing import WIDTH, families, names_text
from paretolab.plugin_api.manager import registries
from tests.conftest import cli_here


@pytest.fixture(scope="module")
def listing(tmp_path_factory) -> str:
    return cli_here("plugins", cwd=tmp_path_factory.mktemp("plugins")).stdout


def _method_lines(out: str) -> dict[str, str]:
    """{method: its heading line} of a listing's ``methods:`` section."""
    section = out.split("\ntasks:")[0].splitlines()
    return {line.split()[0]: line for line in section if line.startswith("  ") and not line.startswith("   ") and "  [" in line}


def test_every_line_is_at_most_200_characters_and_metric_families_are_one_line(listing):
    lines = listing.splitlines()
    longest = max(lines, key=len)
    assert len(longest) <= WIDTH, f"{len(longest)} characters: {longest[:120]}..."
    at = next(i for i, line in enumerate(lines) if line.startswith("  engine  -> "))
    more = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("      "))
    measure = " ".join(line.strip() for line in lines[at:more])  # one entry, wrapped at 200 characters
    assert "llama_tok_s_c{1,2,4,8,16,32} (6, each with _ci_low, _ci_high)" in measure
    metrics = listing.split("\nmetrics:\n")[1].split("\nmodels:\n")[0]
    assert "  llama_tok_s_c{1,2,4,8,16,32} (6, each with _ci_low, _ci_high) [tokens/s]  maximize: as llama_tok_s_c1: " in metrics
    assert "llama_tok_s_c16 [" not in metrics and "llama_tok_s_c1_ci_low" not in metrics  # folded into the family's one line
    assert "  ppl (with _ci_low, _ci_high)  minimize: perplexity" in metrics and "  acc [fraction]  maximize: " in metrics
    assert len(lines) < 800


def test_the_plain_listing_marks_the_per_layer_methods(listing):
    shown = _method_lines(listing)
    regs = registries()
    assert set(shown) == set(regs.methods.names())
    for method in regs.methods:
        assert ("per-layer]" in shown[method.name]) == method.layerwise, shown[method.name]
    assert shown["rtn"].startswith("  rtn  [weights, cost simulated, per-layer]  from ")


def test_one_method_by_name_shows_its_details_and_nothing_else(tmp_path):
    out = cli_here("plugins", "mtpc", cwd=tmp_path).stdout
    assert list(_method_lines(out)) == ["mtpc"] and "\ntasks:" not in out and "\nmetrics:" not in out
    assert "      k: 1..8" in out and "      reports: mean_accepted_len, " in out
    assert "        mean_accepted_len [tokens]  maximize: " in out  # each metric it reports, with unit and meaning
    rtn = cli_here("plugins", "rtn", cwd=tmp_path).stdout
    assert "      per-layer: takes `layers:`" in rtn and "      works on: linear" in rtn
    one_metric = cli_here("plugins", "llama_tok_s_c1", cwd=tmp_path).stdout
    assert one_metric.splitlines() == ["metrics:", next(line for line in one_metric.splitlines() if line.startswith("  llama_tok_s_c1 [tokens/s]"))]


def test_one_kind_lists_that_kinds_methods_only(tmp_path):
    out = cli_here("plugins", "--kind", "decoding", cwd=tmp_path).stdout
    shown = _method_lines(out)
    assert set(shown) == {m.name for m in registries().methods if m.kind == "decoding"} and "mtpc" in shown
    assert all("[decoding, " in line for line in shown.values()) and "\ntasks:" not in out
    payload = json.loads(cli_here("plugins", "--kind", "decoding", "--json", cwd=tmp_path).stdout)
    assert list(payload) == ["methods"] and {m["name"] for m in payload["methods"]} == set(shown)
    one = json.loads(cli_here("plugins", "rtn", "--json", cwd=tmp_path).stdout)
    assert [m["name"] for m in one["methods"]] == ["rtn"] and one["methods"][0]["layerwise"] is True


def test_a_name_or_kind_nothing_registered_is_one_line(tmp_path):
    bad = cli_here("plugins", "rtnn", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "paretolab: error: nothing installed is named 'rtnn'; did you mean 'rtn'? (`paretolab plugins` lists every method, "
        "task, measure, metric and model)"]
    kind = cli_here("plugins", "--kind", "weight", cwd=tmp_path, check=False)
    assert kind.returncode == 2 and "no method of kind 'weight'; kinds: " in kind.stderr and "weights" in kind.stderr


def test_help_teaches_the_name_and_kind_forms(tmp_path):
    out = cli_here("plugins", "--help", cwd=tmp_path).stdout
    assert "paretolab plugins rtn " in out and "paretolab plugins --kind decoding" in out and "per-layer" in out
    assert "paretolab plugins rtn" in cli_here("--help", cwd=tmp_path).stdout


def test_families_fold_numbers_and_interval_bounds():
    names = ["a_c16", "a_c16_ci_low", "a_c16_ci_high", "a_c1", "a_c1_ci_low", "a_c1_ci_high", "b_p50_c1", "b_p99_c1", "ppl",
             "ppl_ci_low", "ppl_ci_high", "r_at_1", "c_ci_low"]
    assert names_text(names) == ("a_c{1,16} (2, each with _ci_low, _ci_high), b_p{50,99}_c1 (2), ppl (with _ci_low, _ci_high), r_at_1, "
                                 "c_ci_low")
    assert [f.first for f in families(names)] == ["a_c1", "b_p50_c1", "ppl", "r_at_1", "c_ci_low"]
