"""BitTokens: a number is one token whose embedding carries its IEEE-754 float64 bits; a 64-way sigmoid head decodes it.

Kreitner et al., "BitTokens: Efficient Numeracy in Language Models through Single-Token Number
Embeddings" (2025; code KreitnerL/BitTokens, ``networks/number_embedding_modules/bittoken_embedding.py``).
The paper's: every number becomes one ``<num>`` token; its input embedding is the learned ``<num>``
embedding plus the number's 64 float64 bits mapped to ±1 in the first 64 channels ("sum" combination),
optionally followed by the 64 bits of 1/x; a linear head on the last hidden state gives 64 logits,
trained with binary cross-entropy where the next token is a number, and decoded by thresholding at 0.
Ours: the test bed and baselines. A ``scratch-*`` model learns the ``numeric-train`` corpus
(:mod:`paretolab.training.arithmetic`: add, multiply, exact divide, compare on 0–99, direct answers)
under one of three number encodings, with the same problems in the same order and the same steps:
``bits`` (BitTokens), ``digit`` (one token per digit) and ``digit3`` (left-to-right groups of up to three
digits, GPT-4/Llama-3 style). Rows pack ``seq_len // 12`` whole problems and are padded to
``seq_len`` (pads are not scored), so every encoding sees the same problems per step at the same
FLOPs; what an encoding saves shows in ``tokens_per_problem``. The model keeps its vocabulary
(the encodings use its first ids); the subject gets the encoding's tokenizer. Not done: xVal,
the paper's frequency-weighted bit loss, negative and fractional numbers in the corpus (the codec
handles every float64; the problems hold non-negative integers).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch
from optuna.distributions import CategoricalDistribution

from paretolab import Method, Paper, TrialContext, hookimpl
from paretolab.errors import ConfigError
from paretolab.plugin_api.metrics import Metric
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.training.arithmetic import OPS, Problem, numeric_problems
from paretolab.training.hooks import TrainingHook, training_of

ENCODINGS = ("bits", "digit", "digit3")
BITS = 64
NUM = "<num>"
SPECIALS = ("<s>", "</s>", "<pad>", "<unk>")
SYMBOLS = ("\n", " ", "+", "*", "/", "?", "=", "<", ">", "-", ".")
NUMBER = re.compile(r"\d+")
MAX_LINE_TOKENS = 12  # the longest problem line in digit tokens ("99*99=9801\n" is 11) plus one spare
PAPER = Paper("BitTokens: Efficient Numeracy in Language Models through Single-Token Number Embeddings", "arXiv 2025",
              "https://github.com/KreitnerL/BitTokens")

METRICS = (
    Metric("exact_acc", "fraction", "maximize", "bittokens: held-out numeric-val problems whose greedy answer is exactly right, all four ops"),
    *(Metric(f"exact_acc_{op}", "fraction", "maximize", f"bittokens: exact-answer accuracy on held-out {op} problems") for op in OPS),
    Metric("exact_acc_stderr", "fraction", "minimize", "bittokens: standard error of exact_acc over the problems (sample std / sqrt(n))"),
    Metric("tokens_per_problem", "tokens", "minimize", "bittokens: mean tokens of a held-out problem line (prompt, answer, newline) under the encoding"),
)


# ---- the float64 codec (the paper's bit order: sign, 11 exponent bits, 52 fraction bits, most significant first)

_SHIFTS = torch.arange(BITS - 1, -1, -1, dtype=torch.int64)


def float_bits(x: torch.Tensor) -> torch.Tensor:
    """The 64 IEEE-754 bits (0/1, int64, most significant first) of each float64 in ``x``: shape (*x.shape, 64)."""
    return (x.to(torch.float64).view(torch.int64).unsqueeze(-1) >> _SHIFTS.to(x.device)) & 1


def bits_float(bits: torch.Tensor) -> torch.Tensor:
    """The float64 whose 64 bits (0/1, most significant first) are the last axis of ``bits``: the inverse of :func:`float_bits`."""
    shifts = _SHIFTS.to(bits.device)
    return (bits.to(torch.int64) << shifts).sum(-1).view(torch.float64)  # the sign bit's shift wraps to int64's sign: intended


def number_features(values: torch.Tensor, *, reciprocal: bool) -> torch.Tensor:
    """±1 bit pattern of each value (then of 1/value when ``reciprocal``): (*values.shape, 64 or 128), float32."""
    parts = [float_bits(values)]
    if reciprocal:
        parts.append(float_bits(values.to(torch.float64).reciprocal()))
    return torch.cat(parts, dim=-1).to(torch.float32) * 2 - 1


def decode_logits(logits: torch.Tensor) -> torch.Tensor:
    """The float64 values a number head's 64 logits stand for (a bit is 1 where its logit is > 0)."""
    return bits_float((logits > 0).to(torch.int64))


