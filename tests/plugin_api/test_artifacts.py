"""A method's own artefact (paretolab.plugin_api.artifacts): recorded by the method, dropped when a later stage changes the
model, copied by ``paretolab export`` before the trial's folder goes, served as written by llama.cpp (kquant's GGUF)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from paretolab import Method, TrialContext, hookimpl
from paretolab.plugin_api import artifacts
from paretolab.plugin_api.subject import Subject

MODULE = "tests.plugin_api.test_artifacts"
PAYLOAD = b"GGUF-for-the-test"


class WritesArtifact(Method):
    """Writes a small file as if its library had, records it as a GGUF, and changes no weight."""

    name = "writes_artifact"
    kind = "weights"
    preserves_output = True

    def search_space(self) -> dict[str, Any]:
        return {}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        folder = ctx.workdir / "lib"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model-q4.gguf").write_bytes(PAYLOAD)
        artifacts.record(subject, folder / "model-q4.gguf", "gguf", method=self.name, stage=ctx.stage)
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(WritesArtifact())


@pytest.fixture
def registered(monkeypatch):
    from paretolab.plugin_api import manager

    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", (*manager.BUILTIN_PLUGINS, MODULE))
    manager.reset()
    yield
    manager.reset()


def _spec(stages: list[dict[str, Any]]) -> Any:
    from paretolab.study.spec import parse_spec

    return parse_spec({"name": "artefacts", "model": "tiny-llama", "stages": stages,
                       "task": {"name": "perplexity", "corpus": "pystdlib-val", "max_tokens": 256, "context": 128, "stride": 128},
                       "objectives": [{"metric": "ppl", "direction": "minimize"}], "search": {"sampler": "grid", "trials": 1}},
                      source="test")


def _rerun(stages: list[dict[str, Any]], hold: Path) -> Subject:
    from paretolab.api.export import rerun
    from paretolab.models.lookup import load_subject

    frozen = optuna.trial.create_trial(params={}, distributions={}, values=[1.0])
    subject, result, _ = rerun(_spec(stages), frozen, load_subject("tiny-llama"), hold=hold)
    assert not result.error, result.error
    return subject


def test_record_refuses_an_unknown_kind_and_a_missing_file(tiny, tmp_path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="one of gguf"):
        artifacts.record(tiny, tmp_path / "f", "onnx", method="m")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        artifacts.record(tiny, tmp_path / "gone", "gguf", method="m")


def test_served_only_for_its_kind_and_while_the_file_exists(tiny, tmp_path) -> None:
    (tmp_path / "a.gguf").write_bytes(b"x")
    artifacts.record(tiny, tmp_path / "a.gguf", "gguf", method="kquant", stage="stage0")
    assert artifacts.served(tiny, "gguf") == tmp_path / "a.gguf"
    assert artifacts.served(tiny, "compressed-tensors") is None
    (tmp_path / "a.gguf").unlink()
    assert artifacts.served(tiny, "gguf") is None


def test_export_copies_the_artefact_before_the_trials_folder_goes(registered, tmp_path) -> None:
    subject = _rerun([{"method": "writes_artifact"}], tmp_path / "held")
    copy = Path(subject.info[artifacts.PATH])
    assert copy == tmp_path / "held" / "model-q4.gguf" and copy.read_bytes() == PAYLOAD  # the trial's own folder is gone by now
    assert subject.info[artifacts.BY] == "writes_artifact" and subject.info[artifacts.KIND] == "gguf"


def test_a_later_stage_that_changes_the_model_drops_the_artefact(registered, tmp_path) -> None:
    subject = _rerun([{"method": "writes_artifact"}, {"method": "rtn", "params": {"bits": 4, "group_size": 32}}], tmp_path / "held")
    assert artifacts.PATH not in subject.info and not (tmp_path / "held").exists()
    assert "stage 'stage1' (rtn) changed the model after it" in subject.info[artifacts.DROPPED]
    kept = _rerun([{"method": "writes_artifact"}, {"method": "none"}], tmp_path / "held2")  # an identity keeps it
    assert Path(kept.info[artifacts.PATH]).read_bytes() == PAYLOAD


def test_the_export_record_and_lines_name_the_artefact(tmp_path) -> None:
    from paretolab.api.export import Exported

    done = Exported(out=tmp_path / "out", study="s", trial=0,
                    artifact={artifacts.PATH: "/tmp/whatever/model-q4.gguf", artifacts.KIND: "gguf", artifacts.BY: "kquant"})
    line = next(line for line in done.lines() if "artifact/" in line)
    assert f"{tmp_path / 'out' / 'artifact' / 'model-q4.gguf'}" in line and "llama_cpp.server --model" in line
    dropped = Exported(out=tmp_path / "out", study="s", trial=0, artifact={artifacts.DROPPED: "kquant's gguf artefact: stage 'x'"})
    assert any(line.startswith("  no artifact/: kquant's gguf") for line in dropped.lines())
    json.dumps(done.artifact)  # what paretolab.json records is plain data


@pytest.mark.engine
@pytest.mark.slow
def test_llama_cpp_serves_kquants_own_gguf_as_written(ctx) -> None:
    """The engine measure serves kquant's GGUF as llama.cpp's quantizer wrote it (not a re-conversion of the dequantized
    weights): the served file is the artefact, byte for byte in size, and its label says whose it is."""
    from paretolab.measure.engine_measure import Engine, EngineOptions
    from paretolab.plugin_api.options import parse_options
    from paretolab.plugins.incumbents.kquant import KQuant
    from tests.plugins.test_kquant import engine_or_skip, smollm2_tokenizer, tiny_256  # noqa: F401

    engine_or_skip()
    from transformers import AutoTokenizer

    from paretolab.models.gguf import SmolLM2

    subject = KQuant().transform(tiny_256(AutoTokenizer.from_pretrained(SmolLM2().pull())), {"type": "Q4_K_M"}, ctx)
    gguf = Path(subject.info["kquant_artifact"])
    assert artifacts.served(subject, "gguf") == gguf
    options = parse_options(EngineOptions, {"concurrency": [1], "prompts": 2, "new_tokens": 4, "repeats": 1}, where="m")
    out = Engine().measure(subject, options, ctx)
    assert subject.info["llama_format"].startswith("kquant's gguf as written (Q4_K_M: "), subject.info["llama_format"]
    assert out["llama_model_bytes"] == gguf.stat().st_size and out["llama_errors_c1"] == 0
