"""mtpc: circuits are normalised joints, conditioning on the verifier's token helps a mixture, and drafting keeps greedy's output."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from paretolab.generation import generate
from paretolab.models import TinyLlama
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.method import Method
from paretolab.plugins.mtpc import MTPC, CircuitHeads, fit
from paretolab.plugins.speculative.generator import SpeculativeGenerator
from paretolab.testing import MethodContract

SMALL = {"steps": 5, "batch": 32, "gen_prompts": 2, "gen_prompt_tokens": 8, "gen_tokens": 12, "prompts": 2, "prompt_tokens": 16, "new_tokens": 8,
         "distill_corpus": "numeric-val", "prompt_corpus": "numeric-val"}  # a small corpus: tokenizing pydoc dominates otherwise


@pytest.mark.parametrize("circuit", ["independent", "mixture", "hmm"])
def test_circuit_is_a_normalised_joint(circuit: str) -> None:
    torch.manual_seed(0)
    hidden, vocab, horizon = 4, 5, 3
    heads = CircuitHeads(hidden, horizon, 1 if circuit == "independent" else 3, transitions=circuit == "hmm")
    with torch.no_grad():
        heads.proj.normal_(0, 0.5)
        if heads.trans is not None:
            heads.trans.normal_()
    unembed, h = torch.randn(vocab, hidden), torch.randn(hidden)
    windows = torch.tensor(list(itertools.product(range(vocab), repeat=horizon)))
    total = heads.log_likelihood(h.expand(len(windows), -1), windows, unembed).logsumexp(0)
    assert float(total.detach()) == pytest.approx(0.0, abs=1e-5)  # the probabilities of all V^H windows sum to one


def test_conditioning_on_the_first_token_lets_a_mixture_draft_what_independent_heads_cannot() -> None:
    # two equally likely futures, "1 2" and "3 4": given the verifier's first token a mixture knows the second
    hidden, vocab = 8, 6
    unembed, h = torch.eye(vocab, hidden) * 3, torch.zeros(16, hidden)
    h[:, 6] = 1.0  # a constant state: the future is ambiguous from h alone
    targets = torch.tensor([[1, 2], [3, 4]] * 8)
    drafts = {}
    for circuit, states in (("independent", 1), ("mixture", 2)):
        torch.manual_seed(0)
        heads = CircuitHeads(hidden, 2, states, transitions=False)
        with torch.no_grad():
            heads.prior.weight.normal_()
            heads.proj.normal_(0, 0.3)
        fit(heads, h, targets, unembed, steps=40, batch=16, lr=0.2, generator=torch.Generator().manual_seed(0))
        drafts[circuit] = [heads.draft(h[0], first, 1, unembed) for first in (1, 3)]
    assert drafts["mixture"] == [[2], [4]]
    assert drafts["independent"][0] == drafts["independent"][1]  # one guess whatever the first token was


@pytest.mark.parametrize("circuit", ["independent", "mixture", "hmm"])
def test_speculative_output_is_greedy_output(circuit: str, tmp_path: Any) -> None:
    subject = TinyLlama(layers=2, hidden=64).load()
    prompts = [[5, 9, 2, 7], [1, 2, 3, 4, 5, 6, 7, 8], [40, 41, 42]]
    greedy = generate(subject, prompts, max_new_tokens=20).sequences
    drafted = MTPC().transform(subject, {**SMALL, "circuit": circuit, "k": 3, "states": 2}, TrialContext(seed=0, workdir=tmp_path))
    assert isinstance(drafted.generator, SpeculativeGenerator)
    out = generate(drafted, prompts, max_new_tokens=20)
    assert [list(map(int, s)) for s in out.sequences] == [list(map(int, s)) for s in greedy]
    assert 1.0 <= out.stats["mean_accepted_len"] <= 4.0


class TestMTPCContract(MethodContract):
    @pytest.fixture
    def method(self) -> Method:
        return MTPC()

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return {**SMALL, "circuit": "hmm", "k": 2, "states": 2}