# ---- tokenizers: one vocabulary per encoding, ids from 0 (the model keeps its own, larger vocabulary)


def vocabulary(encoding: str) -> list[str]:
    """The encoding's tokens in id order."""
    if encoding == "bits":
        numbers = [NUM]
    elif encoding == "digit":
        numbers = [str(d) for d in range(10)]
    elif encoding == "digit3":
        numbers = [f"{n:0{width}d}" for width in (1, 2, 3) for n in range(10**width)]
    else:
        raise ConfigError(f"bittokens.encoding must be one of {', '.join(ENCODINGS)}; got {encoding!r}")
    return [*SPECIALS, *SYMBOLS, *numbers]


def number_tokenizer(encoding: str) -> Any:
    """A ``transformers`` fast tokenizer for ``encoding``: every symbol one token, numbers as the encoding says, anything else ``<unk>``."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(vocabulary(encoding))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    if encoding == "bits":
        backend.normalizer = normalizers.Replace(Regex(NUMBER.pattern), NUM)
        pattern = r"<num>|[\s\S]"
    else:
        pattern = r"\d{1,3}|[\s\S]" if encoding == "digit3" else r"[\s\S]"
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                                   name_or_path=f"numbers-{encoding}")


class Encoded:
    """Problem lines under one encoding: token ids and, for ``bits``, the value of every ``<num>`` token."""

    def __init__(self, encoding: str, tokenizer: Any) -> None:
        self.encoding, self.tokenizer = encoding, tokenizer
        self.num_id = tokenizer.convert_tokens_to_ids(NUM) if encoding == "bits" else -1

    def ids(self, texts: list[str]) -> list[list[int]]:
        return list(self.tokenizer(texts, add_special_tokens=False)["input_ids"])

    def values(self, text: str) -> list[float]:
        """The numbers of ``text`` in order: what its ``<num>`` tokens stand for."""
        return [float(n) for n in NUMBER.findall(text)]


# ---- the model side: number embedding in, number head out


def _embed(model: torch.nn.Module, ids: torch.Tensor, values: torch.Tensor | None, num_id: int, reciprocal: bool) -> torch.Tensor:
    """Token embeddings; at ``<num>`` positions plus the value's ±1 bits in the first 64 (128) channels (the paper's "sum")."""
    embeds = model.get_input_embeddings()(ids)
    if values is None or num_id < 0:
        return embeds
    mask = ids == num_id
    if not bool(mask.any()):
        return embeds
    feats = number_features(values[mask], reciprocal=reciprocal).to(embeds.dtype)
    extra = torch.zeros_like(embeds)
    extra[mask] = torch.nn.functional.pad(feats, (0, embeds.shape[-1] - feats.shape[-1]))
    return embeds + extra


def forward(model: torch.nn.Module, ids: torch.Tensor, values: torch.Tensor | None, *, num_id: int, reciprocal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, last hidden state) of ``ids`` with number values in the embedding."""
    out = model(inputs_embeds=_embed(model, ids, values, num_id, reciprocal), output_hidden_states=True)
    return out.logits, out.hidden_states[-1]


