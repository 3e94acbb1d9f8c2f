"""Generation tasks: GSM8K, generated arithmetic, and any question/answer jsonl, scored by exact answer.

Every task builds one prompt per example, calls :func:`paretolab.generation.generate` (so a
decoding method's generator is used), reads an answer out of each continuation and reports
``acc`` (with ``acc_stderr`` over ``n_examples``, per-example hits kept as ``per_example.json``) plus the cost of generating: ``tokens_total`` and ``tokens_sequential`` (means per
example), ``decode_tok_s`` and ``prefill_ms`` (of this generation), and the generator's own stats.

Prompts (``prompt:``): ``chat`` puts ``shots`` worked examples as earlier user/assistant turns
of the tokenizer's chat template and stops at end of sequence; ``fewshot`` writes them as plain
``Question: ...\\nAnswer: ...`` blocks, each worked answer on one line, and stops at the first
newline; ``auto`` (default) is ``chat`` when the tokenizer has a chat template and ``fewshot``
otherwise. Worked examples end with "The answer is N." so the model learns where to put its
answer. On SmolLM2-135M-Instruct, greedy, arithmetic level 1, 16 problems: chat 4-shot 16/16,
fewshot 4-shot 12/16 (measured here, fewshot before its answers were put on one line), and
level 3 chat 4-shot 5/16; hence ``auto``.

Answer rule (numeric tasks): cut the text at a new ``Question:``; the first number after the last
"answer is" or "####" is the answer, else the last number in the text; ``$`` and thousands
commas are dropped and numbers compared by value (``18.00`` == ``18``). Text answers (a QA file
with non-numeric answers) compare the first line after the last "answer is", lowercased,
without punctuation or articles.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from paretolab.data import encode, read_jsonl
from paretolab.errors import ConfigError
from paretolab.generation import generate
from paretolab.plugin_api.context import TrialContext
from paretolab.plugin_api.hookspec import hookimpl
from paretolab.plugin_api.options import option
from paretolab.plugin_api.subject import Subject
from paretolab.stats import ARTIFACT, mean_with_stderr, per_example_json
from paretolab.tasks.base import Task

PROMPTS = ("auto", "chat", "fewshot")
_MARKER = re.compile(r"answer is|####", re.IGNORECASE)
_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True)
class Example:
    question: str
    solution: str  # a worked answer ending in "The answer is <answer>." (used for shots)
    answer: str


# --- answers ---------------------------------------------------------------------------------


def canonical_number(text: str) -> str | None:
    """A number as a canonical string (``"$1,000.00"`` -> ``"1000"``), or None."""
    cleaned = text.replace("$", "").replace(",", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    if value == value.to_integral_value():
        return str(int(value))
    return format(value.normalize(), "f")


def extract_number(text: str) -> str | None:
    """The numeric answer in a continuation (see the module docstring for the rule)."""
    text = text.split("Question:")[0]
    marks = list(_MARKER.finditer(text))
    if marks:
        after = _NUMBER.search(text, marks[-1].end())
        if after:
            return canonical_number(after.group())
    numbers = _NUMBER.findall(text)
    return canonical_number(numbers[-1]) if numbers else None


def extract_text(text: str) -> str | None:
    """A free-text answer: the first line after the last "answer is", normalised."""
    text = text.split("Question:")[0]
    marks = list(_MARKER.finditer(text))
    region = text[marks[-1].end():] if marks else text
    line = region.strip().split("\n")[0].lower()
    line = line.translate(str.maketrans("", "", string.punctuation))
    words = [w for w in line.split() if w not in ("a", "an", "the")]
    return " ".join(words) or None


# --- prompts ---------------------------------------------------------------------------------


def prompt_ids(tokenizer: Any, example: Example, shots: list[Example], style: str) -> list[int]:
    """Token ids of the prompt for ``example`` after the worked ``shots``."""
    if style == "chat":
        messages: list[dict[str, str]] = []
        for shot in shots:
            messages += [{"role": "user", "content": shot.question}, {"role": "assistant", "content": shot.solution}]
        messages.append({"role": "user", "content": example.question})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)
    # one line per worked answer: a fewshot continuation ends at its first newline
    text = "".join(f"Question: {s.question}\nAnswer: {_one_line(s.solution)}\n\n" for s in shots)
    return encode(tokenizer, text + f"Question: {example.question}\nAnswer:")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def resolve_style(tokenizer: Any, style: str) -> str:
    if style not in PROMPTS:
        raise ConfigError(f"task.prompt must be one of {', '.join(PROMPTS)}; got {style!r}")
    if style == "auto":
        return "chat" if getattr(tokenizer, "chat_template", None) else "fewshot"
    if style == "chat" and not getattr(tokenizer, "chat_template", None):
        raise ConfigError("task.prompt: 'chat' needs a tokenizer with a chat template; this one has none, use 'fewshot'")
    return style


def stop_ids(tokenizer: Any, style: str) -> list[int]:
    """Ids that end a continuation: end of sequence, and for ``fewshot`` any token holding a newline."""
    stops = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    if style == "fewshot":
        stops |= tokens_containing(tokenizer, "\n")
    return sorted(stops)


_TOKENS_CONTAINING: dict[tuple[int, int, str], frozenset[int]] = {}


def tokens_containing(tokenizer: Any, text: str) -> frozenset[int]:
    """Ids of every vocabulary token whose decoded text contains ``text`` (cached per tokenizer)."""
    key = (id(tokenizer), len(tokenizer), text)
    if key not in _TOKENS_CONTAINING:
        _TOKENS_CONTAINING[key] = frozenset(i for i in range(len(tokenizer)) if text in tokenizer.decode([i]))
    return _TOKENS_CONTAINING[key]


# --- tasks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationOptions:
    limit: int = option(50, low=0)  # examples evaluated (0 = all)
    max_new_tokens: int = option(256, low=1)  # per example (per branch, for methods that decode several)
    prompt: str = option("auto", one_of=("auto", "chat", "fewshot"))  # see the module docstring
    shots: int = option(4, low=0)  # worked examples shown before each question


class GenerationTask(Task):
    """Prompt, generate through the subject's generator, extract answers, score exact match."""

    metrics = ("acc", "acc_stderr", "n_examples", "tokens_total", "tokens_sequential", "decode_tok_s", "prefill_ms")
    options: type = GenerationOptions

    def examples(self, options: Any) -> tuple[list[Example], list[Example]]:
        """(shots, evaluated examples)."""
        raise NotImplementedError

    def answer_parser(self, options: Any) -> Callable[[str], str | None]:
        """How an answer is read from generated text (numeric unless a task says otherwise)."""
        return extract_number

    def evaluate(self, subject: Subject, options: Any, ctx: TrialContext) -> dict[str, float]:
        if options.max_new_tokens < 1:
            raise ConfigError(f"task.max_new_tokens must be >= 1, got {options.max_new_tokens}")
        if options.shots < 0:
            raise ConfigError(f"task.shots must be >= 0, got {options.shots}")
        shots, examples = self.examples(options)
        if not examples:
            raise ConfigError(f"task {self.name!r} has no examples to evaluate (limit={options.limit})")
        tok = subject.tokenizer
        style = resolve_style(tok, options.prompt)
        prompts = [prompt_ids(tok, ex, shots, style) for ex in examples]
        out = generate(subject, prompts, max_new_tokens=options.max_new_tokens, stop_ids=stop_ids(tok, style), ctx=ctx)
        parse = self.answer_parser(options)
        texts = [tok.decode(seq, skip_special_tokens=True) for seq in out.sequences]
        hits = [float(parse(text) == parse_gold(parse, ex.answer)) for text, ex in zip(texts, examples)]
        n = len(examples)
        metrics = {
            **mean_with_stderr("acc", hits),
            "n_examples": float(n),
            "tokens_total": out.tokens_total / n,
            "tokens_sequential": out.tokens_sequential / n,
            "decode_tok_s": out.tokens_total / out.decode_s if out.decode_s > 0 else 0.0,
            "prefill_ms": 1000 * out.prefill_s / n,
        }
        metrics.update(out.stats)
        ctx.add_artifact(f"{self.name}_samples.txt", _samples(examples, texts, parse))
        ctx.add_artifact(ARTIFACT, per_example_json("example", {"acc": hits}))
        return metrics


