"""The results documents (pipelines/*.md): which studies each holds, rendered from committed bundles.

``results/documents.yaml`` names every document, its studies in run order, its columns and which studies time
something. Each study's record is ``results/bundles/STUDY.jsonl.gz``; a document is a pure function of its bundles and
of the code that judges them, so ``render_document`` gives the same bytes on any machine, offline, and a committed
document that differs from its rendering is stale (``paretolab results render --check``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paretolab.data.names import check_name, printable
from paretolab.errors import ConfigError
from paretolab.plugin_api.numbers import number
from paretolab.results.extras import check_extras
from paretolab.results.load import MAX_LOAD

MANIFEST = Path("results") / "documents.yaml"
BUNDLES = Path("results") / "bundles"
DOCUMENT_KEYS = ("path", "family", "title", "studies", "metrics", "trials", "prepare", "timed", "extras")


@dataclass(frozen=True)
class Document:
    path: str
    family: str
    title: str
    studies: tuple[str, ...]
    metrics: tuple[str, ...]
    trials: str
    prepare: tuple[str, ...]
    timed: frozenset[str]
    extras: tuple[dict[str, Any], ...] = ()  # sections after the studies' (paretolab.results.extras): sensitivity, interaction


def read_manifest(root: Path) -> list[Document]:
    """The documents ``root/results/documents.yaml`` lists; a field out of place is one line naming it."""
    from paretolab.data.yaml_read import read_yaml

    path = root / MANIFEST
    if not path.is_file():
        raise ConfigError(f"no {MANIFEST} under {root}: run from the paretolab checkout (or pass --root)")
    data = read_yaml(path.read_text(encoding="utf-8"), str(path))
    if not isinstance(data, dict) or not isinstance(data.get("documents"), list):
        raise ConfigError(f"{path}: expected `documents:` with a list of documents")
    out = []
    for i, entry in enumerate(data["documents"]):
        where = f"{path}: documents[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping")
        unknown = sorted(set(entry) - set(DOCUMENT_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(DOCUMENT_KEYS)})")
        for key in ("path", "family", "title", "studies"):
            if key not in entry:
                raise ConfigError(f"{where}: `{key}` is missing")
        metrics = entry.get("metrics")
        trials = entry.get("trials", "all")
        if trials not in ("all", "frontier"):
            raise ConfigError(f"{where}.trials: {trials!r}; use all or frontier")
        if not isinstance(entry["studies"], list):
            raise ConfigError(f"{where}.studies: expected a list of study names")
        studies = tuple(check_name(s, f"{where}.studies[{j}]") for j, s in enumerate(entry["studies"]))
        timed = frozenset(str(s) for s in entry.get("timed") or [])
        if timed - set(studies):
            raise ConfigError(f"{where}.timed: {sorted(timed - set(studies))[0]!r} is not among its studies")
        out.append(Document(str(entry["path"]), str(entry["family"]), str(entry["title"]), studies,
                            tuple(m.strip() for m in str(metrics).split(",") if m.strip()) if metrics else (),
                            trials, tuple(str(c) for c in entry.get("prepare") or []), timed,
                            check_extras(entry.get("extras"), studies, where)))
    families = [d.family for d in out]
    twice = sorted({f for f in families if families.count(f) > 1})
    if twice:
        raise ConfigError(f"{path}: family {twice[0]!r} is given to two documents; give each its own")
    return out


@dataclass(frozen=True)
class Figure:
    """A figure drawn from a family's bundles (the cross-paper frontier): ``out`` is a path without suffix."""

    family: str
    model: str
    out: str


def read_figures(root: Path) -> list[Figure]:
    from paretolab.data.yaml_read import read_yaml

    path = root / MANIFEST
    data = read_yaml(path.read_text(encoding="utf-8"), str(path)) if path.is_file() else {}
    out = []
    for i, entry in enumerate((data or {}).get("figures") or []):
        if not isinstance(entry, dict) or set(entry) != {"family", "model", "out"}:
            raise ConfigError(f"{path}: figures[{i}]: expected {{family, model, out}}, got {entry!r}")
        out.append(Figure(str(entry["family"]), str(entry["model"]), str(entry["out"])))
    return out