class NumberHook(TrainingHook):
    """Owns data and loss: rows of whole problems from ``numeric-train`` (seeded by the train stage), CE + the number head's BCE."""

    replaces = ("data", "loss")

    def __init__(self, encoding: str, reciprocal: bool, bit_weight: float) -> None:
        self.encoding, self.reciprocal, self.bit_weight = encoding, reciprocal, bit_weight

    def data(self, state: Any) -> Iterator[torch.Tensor]:
        enc = Encoded(self.encoding, state.subject.tokenizer)
        opts = state.params
        per_row = opts.seq_len // MAX_LINE_TOKENS
        if per_row < 1:
            raise ConfigError(f"train.seq_len: {opts.seq_len} is shorter than one problem line ({MAX_LINE_TOKENS} tokens); raise it to >= {MAX_LINE_TOKENS}")
        pad = state.subject.tokenizer.pad_token_id
        return self._rows(enc, opts.batch, opts.seq_len, per_row, pad, opts.seed, state)

    def _rows(self, enc: Encoded, batch: int, seq_len: int, per_row: int, pad: int, seed: int, state: Any) -> Iterator[torch.Tensor]:
        chunk = 0
        while True:  # an endless seeded stream of training problems, in chunks
            problems = numeric_problems(batch * per_row * 16, seed * 1_000 + chunk, heldout=False)
            chunk += 1
            for start in range(0, len(problems), batch * per_row):
                rows, values = [], []
                for r in range(batch):
                    text = "".join(p.line for p in problems[start + r * per_row : start + (r + 1) * per_row])
                    ids = enc.ids([text])[0][: seq_len + 1]
                    rows.append(ids + [pad] * (seq_len + 1 - len(ids)))
                    vals = iter(enc.values(text))
                    values.append([next(vals) if t == enc.num_id else 0.0 for t in rows[-1]])
                state.extra["number_values"] = torch.tensor(values, dtype=torch.float64, device=state.device)
                yield torch.tensor(rows, dtype=torch.long, device=state.device)

    def loss(self, model: torch.nn.Module, batch: torch.Tensor, state: Any) -> torch.Tensor:
        pad = state.subject.tokenizer.pad_token_id
        values = state.extra.get("number_values")
        num_id = Encoded(self.encoding, state.subject.tokenizer).num_id
        logits, hidden = forward(model, batch[:, :-1], None if values is None else values[:, :-1], num_id=num_id, reciprocal=self.reciprocal)
        targets = batch[:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=pad)
        if self.encoding == "bits" and values is not None:
            mask = targets == num_id
            if bool(mask.any()):
                bits = float_bits(values[:, 1:][mask]).to(torch.float32)
                loss = loss + self.bit_weight * torch.nn.functional.binary_cross_entropy_with_logits(model.number_head(hidden[mask]).float(), bits)
        return loss


class BitTokens(Method):
    """Give the subject BitTokens (one token per number, float64 bits in, a 64-bit head out); the next train stage learns numeric-train."""

    name = "bittokens"
    kind = "training"
    paper = PAPER
    cost_is = "real"
    metrics = tuple(m.name for m in METRICS)

    def search_space(self) -> dict[str, Any]:
        return {"reciprocal": CategoricalDistribution([False, True])}

    def defaults(self) -> dict[str, Any]:
        return {"reciprocal": False, "bit_weight": 1.0, "eval_problems": 400}

    def encoding(self, params: dict[str, Any]) -> str:
        return "bits"

    def transform(self, subject: Subject, params: dict[str, Any], ctx: TrialContext) -> Subject:
        p = {**self.defaults(), **params}
        encoding, reciprocal = self.encoding(p), bool(p.get("reciprocal", False))
        vocab = vocabulary(encoding)
        model = subject.model
        rows, hidden = model.get_input_embeddings().weight.shape
        if len(vocab) > rows:
            raise ConfigError(f"{self.name}: encoding {encoding} needs {len(vocab)} token ids; {subject.model_name}'s vocabulary has {rows}: "
                              "use a scratch-* model or another encoding")
        width = BITS * (2 if reciprocal else 1)
        if encoding == "bits" and hidden < width:
            raise ConfigError(f"bittokens: {width} bit channels do not fit the model's hidden size {hidden}; set reciprocal: false or use a wider model")
        if encoding == "bits":
            device = next(model.parameters()).device
            model.number_head = torch.nn.Linear(hidden, BITS, device=device)  # the paper's linear number head
            with torch.no_grad():  # seeded by the trial, drawn on the CPU (the train stage re-draws it with init: auto)
                weight = torch.randn(BITS, hidden, generator=ctx.generator(offset=19), device="cpu") * 0.02
                model.number_head.weight.copy_(weight.to(device))
                model.number_head.bias.zero_()
        subject.tokenizer = number_tokenizer(encoding)
        training_of(subject).attach(NumberHook(encoding, reciprocal, float(p.get("bit_weight", 1.0))), method=self.name)
        subject.info["bittokens"] = {"encoding": encoding, "reciprocal": reciprocal, "eval_problems": int(p["eval_problems"])}
        return subject

    def evaluate(self, subject: Subject, ctx: TrialContext) -> dict[str, float]:
        info = subject.info.get("bittokens")
        if not info:
            return {}
        problems = numeric_problems(int(info["eval_problems"]), 1, heldout=True)
        out = answer_accuracy(subject, problems, encoding=str(info["encoding"]), reciprocal=bool(info["reciprocal"]))
        right = out.pop("_right")  # per problem: stored, so exact_acc's verdicts count the problem-to-problem noise
        ctx.add_artifact(ARTIFACT, per_example_json("problem", {"exact_acc": right}))
        return {**out, **mean_with_stderr("exact_acc", right)}


