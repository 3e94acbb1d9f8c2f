"""Our multiple-choice task next to lm-evaluation-harness on the same rows and the same model.

    python benchmarks/lmeval_mc.py [--model smollm2-135m] [--datasets arc_easy,arc_challenge,piqa] [--limit 200]

lm-eval runs offline on our local jsonl rows through task files written here (``dataset_path:
json``), with lm-eval's own prompt for the data set (``Question: ...\\nAnswer:`` for ARC and PIQA:
our rows already hold ``Question: ...``) and the model handed over as a Hugging Face model object
(``HFLM(pretrained=model)``). Prints acc, acc_norm and their standard errors from both, and how
many rows' per-choice log-likelihoods differ by more than 1e-3 nats. ``lmeval_scores`` is what
the parity test in tests/tasks/test_lmeval_parity.py calls.

Measured here (smollm2-135m, our Q4_1 GGUF dequantized to fp32, zero-shot, first 100 rows,
lm-eval 0.4.13, one CPU thread): every row's per-choice log-likelihoods agree within 1e-3 nats;
acc / acc_norm (± stderr) identical in both: ARC-E 0.46±0.050 / 0.40±0.049, ARC-C 0.23±0.042 /
0.27±0.045, PIQA 0.66±0.048 / 0.69±0.046.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from paretolab.data import read_jsonl
from paretolab.plugin_api.subject import Subject
from paretolab.stats import stderr
from paretolab.tasks import MultipleChoiceOptions, RowScore, score_rows

# lm-eval's own prompts for these data sets (its arc_easy.yaml, piqa.yaml, boolq: "...\nAnswer:"),
# written over our rows, whose query already holds "Question: ..."; the others' query as it is.
# Deliberately not paretolab.tasks.DELIMITERS: this is the convention we check ourselves against.
LMEVAL_PROMPTS = {name: "{{query.rstrip()}}\\nAnswer:" for name in ("arc_easy", "arc_challenge", "piqa", "boolq")}
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
output_type: multiple_choice
test_split: test
doc_to_text: "{text}"
doc_to_target: "{{{{gold}}}}"
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
"""


def write_task(folder: Path, name: str, rows: list[dict[str, Any]]) -> str:
    """A local lm-eval task over ``rows`` with lm-eval's prompt for ``name``: returns its task name."""
    path = folder / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    text = LMEVAL_PROMPTS.get(name, "{{query}}")
    task = f"paretolab_{name}"
    (folder / f"{task}.yaml").write_text(TASK_YAML.format(task=task, path=path, text=text), encoding="utf-8")
    return task


def lmeval_scores(subject: Subject, dataset: str, limit: int, batch_size: int = 8) -> list[dict[str, Any]]:
    """lm-eval's per-row results on the first ``limit`` rows: ``{"loglikelihoods", "acc", "acc_norm"}``, in row order."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    rows = read_jsonl(dataset, folder="mc")[:limit]
    with tempfile.TemporaryDirectory(prefix="paretolab-lmeval-") as tmp:
        task = write_task(Path(tmp), Path(dataset).stem, rows)
        lm = HFLM(pretrained=subject.model, tokenizer=subject.tokenizer, batch_size=batch_size, device=str(subject.model.device))
        out = simple_evaluate(model=lm, tasks=[task], task_manager=TaskManager(include_path=tmp), num_fewshot=0,
                              log_samples=True, bootstrap_iters=0, verbosity="ERROR")
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    return [{"loglikelihoods": [float(r[0][0]) for r in s["resps"]], "acc": float(s["acc"]), "acc_norm": float(s["acc_norm"])} for s in samples]


def summary(who: str, hits: list[float], hits_norm: list[float]) -> dict[str, float]:
    return {f"{who}_acc": sum(hits) / len(hits), f"{who}_acc_stderr": stderr(hits),
            f"{who}_acc_norm": sum(hits_norm) / len(hits_norm), f"{who}_acc_norm_stderr": stderr(hits_norm)}


def compare(subject: Subject, dataset: str, limit: int, ours: list[RowScore] | None = None) -> dict[str, Any]:
    """Both harnesses on the same rows: acc, acc_norm, stderr, and rows whose log-likelihoods differ."""
    ours = ours if ours is not None else score_rows(subject, MultipleChoiceOptions(dataset=dataset, limit=limit))
    theirs = lmeval_scores(subject, dataset, limit)
    differ = sum(any(abs(a - b) > 1e-3 for a, b in zip(o.loglikelihoods, t["loglikelihoods"])) for o, t in zip(ours, theirs))
    return {"dataset": dataset, "n": len(ours), "loglik_rows_differ": differ,
            **summary("ours", [o.hit for o in ours], [o.hit_norm for o in ours]),
            **summary("lmeval", [t["acc"] for t in theirs], [t["acc_norm"] for t in theirs])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--datasets", default="arc_easy,arc_challenge,piqa")
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--ours-only", action="store_true", help="skip lm-eval")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()
    import torch

    from paretolab.models import load_subject

    if args.threads:
        torch.set_num_threads(args.threads)
    subject = load_subject(args.model)
    ours = {}
    for dataset in args.datasets.split(","):  # ours on every data set first, then lm-eval on the same rows
        start = time.perf_counter()
        ours[dataset] = score_rows(subject, MultipleChoiceOptions(dataset=dataset, limit=args.limit))
        print(json.dumps({"dataset": dataset, "n": len(ours[dataset]), "seconds": round(time.perf_counter() - start, 1),
                          **summary("ours", [o.hit for o in ours[dataset]], [o.hit_norm for o in ours[dataset]])}), flush=True)
    if not args.ours_only:
        for dataset, scored in ours.items():
            print(json.dumps(compare(subject, dataset, args.limit, scored)), flush=True)


if __name__ == "__main__":
    main()
