"""The two networks: a liquid time-constant network (the continuous-depth baseline) and its CoDA replacement.

LTC (Hasani et al., AAAI 2021), our PyTorch code of its standard form with fully connected synapses:
each of ``units`` neurons has a membrane state ``v`` with

    cm dv/dt = gleak (vleak - v) + sum_j w_j s_j (E_j - v),   s_j = sigmoid(sigma_j (v_pre_j - mu_j))

over its synapses from every neuron and every input, solved by the paper's fused semi-implicit Euler
step ``unfolds`` times per observation. Each unfold evaluates ``units^2`` sigmoid synapses: this
nonlinear ODE solve is the cost CoDA removes.

CoDA (ICML 2026, seed 002), as we read its abstract (the official code, ImpactLabASU/CoDA-ICML2026,
could not be fetched here): by Mori-Zwanzig/Koopman theory the continuous-depth layer is replaced by a
compact GRU (the memory term: the history's effect on the resolved variables), one low-dimensional
linear ODE ``dz/dt = A z + u(t)`` driven by the GRU's projected state (the Markovian Koopman part),
solved exactly between observations with the zero-order-hold matrix exponential, and a dense layer
reading ``[z, h]``. The linear ODE costs one ``latent x latent`` product per observation; over a whole
sequence it is one contraction with the powers of ``exp(A)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def _uniform(shape: tuple[int, ...], low: float, high: float, g: torch.Generator, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, device=device).uniform_(low, high, generator=g))


def seeded_(module: nn.Module, g: torch.Generator) -> nn.Module:
    """Re-initialise ``module``'s parameters from ``g`` alone (PyTorch's own init reads the global RNG): U(+-1/sqrt(fan_in))."""
    with torch.no_grad():
        for param in module.parameters():
            fan = param.shape[-1] if param.dim() > 1 else param.shape[0]
            bound = 1.0 / math.sqrt(max(1, fan))
            param.copy_(torch.empty(param.shape, device=param.device).uniform_(-bound, bound, generator=g))
    return module


class LTC(nn.Module):
    """An LTC layer over a sequence: (batch, time, inputs) -> the last membrane state (batch, units)."""

    def __init__(self, inputs: int, units: int, unfolds: int, g: torch.Generator, device: torch.device) -> None:
        super().__init__()
        self.units, self.unfolds = units, unfolds
        self.gleak, self.vleak, self.cm = (_uniform((units,), a, b, g, device) for a, b in ((0.001, 1.0), (-0.2, 0.2), (0.4, 0.6)))
        self.w, self.sigma, self.mu = (_uniform((units, units), a, b, g, device) for a, b in ((0.001, 1.0), (3.0, 8.0), (0.3, 0.8)))
        self.erev = nn.Parameter(torch.randint(0, 2, (units, units), generator=g, device=device).float() * 2 - 1)
        self.in_w, self.in_sigma, self.in_mu = (_uniform((inputs, units), a, b, g, device) for a, b in ((0.001, 1.0), (3.0, 8.0), (0.3, 0.8)))
        self.in_erev = nn.Parameter(torch.randint(0, 2, (inputs, units), generator=g, device=device).float() * 2 - 1)
        self.in_scale, self.in_shift = nn.Parameter(torch.ones(inputs, device=device)), nn.Parameter(torch.zeros(inputs, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.in_scale + self.in_shift
        # Input synapses do not depend on v: their terms for every step at once, (batch, time, units).
        act_in = F.softplus(self.in_w) * torch.sigmoid(self.in_sigma * (x.unsqueeze(-1) - self.in_mu))
        num_in, den_in = (act_in * self.in_erev).sum(-2), act_in.sum(-2)
        w, gleak = F.softplus(self.w), F.softplus(self.gleak)
        cm_t = F.softplus(self.cm) * self.unfolds  # cm / (elapsed / unfolds), one time unit per observation
        leak = gleak * self.vleak
        v = torch.zeros(x.shape[0], self.units, device=x.device, dtype=x.dtype)
        for t in range(x.shape[1]):
            for _ in range(self.unfolds):
                act = w * torch.sigmoid(self.sigma * (v.unsqueeze(-1) - self.mu))  # (batch, pre, post)
                num = cm_t * v + leak + (act * self.erev).sum(1) + num_in[:, t]
                den = cm_t + gleak + act.sum(1) + den_in[:, t]
                v = num / (den + 1e-8)
        return v


class CoDA(nn.Module):
    """GRU (memory) + one linear ODE of ``latent`` dimensions (exact ZOH solve) over a sequence -> ``[z_T, h_T]``."""

    def __init__(self, inputs: int, units: int, latent: int, g: torch.Generator, device: torch.device) -> None:
        super().__init__()
        self.gru = seeded_(nn.GRU(inputs, units, batch_first=True, device=device), g)
        self.drive = seeded_(nn.Linear(units, latent, device=device), g)
        # A starts stable (eigenvalues near -0.5) so exp(A t) decays; training may move it anywhere.
        self.a = nn.Parameter(-0.5 * torch.eye(latent, device=device) + 0.1 * torch.randn(latent, latent, generator=g, device=device))
        self.latent = latent

    def transition(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(Phi, Gamma) of one observation step: z' = Phi z + Gamma u for a drive u held over the step."""
        r = self.latent
        block = torch.zeros(2 * r, 2 * r, device=self.a.device, dtype=self.a.dtype)
        block[:r, :r] = self.a
        block[:r, r:] = torch.eye(r, device=self.a.device, dtype=self.a.dtype)
        m = torch.linalg.matrix_exp(block)
        return m[:r, :r], m[:r, r:]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(x)
        u = self.drive(h)  # (batch, time, latent)
        phi, gamma = self.transition()
        steps = x.shape[1]
        # z_T = sum_t Phi^(T-1-t) Gamma u_t: the powers once, then one contraction over time.
        powers = [gamma]
        for _ in range(steps - 1):
            powers.append(phi @ powers[-1])
        kernel = torch.stack(powers[::-1])  # (time, latent, latent): kernel[t] = Phi^(T-1-t) Gamma
        z = torch.einsum("tij,btj->bi", kernel, u)
        return torch.cat([z, h[:, -1]], dim=-1)


class SequenceNet(nn.Module):
    """A sequence layer and a dense readout: logits (classification) or one value (regression)."""

    def __init__(self, layer: nn.Module, width: int, outputs: int, g: torch.Generator, device: torch.device) -> None:
        super().__init__()
        self.layer, self.readout = layer, seeded_(nn.Linear(width, outputs, device=device), g)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.readout(self.layer(x))


def build(arch: str, inputs: int, outputs: int, *, units: int, unfolds: int, latent: int, seed: int, device: torch.device) -> SequenceNet:
    """``arch`` ``ltc`` or ``coda``, initialised from ``seed`` alone."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    if arch == "ltc":
        return SequenceNet(LTC(inputs, units, unfolds, g, torch.device("cpu")), units, outputs, g, torch.device("cpu")).to(device)
    if arch == "coda":
        return SequenceNet(CoDA(inputs, units, latent, g, torch.device("cpu")), units + latent, outputs, g, torch.device("cpu")).to(device)
    raise ValueError(f"arch: expected ltc or coda, got {arch!r}")