@torch.no_grad()
def answer_accuracy(subject: Subject, problems: list[Problem], *, encoding: str, reciprocal: bool) -> dict[str, float]:
    """Exact-answer accuracy per op (greedy) and mean tokens per problem line under ``encoding``; ``_right``: 1/0 per problem."""
    enc = Encoded(encoding, subject.tokenizer)
    model, device = subject.model, subject.device
    model.eval()
    prompts = [f"{p.a}{p.op}{p.b}=" for p in problems]
    right = [_answer(model, enc, prompt, p, device, reciprocal) for prompt, p in zip(prompts, problems, strict=True)] if encoding != "bits" \
        else _bits_answers(model, enc, prompts, problems, device, reciprocal)
    out: dict[str, Any] = {"exact_acc": statistics.fmean(right) if right else 0.0, "_right": list(right)}
    for name, symbol in OPS.items():
        hits = [r for r, p in zip(right, problems, strict=True) if p.op == symbol]
        out[f"exact_acc_{name}"] = statistics.fmean(hits) if hits else 0.0
    out["tokens_per_problem"] = statistics.fmean(len(ids) for ids in enc.ids([p.line for p in problems]))
    return out


def _bits_answers(model: torch.nn.Module, enc: Encoded, prompts: list[str], problems: list[Problem], device: torch.device, reciprocal: bool) -> list[float]:
    """One batched forward: every bits prompt is four tokens (``<num> op <num> =``); the answer is one token."""
    ids = torch.tensor(enc.ids(prompts), device=device)
    values = torch.tensor([enc.values(t) for t in prompts], dtype=torch.float64, device=device)
    values = torch.stack([values[:, 0], torch.zeros_like(values[:, 0]), values[:, 1], torch.zeros_like(values[:, 0])], dim=1)
    logits, hidden = forward(model, ids, values, num_id=enc.num_id, reciprocal=reciprocal)
    token = logits[:, -1].argmax(-1).tolist()
    numbers = decode_logits(model.number_head(hidden[:, -1]).double()).tolist()
    right = []
    for p, t, x in zip(problems, token, numbers, strict=True):
        if p.op == "?":
            right.append(float(enc.tokenizer.convert_ids_to_tokens(t) == p.result))
        else:
            right.append(float(t == enc.num_id and x == float(p.result)))
    return right


def _answer(model: torch.nn.Module, enc: Encoded, prompt: str, problem: Problem, device: torch.device, reciprocal: bool) -> float:
    """Greedy digits until a newline (at most 6 tokens); right when the text equals the answer."""
    ids = enc.ids([prompt])[0]
    newline = enc.tokenizer.convert_tokens_to_ids("\n")
    new: list[int] = []
    for _ in range(6):
        logits, _ = forward(model, torch.tensor([ids + new], device=device), None, num_id=-1, reciprocal=reciprocal)
        token = int(logits[0, -1].argmax())
        if token == newline:
            break
        new.append(token)
    return float(enc.tokenizer.decode(new) == problem.result)


class DigitTokens(BitTokens):
    """The baselines: numbers as digit tokens, one digit per token (group 1) or left-to-right groups of up to three (group 3)."""

    name = "digit_tokens"
    paper = Paper("Baseline: digit tokenizations of numbers (single digits as in LLaMA-1; up to three digits as in GPT-4 / Llama 3)", "", "")

    def search_space(self) -> dict[str, Any]:
        return {"group": CategoricalDistribution([1, 3])}

    def defaults(self) -> dict[str, Any]:
        return {"group": 1, "eval_problems": 400}

    def encoding(self, params: dict[str, Any]) -> str:
        group = int(params["group"])
        if group not in (1, 3):
            raise ConfigError(f"digit_tokens.group must be 1 or 3 (digits per token), got {params['group']!r}")
        return "digit" if group == 1 else "digit3"


@hookimpl
def register_methods(register: Callable[[Method], None]) -> None:
    register(BitTokens())
    register(DigitTokens())


@hookimpl
def register_metrics(register: Callable[[Metric], None]) -> None:
    for metric in METRICS:
        register(metric)
