"""llama.cpp's K-quant mixes (Q3_K_M, Q4_K_M, Q5_K_M, Q6_K; Q4_0 and Q8_0 as plain formats), run by llama.cpp itself.

Nothing of the quantization is re-implemented: the trial's model is handed over as a dense fp32 Hugging Face
directory (:func:`paretolab.plugin_api.external.hand_over`), converted to an f32 GGUF by llama.cpp's own converter
(the llama engine's, :class:`paretolab.measure.engine_llama.LlamaEngine`), and quantized by llama.cpp's
``llama_model_quantize`` in the llama engine's environment (the tool ``paretolab/tools/llama_quantize.py``, through
:func:`~paretolab.plugin_api.external.run_tool`). llama.cpp chooses each tensor's type as it does for users: a mix's
larger types for some layers (attn_v, ffn_down, the token embedding), its fallbacks where a row is not a whole number
of 256-value superblocks (SmolLM2's 576-wide rows: q5_0 for q4_K, ...), F32 for the norms. ``kquant_format`` counts
the types it chose, so a fallback is on record.

The weights come back dequantized by gguf-py (llama.cpp's Python package) from the GGUF llama.cpp wrote, into the
trial's model by name, with each tensor's ``stored_bytes`` the bytes it takes in that GGUF (blocks, scales and mins
included); the GGUF's path stays in ``subject.info["kquant_artifact"]`` for the engine measure and the export. The
names map through gguf-py's ``TensorNameMap``; Llama's q/k rows, which the converter permutes for llama.cpp's rope,
are permuted back; every tensor read back is checked against the weight handed over, so a layout paretolab does not
know fails the trial instead of loading scrambled weights.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.external import ToolEnv, ToolError, hand_over, last_error, run_tool, take_back
from paretolab.plugin_api.subject import Subject

LIBRARY = "llama-cpp-python"
LLAMA = ToolEnv("llama", "engines-llama", (LIBRARY,))  # the llama engine's environment: llama.cpp's quantizer is in it
TYPES = {"Q3_K_M": 3, "Q4_K_M": 4, "Q5_K_M": 5, "Q6_K": 6, "Q4_0": 4, "Q8_0": 8}  # llama.cpp's name -> its nominal bits
SUPERBLOCK = 256  # values per K-quant superblock: llama.cpp falls back to another type for rows not a multiple of it
# Values per scale of each ggml type (a block, or a K-quant's sub-block): the storage record's group, so that the
# contract's information count reads the format's own grouping (a q4_K row has 16 levels per 32 values, not per row).
SCALE_GROUP = {"q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32, "q8_0": 32, "iq4_nl": 32, "iq4_xs": 32,
               "q2_K": 16, "q3_K": 16, "q4_K": 32, "q5_K": 32, "q6_K": 16}
PERMUTED = {"llama"}  # architectures whose q/k rows llama.cpp's converter permutes (LlamaModel.permute)
MISMATCH = 0.5  # relative RMS error above which a tensor read back is not the weight handed over (a quantization's is far less)


class KQuant(Method):
    """llama.cpp's quantizer at one of its types; size_bytes is the GGUF's tensor bytes (``cost_is`` real: llama.cpp serves that file)."""

    name = "kquant"
    kind = "weights"
    cost_is = "real"
    sized_by_artifact = True  # size_bytes is what the library's artefact stores; the model holds its decompressed weights
    works_on = ("linear",)
    paper = Paper("llama.cpp k-quants (llama_model_quantize)", "ggml-org/llama.cpp", "https://github.com/ggml-org/llama.cpp/pull/1684")

    def search_space(self) -> dict[str, Any]:
        return {"type": CategoricalDistribution(list(TYPES))}

    def defaults(self) -> dict[str, Any]:
        return {"type": "Q4_K_M"}

    def library(self) -> str:
        return LLAMA.describe(LIBRARY)

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        kind = str(params["type"]).upper()
        if kind not in TYPES:
            raise ConfigError(f"kquant.type must be one of {', '.join(TYPES)}; got {params['type']!r}")
        from paretolab.measure.engine_llama import EngineUnavailable, LlamaEngine

        LLAMA.require(LIBRARY)  # ToolError naming `make engines-llama` where the engine's environment is missing
        try:
            engine = LlamaEngine.find()
        except EngineUnavailable as exc:
            raise ToolError(f"{LIBRARY}: {exc}") from None
        start = time.monotonic()
        ctx.workdir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f"kquant-{kind}-", dir=ctx.workdir))  # its own folder: the artefact stays
        with torch.device("cpu"):  # files written and read on the CPU; the weights go to the model's device by copy_
            hand_over(subject, work / "in")
            f32 = work / "model-f32.gguf"
            try:
                engine.convert(work / "in", f32, "f32", log=work / "convert.log")
            except RuntimeError:
                raise ToolError(f"{LIBRARY}: llama.cpp's GGUF converter failed on this model: {last_error(work / 'convert.log')} "
                                f"(log: {work / 'convert.log'}; `make engines-llama` installs it)") from None
            finally:
                shutil.rmtree(work / "in", ignore_errors=True)
            threads = max(1, int(ctx.cpus)) if ctx.cpus else 0
            try:
                report = run_tool(LLAMA, LIBRARY, "llama_quantize.py", {"gguf": str(f32), "params": {"type": kind}, "threads": threads}, work)
            finally:
                f32.unlink(missing_ok=True)
            artefact = Path(report["out"]) / str(report["artifact"])
            weights, stored, types, unread = read_back(subject, artefact, report)
        fmt = describe_types(kind, types, {name: int(p.shape[-1]) for name, p in subject.model.named_parameters() if name in types})
        take_back(subject, {**report, "stored_bytes": stored, "format": fmt}, self.name, weights=weights, kind="gguf", stage=ctx.stage)
        for name, ggml_type in types.items():
            if ggml_type in SCALE_GROUP:
                subject.set_storage(name, group_size=SCALE_GROUP[ggml_type])
        values = sum(subject.model.get_parameter(name).numel() for name in stored)
        subject.info["kquant_type"] = kind
        subject.info["kquant_bits"] = TYPES[kind]  # the type's nominal bits (rtn's `bits`)
        subject.info["kquant_bpw"] = round(8 * sum(stored.values()) / max(values, 1), 4)  # what the file stores per weight
        subject.info["kquant_seconds"] = round(time.monotonic() - start, 2)  # hand over, convert, quantize, read back
        if unread:
            subject.info["kquant_unread"] = ", ".join(sorted(unread))[:500]  # GGUF tensors that are no parameter (rope_freqs)
        return subject


def read_back(subject: Subject, artefact: Path, report: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, int], dict[str, str], set[str]]:
    """Each parameter the GGUF stores, dequantized by gguf-py: (weights, stored bytes, ggml type names) by parameter
    name, and the GGUF tensors that name no parameter. The table (offsets, types, bytes) is the tool's, read by ggml."""
    import numpy as np
    from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, TensorNameMap
    from gguf.quants import dequantize

    arch_name = str(report.get("architecture", ""))
    arch = {v: k for k, v in MODEL_ARCH_NAMES.items()}.get(arch_name)
    config = getattr(subject.model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    if arch is None or layers is None:
        raise ToolError(f"kquant: gguf-py does not know llama.cpp's architecture {arch_name!r} of this model: its weights cannot be read back")
    names = TensorNameMap(arch, int(layers))
    table = {t["name"]: t for t in report["tensors"]}
    data = np.memmap(artefact, mode="r", dtype=np.uint8)
    weights: dict[str, torch.Tensor] = {}
    stored: dict[str, int] = {}
    types: dict[str, str] = {}
    for name, param in subject.model.named_parameters():
        key = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if key is None or key not in table:
            continue
        entry = table[key]
        values = dequantize(np.asarray(data[entry["offset"]: entry["offset"] + entry["bytes"]]), GGMLQuantizationType(entry["type"]))
        if values.size != param.numel():
            raise ToolError(f"kquant: llama.cpp's {key} holds {values.size} values, the model's {name} {param.numel()}")
        value = torch.from_numpy(np.require(values, np.float32, ["C", "W"]).reshape(tuple(param.shape)))  # F32 tensors: a copy, not the file
        if arch_name in PERMUTED and key.split(".")[-2] in ("attn_q", "attn_k"):
            heads = config.num_attention_heads if key.split(".")[-2] == "attn_q" else getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            value = unpermute(value, int(heads))
        original = param.detach().to("cpu", torch.float32)
        error = float((value - original).norm() / original.norm().clamp_min(1e-12))
        if error > MISMATCH:
            raise ToolError(f"kquant: llama.cpp's {key} ({entry['type_name']}) is not the model's {name} (relative error {error:.2f}): "
                            f"paretolab does not know how llama.cpp lays out architecture {arch_name!r}")
        weights[name], stored[name], types[name] = value, int(entry["bytes"]), str(entry["type_name"])
    unread = {key for key in table if key not in {names.get_name(n, try_suffixes=(".weight", ".bias")) for n in stored}}
    return weights, stored, types, unread


def unpermute(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's converter's q/k row permutation (each head's two rope halves interleaved) of an (out, in) weight."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def describe_types(kind: str, types: dict[str, str], widths: dict[str, int]) -> str:
    """``"Q4_K_M: 84 q4_K, 12 q6_K, 30 q5_0 (rows not a multiple of 256), 61 f32"``: what llama.cpp stored, counted."""
    counts = Counter(types.values())
    parts = []
    for ggml_type, count in counts.most_common():
        names = [n for n, t in types.items() if t == ggml_type]
        fallback = "_K" in kind and not ggml_type.endswith("_K") and ggml_type not in ("f32", "f16", "bf16") \
            and all(widths[n] % SUPERBLOCK for n in names)
        parts.append(f"{count} {ggml_type}" + (f" (rows not a multiple of {SUPERBLOCK})" if fallback else ""))
    return f"{kind}: {', '.join(parts)}"


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(KQuant())

