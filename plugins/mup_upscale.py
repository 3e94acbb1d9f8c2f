"""μP width upscaling: widen a trained narrow Llama into a wider one that computes the same function, carry Adam's state, μP learning rates.

Ma et al., "μPscaling Small Models: Principled Warm Starts and Hyperparameter Transfer"
(official code: github.com/yuxinma98/mupscaling, ``src/weight_transfer/transfer.py`` and ``optim.py``;
read, not copied).

The paper's: every width dimension is widened by ``repeat_interleave`` (each neuron duplicated
r times); a weight whose fan-in grew is divided by the fan-in ratio, so each duplicated unit
receives exactly what the original did; the wide model's own μP initialisation is added as noise
that breaks the symmetry between duplicates (``noise`` scales it; 0 = an exact copy); Adam's
first moment is carried over scaled by the gradient ratio s and its second moment by s²; training
goes on with μP per-group learning rates (hidden matrices lr/r, weight decay ×r, Adam's ε scaled
with the gradients: the paper's fix to the mup package's MuAdamW). ``parametrization: sp`` is the
paper's standard-parametrisation comparison: the same function-preserving copy, SP-init noise
(``initializer_range`` for every matrix) and one learning rate for all parameters.

Ours (the paper's code is for GPT-2 with μP attention and mup's readout module; this is for HF
Llama classes): attention is widened by *duplicating heads* (head_dim fixed, so RoPE and the
1/√head_dim scale stay exact; key/value heads are duplicated too, keeping the GQA grouping); the
μP readout multiplier 1/r of a *tied* embedding/LM head is folded into the final RMSNorm's gain
(RMSNorm is invariant to duplicated features, so nothing else needs it); the noise is added after
the fan-in rescale with std ``noise`` × the target's μP init (``initializer_range`` × √(narrow
fan-in / wide fan-in) for matrices, ``initializer_range`` for embeddings, none for gains and an
untied head), where the paper adds it before the rescale; optimizer state is transformed by
name in ``training_of(subject).optimizer_state`` (the train stage carries it between stages), for
``sp`` the same way. The per-parameter factors follow one rule: a tensor duplicated n times and
multiplied by c gets gradients × s = 1/(n·c), learning rate × c, weight decay / c, ε × s — with
those, training the wide model without noise retraces the narrow one exactly.

The wide-from-scratch baseline is written ``none → mup_upscale → train``: a `random init` model
that no train stage has touched is widened like any other, and the next train stage (``init:
auto``) re-initialises it from its own seed, so it trains the wide model from scratch — with the
μP learning-rate groups (``mup``: the narrow model's lr transferred by μP's rules) or one lr (``sp``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.training.hooks import TrainingHook, training_of

PAPER = Paper("μPscaling Small Models: Principled Warm Starts and Hyperparameter Transfer", "arXiv 2025", "https://github.com/yuxinma98/mupscaling")
PARAMETRIZATIONS = ("mup", "sp")
WIDEN = ("both", "hidden", "intermediate")
SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")


@dataclass(frozen=True)
class Rule:
    """How one parameter widens: per dim (dim, ratio, block) duplications, the multiplier c, and its noise std."""

    dims: tuple[tuple[int, int, int], ...]  # repeat_interleave blocks of `block` rows along `dim`, `ratio` times
    c: float = 1.0  # the fan-in rescale (1/ratio of the input dim for matrices)
    noise_std: float = 0.0  # std of the target's init added as noise (before the `noise` factor)

    @property
    def copies(self) -> int:
        return math.prod(ratio for _, ratio, _ in self.dims)

    @property
    def grad_scale(self) -> float:
        """s = 1/(n·c): the wide gradient of each copy relative to the narrow gradient."""
        return 1.0 / (self.copies * self.c)


def expand(t: torch.Tensor, rule: Rule) -> torch.Tensor:
    """Duplicate ``t`` along each widened dim (whole blocks, e.g. attention heads, stay together)."""
    for dim, ratio, block in rule.dims:
        if ratio == 1:
            continue
        shape = list(t.shape)
        blocks = t.reshape(*shape[:dim], shape[dim] // block, block, *shape[dim + 1 :])
        t = blocks.repeat_interleave(ratio, dim=dim).reshape(*shape[:dim], shape[dim] * ratio, *shape[dim + 1 :])
    return t


def width_rules(model: torch.nn.Module, r_d: int, r_i: int, sp: bool) -> dict[str, Rule]:
    """The rule of every parameter of a Llama-style model widened by r_d (hidden, and heads) and r_i (intermediate)."""
    config = model.config
    d = config.hidden_size
    hd = getattr(config, "head_dim", None) or d // config.num_attention_heads
    sigma = float(getattr(config, "initializer_range", 0.02))
    tied = bool(getattr(config, "tie_word_embeddings", False))

    def matrix(out: tuple[int, int], inp: tuple[int, int]) -> Rule:
        r_in = inp[0]
        std = sigma if sp else sigma / math.sqrt(r_in)  # μP: init variance ∝ 1/fan-in, narrow width as the base
        return Rule(((0, *out), (1, *inp)), c=1.0 / r_in, noise_std=std)

    # Query heads widen as whole key/value groups: every copy of a key/value head then serves copies of
    # all the query heads it served, so the copies get equal gradients and stay copies under training.
    group = hd * (config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads))
    suffixes = {
        "self_attn.q_proj.weight": matrix((r_d, group), (r_d, 1)),
        "self_attn.k_proj.weight": matrix((r_d, hd), (r_d, 1)),
        "self_attn.v_proj.weight": matrix((r_d, hd), (r_d, 1)),
        "self_attn.o_proj.weight": matrix((r_d, 1), (r_d, group)),
        "mlp.gate_proj.weight": matrix((r_i, 1), (r_d, 1)),
        "mlp.up_proj.weight": matrix((r_i, 1), (r_d, 1)),
        "mlp.down_proj.weight": matrix((r_d, 1), (r_i, 1)),
        "self_attn.q_proj.bias": Rule(((0, r_d, group),)),
        "self_attn.k_proj.bias": Rule(((0, r_d, hd),)),
        "self_attn.v_proj.bias": Rule(((0, r_d, hd),)),
        "self_attn.o_proj.bias": Rule(((0, r_d, 1),)),
        "mlp.gate_proj.bias": Rule(((0, r_i, 1),)),
        "mlp.up_proj.bias": Rule(((0, r_i, 1),)),
        "mlp.down_proj.bias": Rule(((0, r_d, 1),)),
    }
    rules: dict[str, Rule] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        rule = next((r for suffix, r in suffixes.items() if name.endswith("." + suffix)), None)
        if name == "model.embed_tokens.weight":
            rule = Rule(((1, r_d, 1),), noise_std=sigma)  # fan-in is the vocabulary: no rescale (μP input weights)
        elif name == "lm_head.weight":
            rule = Rule(((1, r_d, 1),)) if tied else Rule(((1, r_d, 1),), c=1.0 / r_d)  # tied: its 1/r lives in the final norm
        elif name == "model.norm.weight":
            rule = Rule(((0, r_d, 1),), c=1.0 / r_d if tied else 1.0)  # the μP readout multiplier of a tied head
        elif rule is None and param.dim() == 1 and param.shape[0] == d:
            rule = Rule(((0, r_d, 1),))  # a gain over the hidden features (RMSNorm, or a method's norm)
        elif rule is None and param.numel() == 1:
            rule = Rule(())  # a scalar (e.g. a learnable temperature): copied
        if rule is None:
            raise ConfigError(f"mup_upscale: no width rule for parameter {name!r} of shape {tuple(param.shape)}; it supports Llama-style decoders")
        rules[name] = rule
    return rules


def wide_config(config: Any, r_d: int, r_i: int) -> Any:
    """The narrow config with hidden size, head counts and intermediate size widened (head_dim kept)."""
    wide = copy.deepcopy(config)
    hd = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    wide.hidden_size = config.hidden_size * r_d
    wide.num_attention_heads = config.num_attention_heads * r_d
    wide.num_key_value_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    wide.num_key_value_heads *= r_d
    wide.head_dim = hd
    wide.intermediate_size = config.intermediate_size * r_i
    return wide


def upscale_model(model: torch.nn.Module, rules: dict[str, Rule], r_d: int, r_i: int, noise: float, generator: torch.Generator) -> torch.nn.Module:
    """A new model of the same class at the wide config: c·expand(W) + noise·N(0, std²) for every parameter."""
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    with torch.random.fork_rng(devices=[]), torch.device(device):  # its random init is overwritten below: keep the global RNG as it was
        wide = type(model)(wide_config(model.config, r_d, r_i)).to(dtype)
    wide.generation_config = copy.deepcopy(getattr(model, "generation_config", None))
    wide_params = dict(wide.named_parameters(remove_duplicate=False))
    done: set[int] = set()
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights once
            rule, target = rules[name], wide_params[name]
            value = expand(param.detach(), rule) * rule.c
            if noise > 0 and rule.noise_std > 0:
                draw = torch.randn(value.shape, generator=generator, device="cpu", dtype=torch.float32)
                value = value + (noise * rule.noise_std * draw).to(device=device, dtype=value.dtype)
            if tuple(value.shape) != tuple(target.shape):
                raise ConfigError(f"mup_upscale: {name} widens to {tuple(value.shape)} but the wide model has {tuple(target.shape)}")
            target.copy_(value)
            done.add(id(target))
        missing = [n for n, p in wide_params.items() if id(p) not in done]
        if missing:
            raise ConfigError(f"mup_upscale: the wide model has parameters the narrow one lacks: {', '.join(missing[:3])}")
        narrow_buffers = dict(model.named_buffers())
        for name, buffer in wide.named_buffers():  # rotary frequencies depend on head_dim only: copy them as they were
            if name in narrow_buffers and narrow_buffers[name].shape == buffer.shape:
                buffer.copy_(narrow_buffers[name])
    wide.train(model.training)
    return wide


def upscale_optimizer_state(state: dict[str, dict[str, torch.Tensor]], rules: dict[str, Rule]) -> dict[str, dict[str, torch.Tensor]]:
    """Adam's state by parameter name, widened like its parameter: first moments × s, second moments × s²."""
    out: dict[str, dict[str, torch.Tensor]] = {}
    for name, entries in state.items():
        rule = rules.get(name)
        if rule is None:
            raise ConfigError(f"mup_upscale: optimizer state for {name!r}, which the model does not have")
        s = rule.grad_scale
        widened = {}
        for key, value in entries.items():
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                widened[key] = value  # the step count
            else:
                widened[key] = expand(value, rule) * (s * s if key in SECOND_MOMENTS else s)
        out[name] = widened
    return out


