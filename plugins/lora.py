"""LoRA from the ``peft`` library: the fine-tuning baseline of ``plate``, optionally at PLATE's number of trainable parameters.

Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", ICLR 2022. The adapter is peft's
own (``peft.inject_adapter_in_model`` with a ``LoraConfig``: W x + (alpha/rank)·B A x, A Kaiming
-initialised, B zero), not written here. Ours: the targets are plate's (every Linear of the decoder
layers: q, k, v, o, gate, up, down); every other parameter is frozen (``requires_grad`` off, so the
``train`` stage's AdamW neither updates nor decays it); ``alpha: 0`` means 2·rank (common practice);
no dropout. With ``match_plate_r`` > 0 the rank is the one whose trainable count is nearest to what
``plate`` with ``r = match_plate_r``, ``col_tau = match_col_tau``, ``max_rank = match_max_rank`` trains on
this model (computed from the same weights; each rank adds Σ(in + out) over the targets), so a
study compares the two at the same number of trainable parameters; both report ``trainable_params``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from optuna.distributions import FloatDistribution, IntDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins.plate import (
    TARGETS,
    PlateSettings,
    plate_trainable_params,
    target_linears,
    trainable_count,
)

PAPER = Paper("LoRA: Low-Rank Adaptation of Large Language Models (peft implementation)", "ICLR 2022", "https://arxiv.org/abs/2106.09685")


def params_per_rank(model: torch.nn.Module) -> int:
    """Trainable parameters one LoRA rank adds over the targets: Σ (in + out)."""
    return sum(linear.in_features + linear.out_features for _, linear in target_linears(model))


def matching_rank(model: torch.nn.Module, target: int) -> int:
    """The LoRA rank whose trainable count is nearest to ``target`` (at least 1)."""
    per_rank = params_per_rank(model)
    return max(1, round(target / per_rank)) if per_rank else 1


class Lora(Method):
    """peft LoRA on the decoder Linears, everything else frozen; a later train stage trains it (the baseline of ``plate``)."""

    name = "lora"
    kind = "training"
    paper = PAPER
    cost_is = "real"
    metrics = ("trainable_params",)

    def search_space(self) -> dict[str, Any]:
        return {"rank": IntDistribution(1, 256, log=True), "alpha": FloatDistribution(0.0, 512.0)}

    def defaults(self) -> dict[str, Any]:
        return {"rank": 8, "alpha": 0.0, "match_plate_r": 0, "match_col_tau": 0.9, "match_max_rank": 512}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        from peft import LoraConfig, inject_adapter_in_model

        p = {**self.defaults(), **params}
        model = subject.model
        rank, alpha, match_r = int(p["rank"]), float(p["alpha"]), int(p["match_plate_r"])
        if match_r < 0:
            raise ConfigError(f"lora.match_plate_r must be >= 0 (0: use lora.rank), got {match_r}")
        if match_r:
            plate_count = plate_trainable_params(model, PlateSettings.of(
                {"r": match_r, "col_tau": p["match_col_tau"], "max_rank": p["match_max_rank"]}, where="lora.match"))
            rank = matching_rank(model, plate_count)
            subject.info["lora_matched_plate_params"] = plate_count
        if rank < 1:
            raise ConfigError(f"lora.rank must be >= 1, got {rank}")
        if alpha < 0:
            raise ConfigError(f"lora.alpha must be >= 0 (0: 2·rank), got {alpha}")
        present = sorted({name.rsplit(".", 1)[-1] for name, _ in target_linears(model)})
        if not present:
            raise ConfigError(f"lora: the model has no Linear named one of {', '.join(TARGETS)} to adapt")
        for param in model.parameters():
            param.requires_grad_(False)
        config = LoraConfig(r=rank, lora_alpha=alpha or 2.0 * rank, target_modules=present, lora_dropout=0.0, bias="none")
        with torch.device(subject.device):  # peft builds its Linears on the default device: make it the model's
            subject.model = inject_adapter_in_model(config, model)
        for name, param in subject.model.named_parameters():
            param.requires_grad_("lora_" in name)
        subject.info["lora_rank"] = rank
        subject.info["trainable_params"] = trainable_count(subject.model)
        return subject

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        return {"trainable_params": float(trainable_count(subject.model))}


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(Lora())