def parse_gold(parse: Callable[[str], str | None], answer: str) -> str | None:
    """The gold answer under the same rule (a bare gold answer reads as "The answer is <gold>")."""
    return parse(f"The answer is {answer}")


def _samples(examples: list[Example], texts: list[str], parse: Callable[[str], str | None], n: int = 20) -> str:
    blocks = []
    for ex, text in list(zip(examples, texts))[:n]:
        blocks.append(f"Q: {ex.question}\ngold: {ex.answer}  parsed: {parse(text)}\n---\n{text}\n")
    return "\n=====\n".join(blocks)


def _split(rows: list[Example], options: Any) -> tuple[list[Example], list[Example]]:
    shots, rest = rows[: options.shots], rows[options.shots :]
    return shots, rest[: options.limit] if options.limit else rest


@dataclass(frozen=True)
class Gsm8kOptions(GenerationOptions):
    dataset: str = option("gsm8k", data="file")  # gsm8k (looked up under the data dir) or a path to a jsonl in its format


class Gsm8k(GenerationTask):
    """GSM8K test questions; the answer follows ``####``. The first ``shots`` rows are the worked examples."""

    name = "gsm8k"
    options = Gsm8kOptions

    def examples(self, options: Any) -> tuple[list[Example], list[Example]]:
        rows = []
        for i, row in enumerate(read_jsonl(options.dataset, folder="gsm8k")):
            if "####" not in str(row.get("answer", "")) or "question" not in row:
                raise ConfigError(f"task.dataset {options.dataset!r}: row {i + 1} needs `question` and an `answer` with '#### N'")
            work, gold = row["answer"].rsplit("####", 1)
            work = re.sub(r"<<[^>]*>>", "", work).strip()
            gold = gold.strip().replace(",", "")
            rows.append(Example(row["question"], f"{work}\nThe answer is {gold}.", gold))
        return _split(rows, options)


