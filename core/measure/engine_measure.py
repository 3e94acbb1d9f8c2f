"""The ``engine`` measure: the trial's model served by an inference engine's own server, under load.

For a trial it writes the subject's model as a Hugging Face directory (format modules replaced by the
dense modules they compute), puts it in the engine's format, starts the engine's server on
127.0.0.1 and a free port (:mod:`paretolab.measure.engine_server`), drives it with the load
generator (:mod:`paretolab.measure.engine_load`: a fixed prompt set, ``new_tokens`` per request,
each concurrency level, ``repeats``) and stops it, on every path. Engines: ``llama`` (llama.cpp
through llama-cpp-python, :mod:`paretolab.measure.engine_llama`) and ``vllm`` (vLLM's OpenAI server from
its own environment, :mod:`paretolab.measure.engine_vllm`, serving the directory, or an integer-group
trial's compressed-tensors checkpoint, as it is). What is served, and its label: :mod:`paretolab.measure.engine_formats`.

Metrics, for engine ``E`` and level ``N`` (each with ``_ci_low`` / ``_ci_high``: the 95 % t-interval
over repeats): ``E_tok_s_cN`` (aggregate output tokens/s), ``E_tok_s_per_user_cN``,
``E_ttft_p50_s_cN`` / ``E_ttft_p99_s_cN``, ``E_itl_p50_s_cN`` / ``E_itl_p99_s_cN``,
``E_cN_j_per_token``; and ``E_errors_cN``, ``E_peak_rss_mb`` (the server's process tree, sampled),
``E_start_s`` (start to first answer), ``E_model_bytes`` (the file served); with the perplexity task,
``E_ppl`` from the engine's own log-probabilities on the task's windows and ``E_ppl_diff`` (engine −
trial, paired over windows, with its interval) and ``E_ppl_gap`` (1: beyond noise), see
:mod:`paretolab.measure.engine_ppl` (where there is none, ``E_ppl_note`` says why).

Labels, in the trial's info (never silent): ``E_format`` is what was served — ``F32`` (or the
``gguf_type`` asked for) where the trial's weights are dense; ``Q4_0 (exact: ...)`` / ``Q8_0 (exact:
...)`` where every quantized matrix is RTN's symmetric groups of 32 (:mod:`paretolab.measure.engine_gguf`
writes the trial's own codes as the engine's blocks); ``F32 dense equivalent (no engine kernel: dense
cost)`` where they are not an exact engine format (sparsity, other groups or bit widths, method formats);
vLLM: ``compressed-tensors pack-quantized (...)`` where the trial's integer groups were written as that
checkpoint, and where vLLM refused it at start, ``E_refused`` holds vLLM's own exception and the dense
equivalent is served, its label saying so; a method's own artefact (:mod:`paretolab.plugin_api.artifacts`: kquant's
GGUF for llama.cpp, llm-compressor's checkpoint for vLLM) is served as its library wrote it, and ``E_format`` says whose
it is; ``E_weights`` says what the trial's weights are;
``E_energy_source`` is ``rapl`` or ``estimate`` (the server's CPU seconds x watts per core).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from paretolab.errors import ConfigError
from paretolab.measure.energy import choose_source, counter_monitor, watts_per_core
from paretolab.measure.engine_formats import DENSE_LABEL, compressed_checkpoint, exact_bits, served_label, weight_kinds, write_hf
from paretolab.measure.engine_gguf import BITS_TO_TYPE, requantize
from paretolab.measure.engine_llama import GGUF_TYPES, LlamaEngine
from paretolab.measure.engine_load import FIGURES, PROMPTS, EngineLoadError, LoadSpec, metric_name, run_load
from paretolab.measure.engine_ppl import EnginePplError, compare, task_windows, window_nll
from paretolab.measure.engine_server import EngineStartError, Server, free_port, group_alive, serve
from paretolab.measure.engine_vllm import VllmEngine, shim_dir
from paretolab.plugin_api import artifacts
from paretolab.plugin_api.numbers import number
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.measure import Measure
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject

ENGINES = ("llama", "vllm")
LEVELS = (1, 2, 4, 8, 16, 32)  # the concurrency levels a pipeline may ask for (each has its metrics registered)


def _check_levels(value: Any) -> None:
    if not isinstance(value, (list, tuple)) or not value or any(not isinstance(v, int) or isinstance(v, bool) or v not in LEVELS for v in value):
        raise ConfigError(f"measures.engine.concurrency: {value!r}; give a list of levels from {', '.join(map(str, LEVELS))}")
    if len(set(value)) != len(value):
        raise ConfigError(f"measures.engine.concurrency: {value!r} repeats a level")


def _check_engines(value: Any) -> None:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or any(n not in ENGINES for n in names) or len(set(names)) != len(names):
        raise ConfigError(f"measures.engine.engine: {value!r}; give one of {', '.join(ENGINES)} or a list of them")


@dataclass(frozen=True)
class EngineOptions:
    engine: tuple[str, ...] | str = option("llama", check=lambda v: _check_engines(v))  # one engine or a list, served one after another
    concurrency: tuple[int, ...] = option((1, 4, 16), check=_check_levels)  # users sending at once, one level after another
    prompts: int = option(8, low=1, high=len(PROMPTS))  # how many of the fixed prompts (in order)
    new_tokens: int = option(32, low=2, high=1024)  # output tokens per request (end-of-text suppressed)
    repeats: int = option(3, low=1, high=50)  # rounds per level: the intervals are over these
    warmup: int = option(1, low=0)
    request_timeout_s: float = option(120.0, low=1.0)
    max_requests: int = option(5000, low=1)
    max_total_s: float = option(1800.0, low=1.0)  # the whole load; no request is sent after it
    ready_s: float = option(900.0, low=1.0)  # the server's start, conversion excluded (vLLM on 2 CPU cores: ~5 min)
    gguf_type: str = option("f32", one_of=GGUF_TYPES)  # llama: what dense weights are written as
    exact_blocks: bool = True  # llama: RTN int4 / int8 groups of 32 served as Q4_0 / Q8_0 blocks of the trial's own codes
    n_ctx: int = option(2048, low=64)
    threads: int = option(0, low=0)  # engine threads; 0: the trial's resources.cpus, else every core
    kv_cache_gib: float = option(2.0, low=0.1)  # vllm: VLLM_CPU_KVCACHE_SPACE
    dtype: str = option("float32", one_of=("float32", "bfloat16", "float16"))  # vllm: --dtype (the trial's weights are float32)
    eager: bool = False  # vllm: --enforce-eager (no torch.compile warm-up: a shorter start, a slower decode; the tests use it)
    ppl: bool = True  # the engine's perplexity on the perplexity task's windows, beside the trial's


def no_stop_bias(tokenizer: Any) -> dict[str, float]:
    """A logit bias that keeps the special tokens (end of text among them) out, so every request runs to ``new_tokens``."""
    ids = sorted({int(i) for i in getattr(tokenizer, "all_special_ids", []) or []} | ({int(tokenizer.eos_token_id)} if getattr(tokenizer, "eos_token_id", None) is not None else set()))
    return {str(i): -100.0 for i in ids}


def energy_counter(server: Server) -> tuple[Callable[[], float], str]:
    """A cumulative joules counter for the load: RAPL's packages where readable, else the server's CPU seconds x watts per core."""
    monitor = counter_monitor()
    source = choose_source(monitor, gpu=False)
    if source == "rapl":
        last = {i: f() for i, f in monitor.cpus.items()}
        total = [0.0]

        def rapl() -> float:
            for i, f in monitor.cpus.items():
                now = f()
                step = now - last[i]
                total[0] += step % monitor.wrap[i] if i in monitor.wrap else step
                last[i] = now
            return total[0]

        return rapl, "rapl"
    server.mark_cpu()
    watts = watts_per_core()
    return (lambda: server.cpu_s_since_mark * watts), "estimate"


@dataclass(frozen=True)
class _Served:
    """What a server is given: the model file or directory, its bytes, and the command for a port."""

    path: Path
    bytes: int
    command: Callable[[int], list[str]]


@dataclass
class _Run:
    source: str
    report: Any
    peak: int
    start_s: float
    quality: dict[str, float]
    model_bytes: int
    loadavg: float


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.glob("*.safetensors"))


class Engine(Measure):
    """The trial's model served by an engine's own server under load (see the module doc)."""

    name = "engine"
    metrics = tuple(
        [f"{metric_name(e, f, c)}{s}" for e in ENGINES for f in FIGURES for c in LEVELS for s in ("", "_ci_low", "_ci_high")]
        + [f"{e}_errors_c{c}" for e in ENGINES for c in LEVELS]
        + [f"{e}_{m}" for e in ENGINES for m in ("peak_rss_mb", "start_s", "model_bytes", "load_s", "loadavg")]
        + [f"{e}_{m}" for e in ENGINES for m in ("ppl", "ppl_ci_low", "ppl_ci_high", "ppl_diff", "ppl_diff_ci_low", "ppl_diff_ci_high", "ppl_gap")]
    )
    options = EngineOptions
    default = False

    def check_here(self, options: EngineOptions) -> None:
        """Refuse, before any trial (`check` and `run`), an engine asked for that is not installed on this machine:
        every trial would fail on it. EngineUnavailable names the engine and the make target that installs it."""
        for e in [options.engine] if isinstance(options.engine, str) else options.engine:
            LlamaEngine.find() if e == "llama" else VllmEngine.find()

    def measure(self, subject: Subject, options: EngineOptions, ctx: TrialContext) -> dict[str, float]:
        out: dict[str, float] = {}
        for e in [options.engine] if isinstance(options.engine, str) else options.engine:
            out.update(self._serve(e, subject, options, ctx))
        return out

    def _serve(self, e: str, subject: Subject, options: EngineOptions, ctx: TrialContext) -> dict[str, float]:
        engine = LlamaEngine.find() if e == "llama" else VllmEngine.find()
        kinds = weight_kinds(subject)
        subject.info[f"{e}_weights"] = ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())) or "none"
        subject.info[f"{e}_format"] = served_label(kinds, options.gguf_type if e == "llama" else "f32" if options.dtype == "float32" else options.dtype)
        threads = options.threads or (int(ctx.cpus) if ctx.cpus >= 1 else (os.cpu_count() or 1))
        extra: dict[str, Any] = {"logit_bias": no_stop_bias(subject.tokenizer)} if e == "llama" else {"ignore_eos": True}
        spec = LoadSpec(prompts=PROMPTS[: options.prompts], new_tokens=options.new_tokens, concurrency=tuple(options.concurrency),
                        repeats=options.repeats, warmup=options.warmup, request_timeout_s=options.request_timeout_s,
                        max_requests=options.max_requests, max_total_s=options.max_total_s, extra=extra)
        with tempfile.TemporaryDirectory(prefix=f"paretolab-{e}-", dir=ctx.workdir if ctx.workdir and Path(ctx.workdir).is_dir() else None) as tmp:
            folder = write_hf(subject, Path(tmp) / "hf")
            if isinstance(engine, LlamaEngine):
                own = artifacts.served(subject, "gguf")  # the method's own GGUF (kquant): served as its library wrote it
                bits = exact_bits(kinds) if options.exact_blocks and own is None else None
                if own is not None:
                    gguf = own
                    subject.info[f"{e}_format"] = f"{artifacts.describe(subject)} as written ({subject.info.get(subject.info[artifacts.BY] + '_format', '')})"[:300]
                else:
                    gguf = engine.convert(folder, Path(tmp) / f"model-{'f32' if bits else options.gguf_type}.gguf", "f32" if bits else options.gguf_type)
                if bits:
                    gguf = self._blocks(gguf, bits, kinds, subject.info, e)
                served = _Served(gguf, gguf.stat().st_size, lambda port: engine.server_command(gguf, port, threads=threads, n_ctx=options.n_ctx))
                run = self._run(e, engine.python, served, None, spec, subject, options, ctx, Path(tmp))
                # the served GGUF's own logits, through the engine's library (see LlamaEngine.window_nll)
                run.quality = self._ppl(e, "", subject, options, ctx, nll=lambda ws: engine.window_nll(gguf, ws, n_ctx=options.n_ctx, threads=threads))
            else:
                env = engine.env(shim_dir(Path(tmp) / "shim"), options.threads, options.kv_cache_gib)
                dense_label = subject.info[f"{e}_format"]
                own = artifacts.served(subject, "compressed-tensors")  # the method's own checkpoint (llm-compressor's): tried first
                packed = own or compressed_checkpoint(subject, kinds, Path(tmp) / "compressed", subject.info, e)
                if own is not None:
                    subject.info[f"{e}_format"] = f"{artifacts.describe(subject)} checkpoint as written"
                targets = [t for t in (packed, folder) if t is not None]
                for i, target in enumerate(targets):
                    served = _Served(target, _bytes(target), lambda port, t=target: engine.server_command(t, port, n_ctx=options.n_ctx, dtype=options.dtype, eager=options.eager))
                    try:
                        run = self._run(e, engine.python, served, env, spec, subject, options, ctx, Path(tmp))
                        break
                    except EngineStartError as exc:
                        if i == len(targets) - 1:
                            raise
                        # vLLM's own words, then the same trial as its dense equivalent, labelled: never silent
                        subject.info[f"{e}_refused"] = f"vLLM did not serve the compressed-tensors checkpoint: {exc.reason}"[:600]
                        subject.info[f"{e}_format"] = f"{dense_label}: vLLM refused the compressed-tensors checkpoint ({exc.reason[:300]})"
        source, report, peak, start_s, quality, model_bytes = run.source, run.report, run.peak, run.start_s, run.quality, run.model_bytes
        subject.info[f"{e}_energy_source"] = source
        if report.cut:
            subject.info[f"{e}_load_cut"] = report.cut
        out = report.metrics(prefix=e)
        out.update(quality)
        out.update({f"{e}_peak_rss_mb": peak / 2**20, f"{e}_start_s": start_s, f"{e}_model_bytes": float(model_bytes),
                    f"{e}_load_s": report.wall_s, f"{e}_loadavg": run.loadavg})
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def _run(self, e: str, python: Path, served: _Served, env: dict[str, str] | None, spec: LoadSpec, subject: Subject,
             options: EngineOptions, ctx: TrialContext, tmp: Path) -> _Run:
        """One server on a free port: started, loaded, (vLLM) asked for its perplexity, stopped on every path."""
        from paretolab.measure.timing import node_lock

        port = free_port()
        with node_lock():  # one timing at a time on this node, as the latency measure
            t0 = time.perf_counter()
            with serve(served.command(port), port=port, log=tmp / f"server-{port}.log", ready_s=options.ready_s, env=env,
                       name=f"{e} ({python})") as server:
                start_s = time.perf_counter() - t0
                joules, source = energy_counter(server)
                load = os.getloadavg()[0]
                try:
                    report = run_load(server.url, "trial", spec, joules=joules)
                except EngineLoadError as exc:  # a server that crashed mid-load: say so, not only "connection refused"
                    if (died := server.died()) is not None:
                        raise EngineLoadError(f"{e} server {died} (during the load, which saw: {exc})") from exc
                    raise
                load = (load + os.getloadavg()[0]) / 2
                peak = server.peak_rss_bytes
                quality = self._ppl(e, server.url, subject, options, ctx) if e == "vllm" else {}
                pid = server.pid
        if group_alive(pid):  # serve() stopped the group (TERM, then KILL): checked, never assumed
            raise RuntimeError(f"{e}: processes of the server's group {pid} outlived its stop")
        subject.info[f"{e}_server_stopped"] = f"process group {pid}: none left after the measure (checked)"
        return _Run(source, report, peak, start_s, quality, served.bytes, load)

    @staticmethod
    def _ppl(e: str, url: str, subject: Subject, options: EngineOptions, ctx: TrialContext,
             nll: Callable[[list[list[int]]], list[float]] | None = None) -> dict[str, float]:
        """The engine's perplexity on the task's windows beside the trial's (see :mod:`paretolab.measure.engine_ppl`); why not, in the info."""
        if not options.ppl:
            return {}
        windows = task_windows(subject.tokenizer, ctx.task, Path(ctx.workdir))
        if isinstance(windows, str):
            subject.info[f"{e}_ppl_note"] = f"no engine perplexity: {windows}"
            return {}
        try:
            if nll is not None:
                per_window = nll(windows.ids)
            else:
                per_window = [window_nll(url, e, ids, timeout_s=options.request_timeout_s, tokenizer=subject.tokenizer) for ids in windows.ids]
        except (EnginePplError, OSError, KeyError, ValueError, RuntimeError) as exc:
            subject.info[f"{e}_ppl_note"] = f"no engine perplexity: the engine answered {type(exc).__name__}: {exc}"[:500]
            return {}
        return compare(per_window, windows, e)

    @staticmethod
    def _blocks(f32: Path, bits: int, kinds: Counter[str], info: dict[str, Any], e: str) -> Path:
        """The trial's RTN codes as exact Q4_0 / Q8_0 blocks where every quantized matrix has them; else the F32 file, labelled."""
        done = requantize(f32, f32.with_name(f"model-{BITS_TO_TYPE[bits].lower()}.gguf"), bits)
        want = kinds[f"int{bits} g32"]
        got = done.blocks[BITS_TO_TYPE[bits]]
        if got != want:
            done.path.unlink(missing_ok=True)
            info[f"{e}_format"] = f"F32 {DENSE_LABEL}: only {got} of {want} int{bits} g32 matrices sat on the {BITS_TO_TYPE[bits]} grid"
            return f32
        info[f"{e}_format"] = (f"{BITS_TO_TYPE[bits]} (exact: the trial's codes; block scales stored as fp16, "
                               f"largest relative change {number(done.scale_rel_err, digits=2)}; other tensors F32)")
        f32.unlink()
        return done.path