def documents_for(docs: list[Document], names: list[str]) -> list[Document]:
    """The documents named by family or path (all of them for no names); an unknown name is one line listing the families."""
    if not names:
        return docs
    picked = []
    for name in names:
        match = [d for d in docs if name in (d.family, d.path, Path(d.path).name)]
        if not match:
            raise ConfigError(f"no results document {name!r}; families: {', '.join(d.family for d in docs)}")
        picked += [d for d in match if d not in picked]
    return picked


def bundle_path(root: Path, study: str) -> Path:
    from paretolab.results.bundle import SUFFIX

    return root / BUNDLES / f"{study}{SUFFIX}"


def study_state(root: Path, study: str) -> tuple[str, str]:
    """("current" | "missing" | "stale" | "unknown", why) for a study's committed bundle against today's pipelines/STUDY.yaml
    ("unknown": neither a bundle nor a pipeline of that name, a misspelling in results/documents.yaml)."""
    from paretolab.results.bundle import read_bundle
    from paretolab.study.spec import pipeline_hash
    from paretolab.data.yaml_read import read_yaml

    bundle = bundle_path(root, study)
    pipeline = root / "pipelines" / f"{study}.yaml"
    if not bundle.is_file() and not pipeline.is_file():  # nothing to run it from: a misspelling, not a study to run
        return "unknown", unknown_study(root, study)
    if not bundle.is_file():
        return "missing", f"no {bundle.relative_to(root)}"
    if not pipeline.is_file():
        return "stale", f"no {pipeline.relative_to(root)} to compare with"
    wanted = pipeline_hash(read_yaml(pipeline.read_text(encoding="utf-8"), str(pipeline)))
    try:
        records = read_bundle(bundle)
    except ConfigError as exc:
        return "stale", str(exc)
    have = records[0].user_attrs.get("pipeline_hash") if records else None
    if have != wanted:
        return "stale", f"bundle made from pipeline {have}, pipelines/{study}.yaml is now {wanted}"
    record = records[0]
    expected = (record.user_attrs.get("pipeline") or {}).get("search", {}).get("trials")
    finished = sum(t["state"] in ("COMPLETE", "PRUNED", "FAIL") for t in record.trials)
    if isinstance(expected, int) and finished < expected:
        return "stale", f"bundle holds {finished} of {expected} trials"
    return "current", ""


def unknown_study(root: Path, study: str) -> str:
    """Why a study of results/documents.yaml is no study: no bundle and no pipeline of its name, and the closest name."""
    import difflib

    names = sorted(p.name[:-len(".yaml")] for p in (root / "pipelines").glob("*.yaml"))
    close = difflib.get_close_matches(study, names, n=1)
    return f"unknown study {study} (no pipeline named so{f'; did you mean {close[0]}?' if close else ''})"


def busy_timing(root: Path, study: str, max_load: float) -> str:
    """Why a timed study's bundle is not known to time an idle machine ("" when it is): some trial ran while the 1-min load
    average was over the study's own ``resources.cpus`` plus ``max_load`` (other work beside it), or its trials predate the
    load's recording (``info.load_1m``), so nobody can tell."""
    from paretolab.results.bundle import read_bundle

    bundle = bundle_path(root, study)
    if not bundle.is_file():
        return ""
    try:
        record = read_bundle(bundle)[0]
    except (ConfigError, IndexError):
        return ""
    load = (record.provenance.get("load_1m") or {}).get("max")
    if load is None:
        return "timed before trials recorded the machine's load: nobody can tell it ran alone"
    cpus = float(((record.user_attrs.get("pipeline") or {}).get("resources") or {}).get("cpus") or 1)
    if load <= cpus + max_load:
        return ""
    return f"timed on a busy machine: 1-min load up to {number(load)} beside its own {number(cpus)} CPU(s)"


def run_state(root: Path, study: str, *, timed: bool, max_load: float = MAX_LOAD, busy_ok: bool = False) -> tuple[str, str]:
    """:func:`study_state`, with "busy" for a current timed study whose bundle :func:`busy_timing` finds unfit (unless
    ``busy_ok``): the one decision of what `results status` reports and `results run` runs."""
    state, why = study_state(root, study)
    if state == "current" and timed and not busy_ok and (busy := busy_timing(root, study, max_load)):
        return "busy", busy
    return state, why


