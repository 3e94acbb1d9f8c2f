"""llama.cpp's own quantizer on a GGUF: ``llama_model_quantize`` through llama-cpp-python, with the type's default mix.

Runs under the llama engine's Python (``make engines-llama``: llama-cpp-python and numpy, no torch), so it writes no
``weights.safetensors``: the request names the f32 GGUF paretolab's converter wrote (``gguf``) and the llama.cpp type
(``params.type``: ``Q4_K_M``, ``Q8_0``, ``F16`` ... as ``LLAMA_FTYPE_MOSTLY_<type>`` names it); the tool writes
``out/model-<type>.gguf`` exactly as llama.cpp quantizes it (its own choice of type per tensor: the mix's larger types
for some layers, its fallbacks where a row is not a whole number of blocks, norms left in F32) and ``out/report.json``.
The report's table (each tensor's name, ggml type, offset and bytes in the file; ``stored_bytes`` by GGUF tensor name)
is read back from the written GGUF by ggml's own GGUF reader (``gguf_init_from_file`` in llama-cpp-python's
``libggml-base``), in C: gguf-py's Python reader spends seconds on a 49k-token vocabulary. paretolab's side maps the
names to the model's parameters and dequantizes each tensor with gguf-py. Nothing is quantized here but by the one
library call.
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

from _toolkit import fail, read_request, write_report

LIBRARY = "llama-cpp-python"


def main() -> None:
    request = read_request()
    out = Path(request["out"])
    source = Path(request["gguf"])
    kind = str(request["params"]["type"]).upper()
    if not source.is_file():
        fail(f"no GGUF to quantize at {source}")
    try:
        import llama_cpp
    except ImportError as exc:
        fail(f"{LIBRARY} does not import in {sys.executable}: {exc}")
    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}", None)
    if ftype is None:
        known = sorted(n[len("LLAMA_FTYPE_MOSTLY_"):] for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_"))
        fail(f"llama.cpp has no type {kind!r} (this build knows {', '.join(known)})")
    target = out / f"model-{kind}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = int(request.get("threads") or 0)  # 0: llama.cpp's own choice (the hardware's threads)
    llama_cpp.llama_backend_init()
    start = time.monotonic()
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    seconds = time.monotonic() - start
    if code != 0 or not target.is_file():
        fail(f"llama_model_quantize({source.name} -> {kind}) returned {code} (llama.cpp's own messages are above in this log)")
    arch, tensors = gguf_table(Path(llama_cpp.__file__).parent / "lib", target)
    write_report(out, library=LIBRARY, stored_bytes={t["name"]: t["bytes"] for t in tensors}, artifact=target.name, fmt=kind,
                 notes=[f"llama.cpp quantized {source.name} ({source.stat().st_size} bytes) to {kind} "
                        f"({target.stat().st_size} bytes) in {seconds:.1f} s"],
                 extra={"ftype": int(ftype), "file_bytes": target.stat().st_size, "quantize_seconds": seconds,
                        "architecture": arch, "tensors": tensors})


class _InitParams(ctypes.Structure):  # struct gguf_init_params (ggml's gguf.h)
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def gguf_table(libdir: Path, path: Path) -> tuple[str, list[dict[str, object]]]:
    """``general.architecture`` and each tensor's name, ggml type, absolute offset and bytes, by ggml's own GGUF reader."""
    names = sorted(libdir.glob("libggml-base.*"), key=lambda p: len(p.name))
    if not names:
        fail(f"no libggml-base beside llama_cpp in {libdir}: cannot read the GGUF llama.cpp wrote")
    lib = ctypes.CDLL(str(names[0]))
    lib.gguf_init_from_file.restype = ctypes.c_void_p
    lib.gguf_init_from_file.argtypes = [ctypes.c_char_p, _InitParams]
    lib.gguf_free.argtypes = [ctypes.c_void_p]
    lib.gguf_get_n_tensors.restype = ctypes.c_int64
    lib.gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
    lib.gguf_get_data_offset.restype = ctypes.c_size_t
    lib.gguf_get_data_offset.argtypes = [ctypes.c_void_p]
    for fn, res in (("gguf_get_tensor_name", ctypes.c_char_p), ("gguf_get_tensor_offset", ctypes.c_size_t),
                    ("gguf_get_tensor_type", ctypes.c_int), ("gguf_get_tensor_size", ctypes.c_size_t)):
        getattr(lib, fn).restype = res
        getattr(lib, fn).argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.gguf_find_key.restype = ctypes.c_int64
    lib.gguf_find_key.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.gguf_get_val_str.restype = ctypes.c_char_p
    lib.gguf_get_val_str.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.ggml_type_name.restype = ctypes.c_char_p
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    if not ctx:
        fail(f"ggml's GGUF reader could not open the file llama.cpp wrote ({path})")
    try:
        key = lib.gguf_find_key(ctx, b"general.architecture")
        arch = lib.gguf_get_val_str(ctx, key).decode() if key >= 0 else ""
        base = int(lib.gguf_get_data_offset(ctx))
        tensors = []
        for i in range(int(lib.gguf_get_n_tensors(ctx))):
            kind = int(lib.gguf_get_tensor_type(ctx, i))
            tensors.append({"name": lib.gguf_get_tensor_name(ctx, i).decode(), "type": kind, "type_name": lib.ggml_type_name(kind).decode(),
                            "offset": base + int(lib.gguf_get_tensor_offset(ctx, i)), "bytes": int(lib.gguf_get_tensor_size(ctx, i))})
    finally:
        lib.gguf_free(ctx)
    return arch, tensors


if __name__ == "__main__":
    main()
