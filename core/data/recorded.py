"""Recorded outputs of expensive model calls: computed once, stored under a content key, replayed afterwards.

One mechanism for every recording (parallel_probe's branch traces, the routing studies' answers):
the key is a hash over everything that changes the output — the model's weights and config
(:func:`model_fingerprint`), the prompts, the decoding settings, the recorder's own format
version (``code``: bumped when the recording procedure changes) and the torch / transformers
versions — so a changed setting is a cache miss and records anew. Recordings are gzip JSON
under ``$PARETOLAB_CACHE/<kind>``. Whatever a trial computes from a replayed recording is
*replayed* cost, not measured in that trial: callers label it so.

The code version is the recorder's format constant, not the git commit: a commit that does not
touch the recorder must not throw away 45 minutes of recording.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from paretolab.data import cache_dir


def model_fingerprint(model: torch.nn.Module) -> str:
    """A hash of the model's config and every parameter and buffer (any weight change shows)."""
    digest = hashlib.blake2b(digest_size=16)
    config = getattr(model, "config", None)
    digest.update(json.dumps(config.to_dict() if config is not None else {}, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # hashed in place, no copy
    return digest.hexdigest()


def record_key(material: dict[str, Any], *, code: int, length: int = 24) -> str:
    """The key of a recording: a hash over ``material`` (model, prompts, settings), the recorder's ``code`` version and the library versions."""
    import transformers

    full = {**material, "format": code, "torch": torch.__version__, "transformers": transformers.__version__}
    return hashlib.sha256(json.dumps(full, sort_keys=True, default=str).encode()).hexdigest()[:length]


def record_path(kind: str, key: str) -> Path:
    return cache_dir() / kind / f"{key}.json.gz"


def load_or_record(kind: str, key: str, compute: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """The JSON recording under ``kind``/``key`` from the cache, else ``compute()`` stored now; (data, was_cached).

    ``PARETOLAB_RECORD_ANEW=1`` ignores cached recordings (the contract's device check must run the model).
    """
    path = record_path(kind, key)
    if path.is_file() and not os.environ.get("PARETOLAB_RECORD_ANEW"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle), True
    data = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.part")
    with gzip.open(tmp, "wt", encoding="utf-8") as handle:
        json.dump(data, handle)
    tmp.replace(path)  # atomic: concurrent recorders of the same key write identical content
    return data, False
