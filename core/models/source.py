"""What a model source is (``ModelSource``), the provenance every trial reports, and the quality note of a base."""

from __future__ import annotations

from typing import Any

from paretolab.plugin_api.storage import unique_parameters
from paretolab.plugin_api.subject import Subject


class ModelSource:
    """Something that yields a Subject. ``pull`` makes ``load`` fast and offline afterwards."""

    name: str = ""
    description: str = ""
    # What the weights are, as the source holds them: fp32, bf16, fp16, "gguf:Q4_1 dequantized", "random init".
    weights: str = "unknown"
    # Tokens the model's output head chooses among, when it predicts tokens: a perplexity at or above it is no better
    # than a uniform guess (the verdicts read such an arm as at chance). None: not a token model, or not declared.
    vocab_size: int | None = None

    @property
    def quality_note(self) -> str:
        """Why quality metrics on this model mean nothing (``"has random weights"``), or "" when they do."""
        return "has random weights" if self.weights == "random init" else ""

    def stored_bytes(self, subject: Subject) -> float:
        """Bytes of the base weights as the source stores them (default: the loaded tensors in their dtypes)."""
        return float(sum(t.numel() * t.element_size() for _, t in unique_parameters(subject.model)))

    def is_cached(self) -> bool:
        return True

    def pull(self) -> str:
        """Fetch/convert once; return where the model now lives."""
        return self.name

    def load(self) -> Subject:
        raise NotImplementedError

    def check(self) -> None:
        """Raise ConfigError, naming the fix, when this machine cannot load the model (no weights are read)."""

    def provenance_extra(self) -> dict[str, str]:
        """Facts about where the weights came from that every trial reports (e.g. a checked sha256); default none."""
        return {}


def quality_note(model: str, pipeline: dict[str, Any] | None = None) -> str:
    """A one-line warning when a study's quality numbers on ``model`` are not meaningful; "" otherwise.

    A pipeline that trains the model (a ``train`` stage) makes a random-init model meaningful.
    """
    from paretolab.plugin_api.manager import registries

    if pipeline is not None and trains(pipeline):
        return ""
    models = registries().models
    note = models.get(model).quality_note if model in models else ""
    return f"Not meaningful for quality: model {model!r} {note}; its quality metrics (ppl, acc, ...) exercise the mechanics only" if note else ""


def trains(pipeline: dict[str, Any]) -> bool:
    """Whether a pipeline (its YAML as a dict) has a ``train`` stage, fixed or among a choice."""
    for stage in pipeline.get("stages") or []:
        options = stage.get("choice") or [stage] if isinstance(stage, dict) else []
        if any(isinstance(o, dict) and o.get("method") == "train" for o in options):
            return True
    return False


def provenance(source: ModelSource, subject: Subject) -> dict[str, Any]:
    """What every trial of this base reports: its weights, its stored bytes and its bytes in fp16."""
    return {"weights": source.weights, "base_stored_bytes": source.stored_bytes(subject), "base_fp16_bytes": float(2 * param_count(subject)),
            **source.provenance_extra()}


def param_count(subject: Subject) -> int:
    return sum(t.numel() for _, t in unique_parameters(subject.model))


