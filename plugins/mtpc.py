"""MTPC: multi-token drafting heads built as probabilistic circuits over the next tokens, verified exactly.

Grivas, Loconte, van Krieken, ..., Vergari, "Multi-token prediction with probabilistic circuits"
(2025; code april-tools/mtpc, ``mtp/mheads/``). The paper's: heads on a frozen language model give a
joint distribution over the next H tokens as a circuit: fully factorised (independent heads), a
mixture of R fully factorised components (CP), an HMM, or tree/tensor-network variants; the heads
are fitted by maximum likelihood on the model's own outputs and draft for speculative decoding, so
the output is the verifier's. Ours: the circuit is over a window (x_{t+1}, ..., x_{t+H}) given the
frozen model's last hidden state h_t: component s at offset i emits softmax(U(h_t + P_{i,s} h_t)) with
U the model's frozen unembedding and P_{i,s} a zero-initialised D×D map; the mixture weights come
from a linear map of h_t; the HMM adds learned, input-independent S×S transitions per offset
(``mixture`` is the HMM with identity transitions, ``independent`` is one component). At inference
x_{t+1} is the verifier's own (bonus) token, so it is *conditioned on* as evidence — the tractable
conditioning circuits give — and the k = H - 1 drafts follow by greedy sequential decoding inside
the circuit (each chosen token is evidence for the next). Training data: the frozen model's own
greedy continuations of prompts from the training part of ``distill_corpus`` (every window target is
what greedy decoding emits); exact log-likelihood by the forward algorithm; AdamW for ``steps``
steps. Drafts are verified by :class:`paretolab.plugins.speculative.generator.SpeculativeGenerator`
(one verify loop; the output is greedy's, token for token). Not done: tree/tensor-train circuits,
partial layer sharing, byte-level models, sampling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from optuna.distributions import CategoricalDistribution, IntDistribution
from torch import nn

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.plugins._layerwise import decoder_layers
from paretolab.plugins.speculative import compare_with_greedy
from paretolab.plugins.speculative.corpus import heldout_prompts, training_sequences
from paretolab.plugins.speculative.generator import SpeculativeGenerator

CIRCUITS = ("independent", "mixture", "hmm")
PAPER = Paper("Multi-token prediction with probabilistic circuits", "arXiv 2025", "https://github.com/april-tools/mtpc")
SPEC_METRICS = ("mean_accepted_len", "spec_decode_tok_s", "greedy_decode_tok_s", "greedy_kernel_decode_tok_s", "speedup_vs_greedy", "spec_matches_greedy")  # registered by speculative
METRICS = (
    Metric("mtpc_heldout_nll", "nats/window", "minimize", "mtpc: negative log-likelihood of held-out greedy windows (x_{t+1..t+H}) under the circuit"),
    Metric("mtpc_train_s", "s", "minimize", "mtpc: wall time to generate the distillation data and fit the circuit heads"),
)


class CircuitHeads(nn.Module):
    """p(x_{t+1..t+H} | h_t) as an HMM over S components; ``transitions=False`` makes it a mixture, S = 1 independent heads."""

    def __init__(self, hidden: int, horizon: int, states: int, *, transitions: bool, device: torch.device | None = None) -> None:
        super().__init__()
        self.horizon, self.states = horizon, states
        self.proj = nn.Parameter(torch.zeros(horizon, states, hidden, hidden, device=device))  # zero: every emission starts as next-token
        self.prior = nn.Linear(hidden, states, device=device)
        self.trans = nn.Parameter(torch.zeros(max(horizon - 1, 0), states, states, device=device)) if transitions else None

    def emissions(self, h: torch.Tensor, unembed: torch.Tensor) -> torch.Tensor:
        """log p(x_i = v | z_i = s, h): (N, H, S, V)."""
        z = h[:, None, None, :] + torch.einsum("nd,ised->nise", h, self.proj)
        return F.linear(z, unembed).log_softmax(-1)

    def log_prior(self, h: torch.Tensor) -> torch.Tensor:
        return self.prior(h).log_softmax(-1)  # (N, S)

    def step(self, alpha: torch.Tensor, i: int) -> torch.Tensor:
        """Carry the log forward message from offset i to i + 1 (identity for a mixture)."""
        if self.trans is None:
            return alpha
        return torch.logsumexp(alpha[:, :, None] + self.trans[i].log_softmax(-1)[None], dim=1)

    def log_likelihood(self, h: torch.Tensor, targets: torch.Tensor, unembed: torch.Tensor) -> torch.Tensor:
        """log p(targets | h) by the forward algorithm: targets (N, H) -> (N,)."""
        z = h[:, None, None, :] + torch.einsum("nd,ised->nise", h, self.proj)
        logits = F.linear(z, unembed)  # (N, H, S, V): only the target's logit and the normaliser are kept
        picked = logits.gather(-1, targets[:, :, None, None].expand(-1, -1, self.states, 1)).squeeze(-1) - logits.logsumexp(-1)  # (N, H, S)
        alpha = self.log_prior(h) + picked[:, 0]
        for i in range(1, self.horizon):
            alpha = self.step(alpha, i - 1) + picked[:, i]
        return torch.logsumexp(alpha, dim=-1)

    @torch.no_grad()
    def draft(self, h: torch.Tensor, first: int, k: int, unembed: torch.Tensor) -> list[int]:
        """Condition on x_{t+1} = ``first``, then choose x_{t+2}, ... one by one, each the argmax of its marginal given the tokens before."""
        emit = self.emissions(h[None], unembed)[0]  # (H, S, V)
        alpha = self.log_prior(h[None])[0] + emit[0, :, first]
        out: list[int] = []
        for i in range(1, min(k + 1, self.horizon)):
            alpha = self.step(alpha[None], i - 1)[0]
            token = int(torch.logsumexp(alpha[:, None] + emit[i], dim=0).argmax())
            out.append(token)
            alpha = alpha + emit[i, :, token]
        return out


class CircuitDrafter:
    """A :class:`~paretolab.plugins.speculative.generator.Drafter`: reads the target's last decoder layer, drafts from the circuit."""

    def __init__(self, heads: CircuitHeads, last_layer: int) -> None:
        self.heads = heads.eval()
        self.feature_layers = (last_layer,)
        self.modules = (self.heads,)  # the generator runs their linears through the CPU kernel too
        self.norm: nn.Module | None = None
        self.unembed: torch.Tensor | None = None
        self.h: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "norm": None, "unembed": None, "h": None}  # a copied subject re-reads its own target

    def start(self, target: nn.Module) -> None:
        self.norm = final_norm(target)
        self.unembed = target.get_output_embeddings().weight
        self.h = None

    def propose(self, ids: list[int], features: torch.Tensor | None, k: int) -> list[int]:
        assert self.norm is not None and self.unembed is not None, "start() must be called before propose()"
        if features is None or features.shape[0] == 0:
            raise ValueError("the MTPC drafter needs the target's last hidden state of the newest verified position")
        h = self.norm(features[-1:].to(self.unembed.dtype))[0]  # the state whose LM-head output was ids[-1]
        return self.heads.draft(h, ids[-1], k, self.unembed) if k > 0 else []


