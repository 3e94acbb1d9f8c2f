"""Any Hugging Face model id (from the hub or its cache) or a local model directory."""

from __future__ import annotations

from pathlib import Path

import torch

from paretolab.errors import ConfigError
from paretolab.models.source import ModelSource, param_count
from paretolab.plugin_api.subject import Subject


class HFModel(ModelSource):
    """Any Hugging Face model id (needs the hub or its cache) or a local directory."""

    def __init__(self, ident: str) -> None:
        self.name = ident
        self.description = f"Hugging Face model {ident}"

    def check(self) -> None:
        path = Path(self.name)
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ConfigError(f"model {self.name!r}: the directory has no config.json; point `model` at a saved Hugging Face model directory")
            return
        from huggingface_hub import try_to_load_from_cache

        if isinstance(try_to_load_from_cache(self.name, "config.json"), str):
            return
        import os

        if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
            raise ConfigError(f"model {self.name!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; download it once, or use a local directory")
        from huggingface_hub import HfApi

        try:
            HfApi().model_info(self.name, timeout=10)
        except Exception as exc:  # not found, gated, or no network: either way it cannot load here
            raise ConfigError(f"model {self.name!r} is not cached here and the Hugging Face hub did not confirm it ({type(exc).__name__}); check the id or use a local directory") from None

    def load(self) -> Subject:
        try:
            subject = load_pretrained(self.name, self.name)
        except OSError as exc:
            raise ConfigError(f"model {self.name!r} could not be loaded ({exc}); use a local path or a cached hub id") from exc
        from transformers import AutoConfig

        # the checkpoint's own dtype: the loaded model's config says float32 once loaded as such
        config = AutoConfig.from_pretrained(self.name)
        stored = getattr(config, "dtype", None) or config.to_dict().get("torch_dtype")
        self.weights = DTYPE_NAMES.get(str(stored).removeprefix("torch."), "unknown")
        return subject

    def stored_bytes(self, subject: Subject) -> float:
        """Parameters times the checkpoint's dtype (the config's ``torch_dtype``), not the fp32 they load as."""
        size = {"fp32": 4, "bf16": 2, "fp16": 2}.get(self.weights)
        return super().stored_bytes(subject) if size is None else float(size * param_count(subject))


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def load_pretrained(path: str, name: str) -> Subject:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return Subject(model=model, tokenizer=tokenizer, model_name=name)