@dataclass
class MuPGroups(TrainingHook):
    """μP per-group learning rates for the wide model: lr × c, weight decay / c, Adam's ε × s (per parameter name)."""

    c: dict[str, float] = field(default_factory=dict, repr=False)  # parameter name -> weight multiplier = lr multiplier
    s: dict[str, float] = field(default_factory=dict, repr=False)  # parameter name -> gradient scale = Adam ε multiplier

    def compose(self, rules: dict[str, Rule]) -> None:
        """Fold a further widening into the factors (two upscales multiply)."""
        for name, rule in rules.items():
            self.c[name] = self.c.get(name, 1.0) * rule.c
            self.s[name] = self.s.get(name, 1.0) * rule.grad_scale

    def param_groups(self, groups: list[dict[str, Any]], state: Any) -> list[dict[str, Any]]:
        """Split each group by (c, s); a group's ``names`` list (the train stage keeps one) is split with its params."""
        names = {id(p): n for n, p in state.model.named_parameters()}
        base_lr, base_wd = float(getattr(state.params, "lr", 1e-3)), float(getattr(state.params, "weight_decay", 0.0))  # the stage's options
        out = []
        for group in groups:
            split: dict[tuple[float, float], list[tuple[str, torch.nn.Parameter]]] = {}
            for param in group["params"]:
                name = names.get(id(param), "")
                split.setdefault((self.c.get(name, 1.0), self.s.get(name, 1.0)), []).append((name, param))
            for (c, s), members in split.items():
                new = {**group, "params": [p for _, p in members]}
                if "names" in group:
                    new["names"] = [n for n, _ in members]
                new["lr"] = float(group.get("lr", base_lr)) * c
                new["eps"] = float(group.get("eps", 1e-8)) * s
                new["weight_decay"] = float(group.get("weight_decay", base_wd)) / c
                out.append(new)
        return out