def final_norm(model: nn.Module) -> nn.Module:
    """The model's final norm before the LM head (Llama-style ``model.model.norm``), or the identity."""
    norm = getattr(getattr(model, "model", None), "norm", None)
    return norm if isinstance(norm, nn.Module) else nn.Identity()


@torch.no_grad()
def greedy_windows(subject: Subject, *, corpus: str, prompts: int, prompt_tokens: int, new_tokens: int, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(h, targets): the frozen model's final hidden state at each generated position and the next ``horizon`` greedy tokens after it."""
    sequences = training_sequences(subject.tokenizer, corpus=corpus, seq_len=prompt_tokens, max_tokens=prompts * prompt_tokens)
    saved, subject.generator = subject.generator, None
    try:
        out = generate(subject, sequences.tolist(), max_new_tokens=new_tokens)
    finally:
        subject.generator = saved
    model, device = subject.model, subject.device
    hs, targets = [], []
    for prompt, new in zip(sequences.tolist(), out.sequences, strict=True):
        seq = prompt + new
        hidden = model(input_ids=torch.tensor([seq], device=device), output_hidden_states=True).hidden_states[-1][0]
        for t in range(len(prompt) - 1, len(seq) - horizon):  # targets are all greedy output: the model's own next tokens
            hs.append(hidden[t])
            targets.append(seq[t + 1 : t + 1 + horizon])
    if not hs:
        raise ConfigError(f"mtpc: no training window: raise mtpc.gen_tokens ({new_tokens}) above the horizon ({horizon})")
    return torch.stack(hs).float(), torch.tensor(targets, device=device)


class MTPC(Method):
    """Fit circuit drafting heads on the frozen subject (distilled from its greedy outputs) and install the speculative generator."""

    name = "mtpc"
    kind = "decoding"
    paper = PAPER
    cost_is = "real"
    metrics = (*SPEC_METRICS, *(m.name for m in METRICS))

    def search_space(self) -> dict[str, Any]:
        return {"circuit": CategoricalDistribution(list(CIRCUITS)), "k": IntDistribution(1, 8), "states": IntDistribution(1, 16)}

    def defaults(self) -> dict[str, Any]:
        return {
            "circuit": "mixture", "k": 3, "states": 4, "steps": 40, "batch": 128, "lr": 3e-3, "seed": 0,
            "distill_corpus": "pydoc", "gen_prompts": 8, "gen_prompt_tokens": 16, "gen_tokens": 24,
            "prompts": 3, "prompt_tokens": 32, "new_tokens": 24, "prompt_corpus": "pydoc",
        }

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        circuit, k, states = str(p["circuit"]), int(p["k"]), int(p["states"])
        if circuit not in CIRCUITS:
            raise ConfigError(f"mtpc.circuit must be one of {', '.join(CIRCUITS)}; got {circuit!r}")
        if not 1 <= k <= 16:
            raise ConfigError(f"mtpc.k (draft tokens per step) must be between 1 and 16, got {k}")
        if states < 1:
            raise ConfigError(f"mtpc.states must be >= 1, got {states}")
        states = 1 if circuit == "independent" else states
        start = time.perf_counter()
        model = subject.model
        for param in model.parameters():
            param.requires_grad_(False)  # frozen verifier
        horizon = k + 1
        h, targets = greedy_windows(subject, corpus=str(p["distill_corpus"]), prompts=int(p["gen_prompts"]),
                                    prompt_tokens=int(p["gen_prompt_tokens"]), new_tokens=int(p["gen_tokens"]), horizon=horizon)
        held = max(1, h.shape[0] // 10)  # the last tenth of the windows (the last prompts' continuations) is held out
        hidden = h.shape[-1]
        with torch.random.fork_rng(devices=[]):  # nn.Linear draws from the global RNG: seed it here, restore it after
            torch.manual_seed(int(p["seed"]) + ctx.seed)
            heads = CircuitHeads(hidden, horizon, states, transitions=circuit == "hmm", device=subject.device)
        unembed = model.get_output_embeddings().weight.detach()
        fit(heads, h[:-held], targets[:-held], unembed, steps=int(p["steps"]), batch=int(p["batch"]), lr=float(p["lr"]),
            generator=torch.Generator(device="cpu").manual_seed(int(p["seed"]) + ctx.seed))
        with torch.no_grad():
            nll = float(-heads.log_likelihood(h[-held:], targets[-held:], unembed).mean())
        subject.generator = SpeculativeGenerator(CircuitDrafter(heads, len(decoder_layers(model)) - 1), k)
        subject.info["mtpc"] = {"circuit": circuit, "k": k, "states": states, "heldout_nll": nll, "train_s": time.perf_counter() - start,
                                "windows": int(h.shape[0]),
                                "measure": {key: p[key] for key in ("prompts", "prompt_tokens", "new_tokens", "prompt_corpus")}}
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        info = subject.info.get("mtpc")
        return {"mtpc_heldout_nll": info["heldout_nll"]} if info else {}

    def measure(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        info = subject.info.get("mtpc")
        if not info or not isinstance(subject.generator, SpeculativeGenerator):
            return {}
        m = info["measure"]
        prompts = heldout_prompts(subject.tokenizer, corpus=str(m["prompt_corpus"]), n=int(m["prompts"]), length=int(m["prompt_tokens"]))
        return {**compare_with_greedy(subject, prompts, int(m["new_tokens"]), ctx=ctx), "mtpc_train_s": info["train_s"]}


def fit(heads: CircuitHeads, h: torch.Tensor, targets: torch.Tensor, unembed: torch.Tensor, *, steps: int, batch: int, lr: float,
        generator: torch.Generator) -> list[float]:
    """Maximum likelihood of the windows (AdamW, minibatches drawn from ``generator``); returns the loss per step."""
    optimizer = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    heads.train()
    with torch.enable_grad():
        for _ in range(steps):
            pick = torch.randint(h.shape[0], (min(batch, h.shape[0]),), generator=generator, device="cpu").to(h.device)
            loss = -heads.log_likelihood(h[pick], targets[pick], unembed).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    heads.eval()
    return losses


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(MTPC())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)