def expected_minutes(root: Path, study: str) -> float | None:
    """How long the study took when its bundle was made (first trial start to last trial end), if a bundle exists."""
    from paretolab.results.bundle import read_bundle

    bundle = bundle_path(root, study)
    if not bundle.is_file():
        return None
    try:
        prov = read_bundle(bundle)[0].provenance
    except (ConfigError, IndexError):
        return None
    import datetime as dt

    if not prov.get("trials_from") or not prov.get("trials_to"):
        return None
    span = dt.datetime.fromisoformat(prov["trials_to"]) - dt.datetime.fromisoformat(prov["trials_from"])
    return span.total_seconds() / 60


def worst_case_minutes(root: Path, study: str) -> float | None:
    """The pipeline's own bound: search.trials × search.trial_timeout_s, in minutes (None when either is missing)."""
    from paretolab.data.yaml_read import read_yaml

    path = root / "pipelines" / f"{study}.yaml"
    try:
        search = read_yaml(path.read_text(encoding="utf-8"), str(path)).get("search") or {}
    except (OSError, ConfigError, AttributeError):
        return None
    trials, timeout = search.get("trials"), search.get("trial_timeout_s")
    return trials * timeout / 60 if isinstance(trials, int) and isinstance(timeout, (int, float)) else None


def judging_code() -> str:
    """A hash of the code that turns trials into a document (results, stats, the claim syntax): a document rendered by
    other judging code is stale, so a change to how verdicts are reached re-renders every document before it lands."""
    import paretolab

    base = Path(paretolab.__file__).parent
    files = sorted([*(base / "results").glob("*.py"), base / "stats.py", base / "study" / "report_spec.py"])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


# The first line of a document none of whose studies has been rerun into a bundle yet: it predates the bundles and
# today's verdict code, and says so (``paretolab results render --check`` requires it there).
LEGACY_BANNER = ("> **Stale: this document predates study bundles and today's verdict code.** Its numbers come from stores that are "
                 "gone and its verdict lines do not follow the rules in docs/tutorials/verdicts.md; it is being regenerated "
                 "from reruns (`paretolab results status`). Read its verdicts as unchecked.")

HEAD = """`cost` says whether a saving is real (a stored format or a kernel that runs) or simulated (fake quantization, masks);
latency columns are measured on the machine that ran the study, so compare them within a table, not across machines. A
study whose pipeline carries claims opens with each and its verdict on the stored trials: paired with the baseline on the
same replicate (seed, calibration draw, split) and settings, one verdict per setting that varies, a 95 % interval
carrying both the replicate-to-replicate and the example-to-example noise (docs/tutorials/verdicts.md). Its table lists
the trials best first (those on the study's frontier over its objectives, then the front under them, each by its first
objective), a wide table as the decision columns with every measurement folded under them; its picture draws every
trial on its first two objectives (and the pipeline's `frontiers:` pairs), the frontier in black."""


def render_document(doc: Document, source: Any, root: Path | None = None) -> str:
    """The whole Markdown document from ``source`` (a BundleSource for the committed documents): the summary of its
    verdicts first, then its provenance, its cross-study picture, and each study with its picture (given ``root``)."""
    from paretolab.results.figures import figure_markdown, study_panels
    from paretolab.results.section import study_section
    from paretolab.results.summary import study_summary, summary_lines

    sections, provenance, summary = [], [], []
    for name in doc.studies:
        try:
            record = source.record(name) if hasattr(source, "record") else None
        except ConfigError:
            record = None
        if hasattr(source, "record") and record is None:
            sections.append(f"## {name}\n\nNo bundle yet: `paretolab results run {doc.family}` runs it.\n")
            summary.append({"study": name, "claim": "*no bundle yet*", "mark": "", "verdict": "", "effect": ""})
            continue
        if record is not None:
            provenance.append((name, record.provenance))
            if root is not None:
                current_claims(root, name, record)
        summary += study_summary(name, source)
        figure = figure_markdown(name, study_panels(name, source), doc.path) if root is not None else ""
        sections.append(study_section(name, source, list(doc.metrics) or _default_metrics(), frontier=doc.trials == "frontier",
                                      figure=figure))
    head = [
        f"# {doc.title}",
        "",
        *summary_lines(summary),
        f"Rendered from the studies' bundles (`results/bundles/STUDY.jsonl.gz`) by `make results-docs`; not edited by hand.",
        f"`paretolab results run {doc.family}` reruns a study whose bundle is missing or was made from another pipeline.",
        "",
        *provenance_lines(provenance),
        *(_cross_figures(doc, source, root) if root is not None else []),
        HEAD,
        "",
    ]
    if doc.extras and root is not None:
        from paretolab.results.extras import render_extras

        sections += render_extras(doc.extras, source, root, doc.path)
    return printable("\n".join(head + sections), lines=True)  # a bundle's machines, names, reasons: no terminal escape in a document


