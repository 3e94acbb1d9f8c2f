"""The ``tiny-moe`` test bed: a Qwen3-MoE trained here from scratch by the ``train`` stage's loop, cached once.

No pretrained MoE checkpoint can be installed on this machine, so the test bed is one we train.
It is trained from scratch, not upcycled from a dense model: experts copied from one dense MLP
stay near-copies after a short training, which makes every expert-compression method look free
and hides the gaps between them; experts trained from scratch on a mixed corpus (code, prose,
arithmetic: :mod:`paretolab.plugins.moe.corpus`) come out with hot and nearly idle experts and a
spread of effective ranks, which is what the methods' importance scores are about.

``paretolab models pull tiny-moe`` runs :func:`paretolab.training.loop.train` (AdamW, warm-up +
cosine, FLOPs counted by the loop's counter over the real sparse expert compute) with the
router's load-balancing loss added (Qwen3-MoE's own ``aux_loss``, coefficient 0.001 as in its
config) and a progress line every 25 steps, then saves the model under
``cache_dir()/models/tiny-moe`` with what it did in ``paretolab.json``. ``tiny-moe-random`` is
the same class at 2 layers, random weights and no training: for tests.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from paretolab.data import cache_dir, load_corpus
from paretolab.errors import ConfigError
from paretolab.models import ModelSource, load_pretrained, seeded
from paretolab.plugin_api.subject import Subject
from paretolab.training.hooks import TrainingHook, training_of

TRAIN_CORPUS, VAL_CORPUS = "moe-mix-train", "moe-mix-val"


@dataclass(frozen=True)
class MoeShape:
    """A Qwen3-MoE architecture: every layer sparse, top-k routing with renormalised weights."""

    hidden: int
    layers: int
    heads: int
    experts: int
    top_k: int
    expert_inner: int  # each expert's SwiGLU width
    aux_coef: float = 0.001  # Qwen3-MoE's default router_aux_loss_coef: balances a little, leaves hot and idle experts

    def config(self, tokenizer: Any, vocab_size: int | None = None) -> Any:
        from transformers import Qwen3MoeConfig

        from paretolab.training.tokenizer import VOCAB_SIZE

        return Qwen3MoeConfig(
            vocab_size=vocab_size or VOCAB_SIZE, hidden_size=self.hidden, intermediate_size=4 * self.hidden, moe_intermediate_size=self.expert_inner,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.heads,
            head_dim=self.hidden // self.heads, num_experts=self.experts, num_experts_per_tok=self.top_k, norm_topk_prob=True,
            decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=self.aux_coef, output_router_logits=False,
            max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            attn_implementation="sdpa", dtype="float32",
        )


@dataclass(frozen=True)
class Budget:
    """The training of ``pull``: the loop's options (see TrainOptions)."""

    tokens: int = 2_500_000
    seq_len: int = 128
    batch: int = 16
    lr: float = 3.0e-3
    eval_every: int = 50
    eval_tokens: int = 16384
    seed: int = 0
    max_minutes: float = 120.0  # a guard: on a busy machine the token budget is what should end it


class MoeHook(TrainingHook):
    """Adds the router's load-balancing loss to next-token cross-entropy, and prints progress (stderr) every 25 steps."""

    replaces = ("loss",)

    def __init__(self, coef: float, *, every: int = 25, stream: Any = None) -> None:
        self.coef, self.every, self.stream = coef, every, stream
        self.start = time.perf_counter()

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor:
        out = model(input_ids=batch[:, :-1], output_router_logits=True)
        logits = out.logits.float()
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        return ce + self.coef * out.aux_loss if out.aux_loss is not None else ce

    def after_step(self, state: Any) -> None:
        if self.stream is None or state.step % self.every:
            return
        elapsed = time.perf_counter() - self.start
        left = elapsed / state.step * max(0, state.max_steps - state.step)
        print(f"tiny-moe: step {state.step}/{state.max_steps}, {state.tokens:,} tokens, loss {state.last_loss:.3f}, "
              f"{elapsed / 60:.1f} min, ~{left / 60:.0f} min left", file=self.stream, flush=True)


