"""A method's own artefact (a GGUF, a compressed-tensors checkpoint): the file its library wrote, kept beside the weights
the trial evaluates, so that an engine serves it as it is and ``paretolab export`` ships it.

A method records it once (:func:`record`, or ``take_back(..., kind=...)`` for a tool run in another environment); the
trial drops it when a later stage changes the model (:func:`after_stage`: the file would no longer be the model
measured); the engine measure asks for a kind it serves natively (:func:`served`); the export copies it
(:func:`copy_artifact`). What is recorded lives in ``subject.info`` as plain strings, so the trial's record says it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

KINDS = ("gguf", "compressed-tensors", "auto_round", "hqq")
"""What an artefact may be: llama.cpp's GGUF (served by llama.cpp as is), a compressed-tensors checkpoint (vLLM, transformers),
auto-round's and HQQ's own formats (shipped by the export; no engine here serves them)."""
PATH, KIND, BY, STAGE, DROPPED = "artifact", "artifact_kind", "artifact_by", "artifact_stage", "artifact_dropped"


def record(subject: Any, path: Path, kind: str, *, method: str, stage: str = "") -> None:
    """Say that ``path`` (a file or a folder the method's library wrote) stores the subject's weights as ``kind``."""
    if kind not in KINDS:
        raise ValueError(f"artifact kind {kind!r}: one of {', '.join(KINDS)}")
    if not Path(path).exists():
        raise FileNotFoundError(f"{method}: its artefact {path} does not exist")
    subject.info.update({PATH: str(path), KIND: kind, BY: method, STAGE: stage})
    subject.info.pop(DROPPED, None)


def after_stage(subject: Any, stage: str, method: Any) -> None:
    """Drop an artefact an earlier stage recorded once stage ``stage`` (``method``) may have changed the model after it."""
    if PATH not in subject.info or subject.info.get(STAGE) == stage or getattr(method, "preserves_output", False):
        return
    subject.info[DROPPED] = (f"{subject.info.get(BY)}'s {subject.info.get(KIND)} artefact: stage {stage!r} ({method.name}) "
                             "changed the model after it, so the file no longer stores the model measured")
    for key in (PATH, KIND, BY, STAGE):
        subject.info.pop(key, None)


def served(subject: Any, kind: str) -> Path | None:
    """The artefact's path when the subject has one of ``kind`` that still exists, else None."""
    path = subject.info.get(PATH)
    if subject.info.get(KIND) != kind or not path or not Path(path).exists():
        return None
    return Path(path)


def describe(subject: Any) -> str:
    """``"kquant's gguf"``, or "" when the subject has no artefact."""
    return f"{subject.info[BY]}'s {subject.info[KIND]}" if PATH in subject.info else ""


def copy_artifact(subject: Any, dest: Path) -> Path | None:
    """Copy the subject's artefact (file or folder) under ``dest`` (kept name); returns the copy, or None without one."""
    path = subject.info.get(PATH)
    if not path or not Path(path).exists():
        return None
    src = Path(path)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / src.name
    if src.is_dir():
        shutil.copytree(src, target, symlinks=False)
    else:
        shutil.copyfile(src, target)
    return target


def artifact_info(subject: Any) -> dict[str, Any]:
    """The recorded fields, for a record that outlives the trial's folder (the export's ``paretolab.json``)."""
    return {k: subject.info[k] for k in (PATH, KIND, BY, STAGE, DROPPED) if k in subject.info}