_UNITS = {"tok_s": ("tokens/s", "maximize", "output tokens per second, all users together"),
          "tok_s_per_user": ("tokens/s", "maximize", "output tokens per second one user sees (its tokens / its request's time), mean over requests"),
          "ttft_p50_s": ("s", "minimize", "median time to first token"), "ttft_p99_s": ("s", "minimize", "99th percentile time to first token"),
          "itl_p50_s": ("s", "minimize", "median gap between output tokens"), "itl_p99_s": ("s", "minimize", "99th percentile gap between output tokens"),
          "j_per_token": ("J/token", "minimize", "joules per output token (RAPL, or estimated from the server's CPU seconds; see E_energy_source)")}
_NAMES = {"llama": "llama.cpp (llama-cpp-python server)", "vllm": "vLLM (OpenAI server)"}


def _definitions() -> list[Metric]:
    out = []
    for e in ENGINES:
        where = _NAMES[e]
        for f in FIGURES:
            unit, direction, text = _UNITS[f]
            for c in LEVELS:
                name = metric_name(e, f, c)
                out.append(Metric(name, unit, direction, f"engine measure, {where} at concurrency {c}: {text}, mean over repeats"))
                for end in ("low", "high"):
                    out.append(Metric(f"{name}_ci_{end}", unit, direction, f"{end} end of the 95 % t-interval over repeats of {name}"))
        for c in LEVELS:
            out.append(Metric(f"{e}_errors_c{c}", "requests", "minimize", f"engine measure, {where}: requests at concurrency {c} that failed or were cut"))
        out += [Metric(f"{e}_peak_rss_mb", "MiB", "minimize", f"engine measure: peak resident memory of the {where} server's processes"),
                Metric(f"{e}_start_s", "s", "minimize", f"engine measure: seconds from starting the {where} server to its first answer"),
                Metric(f"{e}_model_bytes", "bytes", "minimize", f"engine measure: bytes of the model file {where} served"),
                Metric(f"{e}_load_s", "s", "minimize", f"engine measure: wall time of the whole load on {where}"),
                Metric(f"{e}_loadavg", "", "minimize", f"engine measure: the machine's 1-minute load average while {where} was under load (mean of its start and end)"),
                Metric(f"{e}_ppl", "", "minimize", f"engine measure: perplexity from {where}'s own log-probabilities on the perplexity task's windows"),
                Metric(f"{e}_ppl_ci_low", "", "minimize", f"lower end of the 95 % bootstrap interval (windows) of {e}_ppl"),
                Metric(f"{e}_ppl_ci_high", "", "minimize", f"upper end of the 95 % bootstrap interval (windows) of {e}_ppl"),
                Metric(f"{e}_ppl_diff", "", "minimize", f"engine measure: {e}_ppl minus the trial's ppl, paired over the same windows"),
                Metric(f"{e}_ppl_diff_ci_low", "", "minimize", f"lower end of the 95 % paired-bootstrap interval of {e}_ppl_diff"),
                Metric(f"{e}_ppl_diff_ci_high", "", "minimize", f"upper end of the 95 % paired-bootstrap interval of {e}_ppl_diff"),
                Metric(f"{e}_ppl_gap", "flag", "minimize", f"1 where {e}_ppl differs from the trial's ppl beyond the windows' noise (the paired interval excludes 0), else 0")]
    return out


@hookimpl
def register_measures(register: Callable[[Measure], None]) -> None:
    register(Engine())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in _definitions():
        register(metric)