class TinyMoe(ModelSource):
    """A Qwen3-MoE of a fixed shape on the pystdlib BPE tokenizer; ``pull`` trains it once on ``moe-mix-train`` and caches it."""

    def __init__(self, name: str, shape: MoeShape, budget: Budget | None, note: str = "") -> None:
        from paretolab.training.tokenizer import VOCAB_SIZE

        self.name, self.shape, self.budget = name, shape, budget
        self.vocab_size = VOCAB_SIZE  # the pystdlib BPE tokenizer its config is built on
        s = shape
        what = (f"Qwen3-MoE ({s.layers} layers, hidden {s.hidden}, {s.experts} experts of SwiGLU {s.expert_inner}, top-{s.top_k}, "
                f"vocab 4096 byte-level BPE)")
        if budget is None:
            self.weights = "random init"
            self.description = f"random-init {what}, seeded 0{note}"
        else:
            self.weights = "fp32 (trained here)"
            self.description = (f"{what} trained from scratch here on {TRAIN_CORPUS} (code + prose + arithmetic) by "
                                f"`paretolab models pull {name}`, {budget.tokens:,} tokens, seed {budget.seed}{note}")

    @property
    def cache_path(self) -> Path:
        return cache_dir() / "models" / self.name

    def is_cached(self) -> bool:
        return self.budget is None or (self.cache_path / "paretolab.json").is_file()

    def check(self) -> None:
        if not self.is_cached():
            raise ConfigError(f"model {self.name!r} is not trained on this machine yet; run `paretolab models pull {self.name}` "
                              f"once (it trains the model: {self.budget.tokens:,} tokens)")  # type: ignore[union-attr]

    def random_subject(self) -> Subject:
        """The untrained model, seeded (for tests and as the start of ``pull``)."""
        from transformers import Qwen3MoeForCausalLM

        from paretolab.training.tokenizer import pystdlib_tokenizer

        tokenizer = pystdlib_tokenizer()
        with seeded(0):
            model = Qwen3MoeForCausalLM(self.shape.config(tokenizer))
        model.eval()
        return Subject(model=model, tokenizer=tokenizer, model_name=self.name)

    def load(self) -> Subject:
        if self.budget is None:
            return self.random_subject()
        return load_pretrained(self.pull(), self.name)

    def pull(self, *, stream: Any = sys.stderr) -> str:
        if self.budget is None or self.is_cached():
            return str(self.cache_path)
        return str(self.train_and_save(self.budget, stream=stream))

    def train_and_save(self, budget: Budget, *, stream: Any = None, target: Path | None = None) -> Path:
        """Train the random model with ``budget`` by the train stage's loop and save it (atomically) at ``target``."""
        from paretolab.training.loop import train
        from paretolab.training.method import TrainOptions

        target = target or self.cache_path
        subject = self.random_subject()
        opts = TrainOptions(tokens=budget.tokens, seq_len=budget.seq_len, batch=budget.batch, lr=budget.lr, eval_every=budget.eval_every,
                            eval_tokens=budget.eval_tokens, seed=budget.seed, corpus=TRAIN_CORPUS, init="keep", max_minutes=budget.max_minutes)
        training_of(subject).attach(MoeHook(self.shape.aux_coef, stream=stream), method="tiny-moe")
        if stream is not None:
            print(f"tiny-moe: training {self.description}", file=stream, flush=True)
        ctx = SimpleNamespace(stage="pull", cpus=0, deadline=None)
        start = time.perf_counter()
        metrics = train(subject, opts, ctx, val_corpus=VAL_CORPUS)
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subject.model.save_pretrained(tmp, safe_serialization=True)
        subject.tokenizer.save_pretrained(tmp)
        record = {"shape": vars(self.shape) if hasattr(self.shape, "__dict__") else str(self.shape), "budget": vars(budget),
                  "train_corpus": TRAIN_CORPUS, "train_corpus_sha256": load_corpus(TRAIN_CORPUS)[1], "val_corpus": VAL_CORPUS,
                  "metrics": metrics, "val_ppl": math.exp(metrics["val_loss"]), "wall_s": time.perf_counter() - start,
                  "stopped_by": subject.info.get("train_stopped_by"), "torch_threads": torch.get_num_threads(),
                  "curve": training_of(subject).curve, "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "paretolab.json").write_text(json.dumps(record, indent=1, default=str))  # last: marks a complete save
        if target.exists():
            shutil.rmtree(target)
        tmp.replace(target)
        if stream is not None:
            print(f"tiny-moe: saved {target} (val_loss {metrics['val_loss']:.3f}, {record['wall_s'] / 60:.1f} min)", file=stream, flush=True)
        return target


# The issue asks for hidden 256 x 6 layers (~20M parameters); on this shared 2-core machine that shape ran at ~100 tokens/s
# (20 s per 2,048-token step under load), too slow to train in the time there was, so `tiny-moe` is the smaller shape and
# `tiny-moe-20m` keeps the (pull it where there is time: same code, ~30x the compute).
TINY_MOE = MoeShape(hidden=128, layers=4, heads=4, experts=8, top_k=2, expert_inner=192)
SOURCES = (
    TinyMoe("tiny-moe", TINY_MOE, Budget()),
    TinyMoe("tiny-moe-20m", MoeShape(hidden=256, layers=6, heads=4, experts=8, top_k=2, expert_inner=448), Budget(tokens=3_000_000)),
    TinyMoe("tiny-moe-random", replace(TINY_MOE, layers=2), None, "; for tests"),
)


MICRO_MOE = MoeShape(hidden=32, layers=2, heads=2, experts=4, top_k=2, expert_inner=48)


def micro_moe(seed: int = 0) -> Subject:
    """A random 2-layer Qwen3-MoE (4 experts, hidden 32) on the byte tokenizer: the MoE methods' unit tests run on it in milliseconds."""
    from transformers import Qwen3MoeForCausalLM

    from paretolab.models import byte_tokenizer

    tokenizer = byte_tokenizer()
    with seeded(seed):
        model = Qwen3MoeForCausalLM(MICRO_MOE.config(tokenizer, vocab_size=len(tokenizer)))
    model.eval()
    return Subject(model=model, tokenizer=tokenizer, model_name="micro-moe")