def _cross_figures(doc: Document, source: Any, root: Path) -> list[str]:
    """The manifest's cross-study pictures of the document's family (the SmolLM2 frontier of every compression study)."""
    import os

    from paretolab.results.crossplot import cross_points

    lines = []
    for figure in read_figures(root):
        if figure.family == doc.family and cross_points(source, list(doc.studies), figure.model):
            path = os.path.relpath(f"{figure.out}.png", Path(doc.path).parent)
            lines += [f"![{figure.model}: every compression study's trials, perplexity against size, one frontier]({path})", ""]
    return lines


def current_claims(root: Path, study: str, record: Any) -> None:
    """Judge the claims ``pipelines/STUDY.yaml`` states now, where the bundle ran that very pipeline otherwise.

    Claims are left out of the pipeline hash (a trial never reads them), so a claim stated more precisely after its
    study ran (``budget: tokens`` on a claim "at equal tokens") leaves the bundle current; the document then judges the
    stored trials against the claim as it now reads, and ``render --check`` calls it stale until it is re-rendered.
    A pipeline whose hash differs from the bundle's is another study: its claims are not applied to these trials."""
    from paretolab.data.yaml_read import read_yaml
    from paretolab.study.spec import pipeline_hash

    path = root / "pipelines" / f"{study}.yaml"
    stored = record.user_attrs.get("pipeline")
    if not path.is_file() or not isinstance(stored, dict):
        return
    try:
        now = read_yaml(path.read_text(encoding="utf-8"), str(path))
    except (OSError, ConfigError):
        return
    if not isinstance(now, dict) or pipeline_hash(now) != record.user_attrs.get("pipeline_hash"):
        return
    claims = {key: now[key] for key in ("claim", "claims") if key in now}
    if claims != {key: stored[key] for key in ("claim", "claims") if key in stored}:
        record.user_attrs["pipeline"] = {**{k: v for k, v in stored.items() if k not in ("claim", "claims")}, **claims}


def _default_metrics() -> list[str]:
    from paretolab.results import REPORT_METRICS

    return [m for m in REPORT_METRICS.split(",") if m]


def provenance_lines(provenance: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """**Provenance**: when the trials ran, the code that ran them, the code that judged them, the machines."""
    if not provenance:
        return [f"**Provenance.** Judged by the results code {judging_code()}; no study has a bundle yet.", ""]
    dates = sorted(d for _, p in provenance for d in (p.get("trials_from"), p.get("trials_to")) if d)
    codes = sorted({c for _, p in provenance for c in p.get("code_versions") or []})
    machines = sorted({m for _, p in provenance for m in p.get("machines") or []})
    lines = [
        "**Provenance.**",
        "",
        f"- Trials ran {_day(dates[0])} – {_day(dates[-1])} (UTC)." if dates else "- Trial dates: not recorded.",
        f"- Code that ran them: paretolab {', '.join(codes)}." if codes else "- Code that ran them: not recorded.",
        f"- Code that judged them: the results code {judging_code()} (a hash of paretolab's results, stats and claim syntax).",
        f"- Machines: {'; '.join(machines)}." if machines else "- Machines: not recorded by these trials.",
        *_load_line(provenance),
        "",
    ]
    return lines


def _load_line(provenance: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The machine's 1-minute load average while each study's trials ran (recorded since trials carry ``info.load_1m``).

    A timed study is meant to run alone (load ≲ 1 on two cores); a higher figure says its timings include contention.
    """
    loads = [(name, p["load_1m"]) for name, p in provenance if p.get("load_1m")]
    if not loads:
        return []
    parts = [f"{name} median {load['median']:.1f}, max {load['max']:.1f}" for name, load in loads]
    return [f"- Machine load (1-min average while its trials ran): {'; '.join(parts)}."]


def _day(iso: str) -> str:
    return iso[:16].replace("T", " ")
