"""llama.cpp through llama-cpp-python: a Hugging Face directory to GGUF, and the server command.

Where things are (``make engines`` makes both; environment variables override):

- the server's Python: ``$PARETOLAB_LLAMA_PYTHON``, else ``ENGINES/llama/bin/python``, a virtual
  environment with ``llama-cpp-python[server]`` (compiled from source: its own llama.cpp);
- the converter: ``$PARETOLAB_LLAMA_CONVERTER``, else ``ENGINES/llama-convert/convert_hf_to_gguf.py``:
  llama.cpp's ``convert_hf_to_gguf.py`` with its ``conversion/`` and ``gguf-py/``, as vendored in the
  same llama-cpp-python source distribution (the installed wheel carries only the library, not the
  converter). It runs under paretolab's own Python (torch, transformers, safetensors are there; the
  ``engines`` extra adds ``sentencepiece``, which the converter imports for every Llama model).

``ENGINES`` is ``$PARETOLAB_ENGINES``, else ``engines/`` in paretolab's cache directory.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from paretolab.data.files import cache_dir
from paretolab.errors import ConfigError
from paretolab.measure.engine_server import log_tail

LLAMA_CPP_PYTHON = "0.3.36"  # the version `make engines` installs and the converter comes from
GGUF_TYPES = ("f32", "f16", "bf16")  # what the converter writes from dense weights

# Per window: llama.cpp's logits for every position (logits_all) of the token ids as given, log-softmax in float64,
# mean NLL of ids[1:] (row i predicts token i + 1). Run with the engine's own Python on the GGUF the server served.
_NLL_SCRIPT = """
import json, sys
import numpy as np
from llama_cpp import Llama
spec = json.load(open(sys.argv[1]))
llm = Llama(model_path=spec["gguf"], n_ctx=spec["n_ctx"], n_batch=spec["n_ctx"], n_ubatch=spec["n_ctx"], n_threads=spec["threads"],
            n_threads_batch=spec["threads"], logits_all=True, verbose=False)
out = []
for ids in spec["windows"]:
    llm.reset()
    llm.eval(ids)
    s = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    s = s - s.max(axis=1, keepdims=True)
    lp = s - np.log(np.exp(s).sum(axis=1, keepdims=True))
    out.append(float(-np.mean(lp[np.arange(len(ids) - 1), np.asarray(ids[1:])])))
json.dump(out, open(sys.argv[2], "w"))
"""


class EngineUnavailable(ConfigError):
    """An engine asked for that is not installed here (its environment or converter is missing)."""


def engines_dir() -> Path:
    return Path(os.environ.get("PARETOLAB_ENGINES") or cache_dir() / "engines")


@dataclass(frozen=True)
class LlamaEngine:
    python: Path
    converter: Path

    @classmethod
    def find(cls) -> LlamaEngine:
        """The installed engine, or EngineUnavailable saying what is missing and how to make it."""
        root = engines_dir()
        python = Path(os.environ.get("PARETOLAB_LLAMA_PYTHON") or root / "llama" / "bin" / "python")
        converter = Path(os.environ.get("PARETOLAB_LLAMA_CONVERTER") or root / "llama-convert" / "convert_hf_to_gguf.py")
        missing = [f"{what} ({path})" for what, path in (("llama-cpp-python's Python", python), ("the GGUF converter", converter))
                   if not path.exists()]
        if missing:
            raise EngineUnavailable(f"engine 'llama' is not installed: missing {' and '.join(missing)}; run `make engines-llama` "
                                    "(or set PARETOLAB_ENGINES / PARETOLAB_LLAMA_PYTHON / PARETOLAB_LLAMA_CONVERTER)")
        if (converter.parent / "conversion").is_dir() and importlib.util.find_spec("sentencepiece") is None:
            # llama.cpp's converter (its `conversion/` package) runs in this Python and imports sentencepiece for Llama models
            raise EngineUnavailable(f"engine 'llama' is found ({converter.parent}) but this Python ({sys.executable}) lacks sentencepiece, "
                                    "which its GGUF converter imports: run `make engines-llama` (it adds the `engines` extra)")
        return cls(python=python, converter=converter)

    def convert(self, model_dir: Path, out: Path, outtype: str = "f32", *, timeout_s: float = 900.0, log: Path | None = None) -> Path:
        """``model_dir`` (config.json + safetensors + tokenizer) → ``out`` (GGUF of ``outtype``), by llama.cpp's converter."""
        if outtype not in GGUF_TYPES:
            raise ConfigError(f"GGUF type {outtype!r}: the converter writes one of {', '.join(GGUF_TYPES)} from dense weights")
        log = log or out.with_suffix(".convert.log")
        cmd = [sys.executable, str(self.converter), str(model_dir), "--outfile", str(out), "--outtype", outtype]
        env = {**os.environ, "PYTHONPATH": str(self.converter.parent)}
        env.pop("NO_LOCAL_GGUF", None)  # the converter's own gguf-py, the version it was written against
        with open(log, "wb") as f:
            try:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                      timeout=timeout_s, check=False)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"GGUF conversion of {model_dir} did not finish in {timeout_s:g} s: {log_tail(log)}") from None
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"GGUF conversion of {model_dir} failed (exit {proc.returncode}): {log_tail(log)}")
        return out

    def window_nll(self, gguf: Path, windows: list[list[int]], *, n_ctx: int, threads: int, timeout_s: float = 1800.0) -> list[float]:
        """Mean NLL per window from llama.cpp's own logits on ``gguf`` (llama-cpp-python's ``Llama.eval``, all positions).

        Not through the server: llama-cpp-python's ``echo`` + ``logprobs`` pairs position i's
        log-probabilities with token i itself instead of token i + 1 (``logprobs_token[int(token)]``
        in ``Llama._create_completion``), so its echoed prompt log-probabilities are not the model's.
        """
        folder = gguf.parent
        spec, result, log = folder / "nll-in.json", folder / "nll-out.json", folder / "nll.log"
        spec.write_text(json.dumps({"gguf": str(gguf), "n_ctx": max(n_ctx, max(len(w) for w in windows)), "threads": threads, "windows": windows}))
        with open(log, "wb") as f:
            try:
                proc = subprocess.run([str(self.python), "-c", _NLL_SCRIPT, str(spec), str(result)], stdout=f, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=timeout_s, check=False, start_new_session=True)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"llama.cpp perplexity did not finish in {timeout_s:g} s: {log_tail(log)}") from None
        if proc.returncode != 0 or not result.is_file():
            raise RuntimeError(f"llama.cpp perplexity failed (exit {proc.returncode}): {log_tail(log)}")
        return [float(v) for v in json.loads(result.read_text())]

    def server_command(self, gguf: Path, port: int, *, threads: int, n_ctx: int, alias: str = "trial") -> list[str]:
        """``python -m llama_cpp.server`` on 127.0.0.1:``port`` serving ``gguf``."""
        return [str(self.python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", alias,
                "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--n_threads", str(threads),
                "--n_threads_batch", str(threads), "--verbose", "False"]