@dataclass(frozen=True)
class QAOptions(GenerationOptions):
    dataset: str = option("", data="file")  # a jsonl path (or a name under the data dir) whose rows have `question` and `answer`
    answer: str = option("auto", one_of=("number", "text", "auto"))  # number | text | auto (number when every gold answer is a number)


class QA(GenerationTask):
    """Any jsonl with ``question``/``answer`` fields; the first ``shots`` rows are the worked examples."""

    name = "qa"
    options = QAOptions

    def examples(self, options: Any) -> tuple[list[Example], list[Example]]:
        return _split(_qa_rows(options.dataset), options)

    def answer_parser(self, options: Any) -> Callable[[str], str | None]:
        if options.answer not in ("number", "text", "auto"):
            raise ConfigError(f"task.answer must be number, text or auto; got {options.answer!r}")
        kind = options.answer
        if kind == "auto":
            numeric = all(canonical_number(ex.answer.strip()) is not None for ex in _qa_rows(options.dataset))
            kind = "number" if numeric else "text"
        return extract_number if kind == "number" else extract_text


@lru_cache(maxsize=4)
def _qa_rows(dataset: str) -> list[Example]:
    if not dataset:
        raise ConfigError("task.dataset: the qa task needs a jsonl path with `question` and `answer` fields")
    rows = []
    for i, row in enumerate(read_jsonl(dataset, folder="qa")):
        if "question" not in row or "answer" not in row:
            raise ConfigError(f"task.dataset {dataset!r}: row {i + 1} has keys {sorted(row)}; needs `question` and `answer`")
        answer = str(row["answer"]).strip()
        rows.append(Example(str(row["question"]), f"The answer is {answer}.", answer))
    return rows


