"""The incumbent methods practitioners ship, run by their own libraries (never re-implemented here).

GPTQ, AWQ and SparseGPT through llm-compressor's ``oneshot`` (:mod:`.llmcompressor`), AutoRound through auto-round
(:mod:`.autoround`), HQQ through hqq (:mod:`.hqq`). The libraries live in one environment of their own,
``ENGINES/incumbents`` (``make incumbents``): their pins clash with paretolab's, so a trial hands the model over, runs
the library's tool script there and takes back the weights the library decompressed, with the bytes its artefact
stores (:mod:`paretolab.plugin_api.external`). Without that environment a trial fails with one line naming the library
and ``make incumbents``; the study goes on.

Every calibrated incumbent calibrates on the same draw as wanda and the other calibrated methods: the ``calib_*``
parameters (:mod:`paretolab.plugin_api.calibration`), handed to the library as token ids, in the order drawn.
"""

from __future__ import annotations

from collections.abc import Callable

from paretolab import Method, hookimpl
from paretolab.plugins.incumbents.autoround import AutoRoundMethod
from paretolab.plugins.incumbents.base import ENV, Incumbent
from paretolab.plugins.incumbents.hqq import HQQ
from paretolab.plugins.incumbents.llmcompressor import AWQ, GPTQ, SparseGPT

__all__ = ["AWQ", "ENV", "GPTQ", "HQQ", "AutoRoundMethod", "Incumbent", "SparseGPT"]


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    for method in (GPTQ(), AWQ(), SparseGPT(), AutoRoundMethod(), HQQ()):
        register(method)