class MupUpscale(Method):
    """Widen the model (hidden and/or intermediate width ×factor) preserving its function; μP lr groups for what follows."""

    name = "mup_upscale"
    kind = "architecture"
    paper = PAPER
    cost_is = "real"

    def search_space(self) -> dict[str, Any]:
        return {
            "factor": IntDistribution(2, 4),
            "noise": FloatDistribution(0.0, 2.0),
            "parametrization": CategoricalDistribution(list(PARAMETRIZATIONS)),
            "widen": CategoricalDistribution(list(WIDEN)),
        }

    def defaults(self) -> dict[str, Any]:
        return {"factor": 2, "noise": 1.0, "parametrization": "mup", "widen": "both"}

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        factor, noise, how, widen = int(p["factor"]), float(p["noise"]), str(p["parametrization"]), str(p["widen"])
        if factor < 1:
            raise ConfigError(f"mup_upscale.factor must be an integer >= 1 (the width multiplier), got {p['factor']}")
        if noise < 0 or not math.isfinite(noise):
            raise ConfigError(f"mup_upscale.noise must be >= 0 (0 = an exact copy of the narrow function), got {p['noise']}")
        if how not in PARAMETRIZATIONS:
            raise ConfigError(f"mup_upscale.parametrization must be one of {', '.join(PARAMETRIZATIONS)}; got {how!r}")
        if widen not in WIDEN:
            raise ConfigError(f"mup_upscale.widen must be one of {', '.join(WIDEN)}; got {widen!r}")
        decoder_layers(subject.model)
        r_d = factor if widen in ("both", "hidden") else 1
        r_i = factor if widen in ("both", "intermediate") else 1
        rules = width_rules(subject.model, r_d, r_i, sp=how == "sp")
        narrow = subject.model.config.hidden_size, subject.model.config.intermediate_size
        subject.model = upscale_model(subject.model, rules, r_d, r_i, noise, ctx.generator(offset=97))
        training = training_of(subject)
        training.optimizer_state = upscale_optimizer_state(training.optimizer_state, rules)
        if how == "mup":
            hooks = training.of_type(MuPGroups)
            hook = hooks[0] if hooks else training.attach(MuPGroups(), method=self.name)
            hook.compose(rules)
        subject.info["mup_upscale"] = {
            "parametrization": how, "factor": factor, "noise": noise, "widen": widen,
            "hidden": [narrow[0], subject.model.config.hidden_size], "intermediate": [narrow[1], subject.model.config.intermediate_size],
        }
        return subject


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(MupUpscale())