@dataclass(frozen=True)
class ArithmeticOptions(GenerationOptions):
    level: int = option(1, low=1, high=5)  # 1: a+b (one digit)  2: ab±c  3: a+b-c  4: a*b+c  5: ab+cd (see ARITHMETIC_LEVELS)
    seed: int = 0  # problems are drawn from random.Random(f"arithmetic-{seed}-{level}")
    max_new_tokens: int = option(64, low=1)


ARITHMETIC_LEVELS = {
    1: "a + b, one-digit operands",
    2: "a two-digit number plus or minus a one-digit number",
    3: "a + b - c, one-digit operands (two steps)",
    4: "a * b + c, one-digit factors, c up to 20 (two steps)",
    5: "two two-digit numbers added",
}


def arithmetic_problem(rng: random.Random, level: int) -> Example:
    """One problem at ``level`` with a worked solution."""
    d = lambda: rng.randint(2, 9)  # noqa: E731
    if level == 1:
        a, b = d(), d()
        return _worked(f"{a} + {b}", [f"{a} + {b} = {a + b}."], a + b)
    if level == 2:
        a, b, plus = rng.randint(10, 99), d(), rng.random() < 0.5
        value = a + b if plus else a - b
        expr = f"{a} {'+' if plus else '-'} {b}"
        return _worked(expr, [f"{expr} = {value}."], value)
    if level == 3:
        a, b, c = d(), d(), d()
        return _worked(f"{a} + {b} - {c}", [f"{a} + {b} = {a + b}.", f"{a + b} - {c} = {a + b - c}."], a + b - c)
    if level == 4:
        a, b, c = d(), d(), rng.randint(2, 20)
        return _worked(f"{a} * {b} + {c}", [f"{a} * {b} = {a * b}.", f"{a * b} + {c} = {a * b + c}."], a * b + c)
    if level == 5:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return _worked(f"{a} + {b}", [f"{a} + {b} = {a + b}."], a + b)
    raise ConfigError(f"task.level must be one of {sorted(ARITHMETIC_LEVELS)}, got {level}")


def _worked(expr: str, steps: list[str], value: int) -> Example:
    return Example(f"What is {expr}?", " ".join(steps) + f" The answer is {value}.", str(value))


class Arithmetic(GenerationTask):
    """Generated arithmetic at a difficulty ``level``, seeded; needs no files."""

    name = "arithmetic"
    options = ArithmeticOptions

    def examples(self, options: Any) -> tuple[list[Example], list[Example]]:
        if options.limit < 1:
            raise ConfigError(f"task.limit must be >= 1 for arithmetic (problems are generated), got {options.limit}")
        shots_rng = random.Random(f"arithmetic-shots-{options.level}")  # shots do not move with the seed
        shots = [arithmetic_problem(shots_rng, options.level) for _ in range(options.shots)]
        rng = random.Random(f"arithmetic-{options.seed}-{options.level}")
        return shots, [arithmetic_problem(rng, options.level) for _ in range(options.limit)]


def answer_parser(ctx: TrialContext | None) -> Callable[[str], str | None]:
    """The answer rule of the trial's task (``ctx.task``); numeric when the task has none."""
    from paretolab.plugin_api.manager import registries
    from paretolab.plugin_api.options import parse_options

    task_cfg = dict(ctx.task) if ctx is not None else {}
    name = task_cfg.pop("name", None)
    tasks = registries().tasks
    if name is None or name not in tasks or not isinstance(tasks.get(name), GenerationTask):
        return extract_number
    task = tasks.get(name)
    return task.answer_parser(parse_options(task.options, task_cfg, where="task"))


@hookimpl
def register_tasks(register: Callable[[Task], None]) -> None:
    register(Gsm8k())
    register(Arithmetic())
    register(QA())
