"""Quality tasks, one module each: perplexity, multiple choice, generation (arithmetic, GSM8K, QA), retrieval.

A task is an object with ``name``, ``metrics``, ``options`` (a dataclass parsed from the pipeline's
``task:`` block) and ``evaluate(subject, options, ctx)``; see :class:`paretolab.tasks.base.Task`.
Each module registers its own tasks with the ``register_tasks`` hook. Every task reports its
uncertainty next to the number (:mod:`paretolab.stats`) and keeps per-example scores as the
``per_example.json`` artifact for paired comparisons.
"""

from paretolab.tasks.base import Task
from paretolab.tasks.multiple_choice import (
    MultipleChoice,
    MultipleChoiceOptions,
    RowScore,
    score_rows,
)
from paretolab.tasks.perplexity import Perplexity, PerplexityOptions, corpus_ids

__all__ = ["MultipleChoice", "MultipleChoiceOptions", "Perplexity", "PerplexityOptions", "RowScore", "Task", "corpus_ids", "score_rows"]
