"""The argument parser of the `paretolab` command: every verb, its flags and the help that teaches them.

The commands themselves import what they need when they run, so `paretolab --help` stays fast.
"""

from __future__ import annotations

import argparse

from paretolab.cli.catalog import cmd_models_list, cmd_models_pull, cmd_plugins
from paretolab.cli.export import cmd_export
from paretolab.cli.manage import cmd_check, cmd_studies
from paretolab.cli.numbers import MAX_TRIALS, number, whole
from paretolab.cli.read import cmd_dashboard, cmd_frontier, cmd_report
from paretolab.cli.results import cmd_bundle, cmd_results
from paretolab.cli.run import cmd_draft_train, cmd_jobs, cmd_run, cmd_submit
from paretolab.cli.interaction import add_parser as add_interaction
from paretolab.cli.pick import add_parser as add_pick
from paretolab.cli.sensitivity import add_parser as add_sensitivity
from paretolab.cli.suggest import SuggestingParser
from paretolab.results import REPORT_METRICS

EPILOG = """examples:
  paretolab run pipelines/smoke.yaml              run a study on a local Ray
  paretolab run pipelines/demo.yaml --trials 20   run (or extend) with 20 trials in all
  paretolab check pipelines/demo.yaml             validate a pipeline and show its plan; runs nothing
  paretolab run pipelines/demo.yaml --resume      continue an interrupted study (Ctrl-C: running trials finish; twice: cancel)
  paretolab studies --prune                       remove interrupted studies that have no complete trial
  paretolab frontier demo                         the Pareto set of study 'demo'
  paretolab export demo 6 --out demo-6            trial 6's model, loadable by transformers
  paretolab pick demo --keep "ppl no_worse 2 % vs none" --where "size_bytes <= 0.5 x none"   the cheapest that keeps quality
  paretolab sensitivity --model smollm2-135m --method rtn --params bits=3   per-layer quality cost, table and plot
  paretolab bundle export demo --out demo.jsonl.gz  the study's whole record in one file; `bundle import` loads it
  paretolab report demo --bundle demo.jsonl.gz    the report from a bundle, no store needed
  paretolab results status                        which results documents' studies need a rerun
  paretolab plugins                               every method, task, measure and model
  paretolab plugins rtn                           one method's details (--kind decoding: one kind's methods)
  paretolab models pull smollm2-135m              convert the default model once
  paretolab draft train --budget-min 15           train the EAGLE draft for speculative decoding
  paretolab dashboard                             browse studies and frontiers on http://127.0.0.1:8501
  paretolab submit pipelines/demo.yaml --address http://HEAD:8265   run the study as a job on a Ray cluster
  paretolab jobs status JOB_ID --address http://HEAD:8265           follow it (list, status, logs, stop)
"""


def _bundle_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bundle", action="append", metavar="FILE", help="read the studies from a bundle file or a folder of them "
                   "(repeatable) instead of the stores")


def _store_flags(p: argparse.ArgumentParser, default: object = None) -> None:
    """``default=argparse.SUPPRESS`` on a sub-command whose parent has the flags too, so a flag given before it stays."""
    g = p.add_argument_group("stores (default: SQLite files under ./.paretolab)")
    g.add_argument("--home", default=default, help="folder for the default SQLite stores (env PARETOLAB_HOME; default .paretolab)")
    g.add_argument("--storage", default=default, help="Optuna storage, any SQLAlchemy URL (env PARETOLAB_OPTUNA_STORAGE)")
    g.add_argument("--tracking-uri", default=default, help="MLflow tracking URI (env PARETOLAB_TRACKING_URI or MLFLOW_TRACKING_URI)")




def build_parser() -> argparse.ArgumentParser:
    parser = SuggestingParser(
        prog="paretolab",
        allow_abbrev=False,
        description="Map the quality/cost Pareto frontier of ML efficiency methods.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    run = sub.add_parser("run", help="run a study from a pipeline YAML", description=(
        "Run the study a pipeline file describes: Optuna proposes parameters, Ray workers apply the "
        "methods to the model, evaluate quality and measure cost; every trial is recorded in Optuna and MLflow. "
        "Ctrl-C once: no new trials, the running ones finish and are recorded; Ctrl-C twice: the running trials are "
        "cancelled (recorded as failed, 'interrupted: Ctrl-C'). Either way the exit code is 130 and `run PIPELINE "
        "--resume` finishes the study, running cancelled trials' parameters again. `paretolab check PIPELINE` "
        "validates a pipeline without running it."
    ))
    run.add_argument("pipeline", help="path to a pipeline YAML (docs/guides/pipelines.md; every field: the site's pipeline reference)")
    run.add_argument("--trials", type=whole(1, MAX_TRIALS), help="total trials the study should hold (overrides search.trials)")
    run.add_argument("--address", help="Ray cluster address (e.g. ray://head:10001 or auto); default: a local Ray")
    run.add_argument("--resume", action="store_true", help="continue a study that already has trials")
    run.add_argument("--retry-failed", action="store_true", help="with --resume: run the parameters of failed trials again (e.g. after a crash killed them)")
    run.add_argument("--from-study", metavar="OTHER", help="first copy the finished trials of study OTHER (same model, task, objectives "
                     "and search space) into this one: labelled copied, never re-run, not counted in search.trials")
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    run.add_argument("--json", action="store_true", help="print the frontier as JSON at the end")
    _store_flags(run)
    run.set_defaults(func=cmd_run)

    check = sub.add_parser("check", help="validate a pipeline and show what `run` would do, without running anything", description=(
        "Run every check `paretolab run` makes before it starts work (the pipeline's fields, methods and their params, "
        "search space, measures, task, claims and constraints, the model known and loadable here, a grid's size) and "
        "print the plan: trials, sampler and pruner, the search space as Optuna parameters, the arms run first, the "
        "resources per trial, the stores and whether they already hold this study (then `run` needs --resume). Starts "
        "no Ray, loads no model, writes no store. Exit code 0 when `run` would start, 2 with `run`'s one-line error when not."
    ))
    check.add_argument("pipeline", help="path to a pipeline YAML")
    check.add_argument("--trials", type=whole(1, MAX_TRIALS), help="the --trials you would give `run` (a grid refuses any other count than its size)")
    _store_flags(check)
    check.set_defaults(func=cmd_check)

    submit = sub.add_parser("submit", help="run a study as a job on a Ray cluster (Ray's job submission API)", description=(
        "Validate the pipeline here, then submit its study to a Ray cluster as a job that carries the pipeline and "
        "paretolab's code; prints the job id. The job runs `paretolab run PIPELINE --resume` on the cluster, so "
        "submitting the same pipeline again finishes a study whose driver died. Stores: --storage/--tracking-uri "
        "(without a password: Ray keeps a job's settings in clear), else the cluster nodes' own PARETOLAB_* settings. "
        "A cluster with token authentication needs its token here: RAY_AUTH_TOKEN or ~/.ray/auth_token."
    ))
    submit.add_argument("pipeline", help="path to a pipeline YAML")
    submit.add_argument("--address", help="the Ray head's dashboard URL, e.g. http://HEAD:8265 (env RAY_ADDRESS)")
    submit.add_argument("--trials", type=whole(1, MAX_TRIALS), help="total trials the study should hold (overrides search.trials)")
    submit.add_argument("--storage", help="Optuna storage URL for the job (no password in it; see --help)")
    submit.add_argument("--tracking-uri", help="MLflow tracking URI for the job (an MLflow server reachable from the cluster)")
    submit.add_argument("--no-code", action="store_true", help="use the paretolab and plugins installed on the cluster instead of shipping this machine's")
    submit.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", help="list, inspect, read the logs of, or stop Ray jobs")
    jsub = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    jsub.required = True
    for action, text in (("list", "every job on the cluster, newest first"), ("status", "one job's status"),
                         ("logs", "one job's driver output"), ("stop", "stop a job: its running trials are recorded as failed")):
        jp = jsub.add_parser(action, help=text)
        if action != "list":
            jp.add_argument("job_id", help="the id `paretolab submit` printed")
        jp.add_argument("--address", help="the Ray head's dashboard URL, e.g. http://HEAD:8265 (env RAY_ADDRESS)")
        if action in ("list", "status"):
            jp.add_argument("--json", action="store_true", help="machine-readable output")
        if action == "stop":
            jp.add_argument("--wait", type=number(0, 86400), default=30.0, help="seconds to wait for the job to end (default 30; 0: do not wait)")
        jp.set_defaults(func=cmd_jobs)

    plugins = sub.add_parser("plugins", help="list methods, tasks, measures, metrics and models (NAME: one; --kind: one kind's methods)",
                             formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        "Everything the installed plugins registered. Methods show kind, paper, search space and whether their\n"
        "cost saving is real (a stored format or kernel) or simulated; `per-layer` marks a method that takes `layers:`\n"
        "(docs/guides/layers.md). A numeric list in a search space (rtn.bits: 2, 3, 4, 8) is what a search tries by\n"
        "default, not the only values allowed: a pipeline may give another number the method accepts; an integer\n"
        "parameter refuses fractional values and steps. Metrics that differ only in their numbers are one family, one\n"
        "line: llama_tok_s_c{1,2,4,8,16,32} (6, each with _ci_low, _ci_high) is llama_tok_s_c1 ... llama_tok_s_c32\n"
        "and each one's 95 % interval bounds.\n\n"
        "examples:\n"
        "  paretolab plugins                    everything, methods first\n"
        "  paretolab plugins rtn                one method: its search space, what it declares, each metric it reports\n"
        "  paretolab plugins --kind decoding    the methods of one kind (weights, training, decoding, routing, ...)\n"
        "  paretolab plugins ppl                one task, measure, metric or model by its name\n"
        "  paretolab plugins engine --json      machine-readable, every metric listed by name"
    ))
    plugins.add_argument("name", nargs="?", metavar="NAME", help="one method (or task, measure, metric, model) by name")
    plugins.add_argument("--kind", metavar="KIND", help="only the methods of this kind (weights, training, decoding, routing, ...)")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.set_defaults(func=cmd_plugins)

    models = sub.add_parser("models", help="list or pull models")
    msub = models.add_subparsers(dest="models_command", metavar="ACTION")
    msub.required = True
    mlist = msub.add_parser("list", help="registered models and whether they are cached")
    mlist.set_defaults(func=cmd_models_list)
    mpull = msub.add_parser("pull", help="fetch/convert a model once so later loads are fast and offline")
    mpull.add_argument("name", nargs="?", default="smollm2-135m", help="model name (default smollm2-135m)")
    mpull.set_defaults(func=cmd_models_pull)

    draft = sub.add_parser("draft", help="train the EAGLE draft that speculative decoding uses")
    dsub = draft.add_subparsers(dest="draft_command", metavar="ACTION")
    dsub.required = True
    dtrain = dsub.add_parser("train", help="make the draft's training data once, then train (or continue) the draft", description=(
        "Make the draft's training data once: by default the target continues training prompts greedily (the training rows "
        "of GSM8K, WikiText-2, generated arithmetic and pydoc, those whose data is here) and its low/middle/high hidden "
        "states and greedy tokens over prompt + continuation are cached (--data corpus: over corpus windows instead). Then "
        "train the one-layer EAGLE draft on them for a wall-clock budget (CPU is fine). The draft is saved under the cache "
        "dir (drafts/MODEL/eagle.pt) every minute and at the end; a second run continues it. Each run ends with the "
        "held-out top-1 agreement per draft step and the accepted length for k = 1..6 drafts, kept in the draft's curve."
    ))
    dtrain.add_argument("--model", default="smollm2-135m", help="target model (default smollm2-135m)")
    dtrain.add_argument("--budget-min", type=number(0, 7 * 24 * 60, above=True), default=15.0, help="minutes of training in this run (default 15; data not included)")
    dtrain.add_argument("--data", choices=("self", "corpus"), default="self",
                        help="self: the target's own greedy continuations of training prompts (default); corpus: corpus windows")
    dtrain.add_argument("--prompt-sets", default="", help="--data self: comma-separated prompt sets (gsm8k, arithmetic, or a corpus "
                        "such as wikitext2, pydoc); default: gsm8k,wikitext2,arithmetic,pydoc, those whose data is here")
    dtrain.add_argument("--prompts", type=whole(1), default=1024, help="--data self: training prompts over all sets (default 1024)")
    dtrain.add_argument("--new-tokens", type=whole(1), default=128, help="--data self: greedy tokens per prompt (default 128)")
    dtrain.add_argument("--corpus", default="pydoc", help="--data corpus: training corpus; its last 10%% is held out for prompts (default pydoc)")
    dtrain.add_argument("--tokens", type=whole(1), default=16384, help="--data corpus: target tokens whose hidden states are cached (default 16384)")
    dtrain.add_argument("--seq-len", type=whole(2), default=256, help="training window in tokens (default 256)")
    dtrain.add_argument("--vocab", type=whole(1), default=4096, help="draft vocabulary: the target's most frequent tokens (default 4096)")
    dtrain.add_argument("--ttt-steps", type=whole(1, 64), default=3, help="training-time-test rollout steps (default 3)")
    dtrain.add_argument("--fresh", action="store_true", help="start over instead of continuing an existing draft")
    dtrain.add_argument("--if-missing", action="store_true", help="do nothing when the model already has a draft (the results targets' way)")
    dtrain.add_argument("--no-progress", action="store_true", help="no progress bars")
    dtrain.set_defaults(func=cmd_draft_train)

    frontier = sub.add_parser("frontier", help="the non-dominated trials of a study, as a table", description=(
        "Read a study from the stores and print its Pareto set on the pipeline's objectives."
    ))
    frontier.add_argument("study", help="study name (the pipeline's `name`)")
    frontier.add_argument("--json", action="store_true", help="machine-readable output")
    _bundle_flag(frontier)
    _store_flags(frontier)
    frontier.set_defaults(func=cmd_frontier)

    export = sub.add_parser("export", help="write a trial's model as a directory transformers loads", description=(
        "Re-apply the trial's stages to its base model (same params, seed and calibration data), check the quality "
        "metric against the recorded one (exit code 1 when it falls outside the recorded interval) and write DIR: "
        "model.safetensors + config.json + tokenizer (AutoModelForCausalLM.from_pretrained(DIR)), paretolab.json "
        "(pipeline, params, metrics, provenance, sizes) and, for pruned or quantized weights, compact/ (MACKO, or "
        "packed integers with fp16 scales; load with paretolab.api.compact.load_compact). A failed trial, a missing "
        "base model, an existing DIR (without --force) or a method whose model transformers cannot rebuild is "
        "refused with one line."
    ), formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n  paretolab frontier demo                    pick a trial number\n"
        "  paretolab export demo 6 --out demo-6\n"
        "  paretolab export fp32_base 0 --out base --save-as my-base   and use `model: my-base` in a pipeline"))
    export.add_argument("study", help="study name (the pipeline's `name`)")
    export.add_argument("trial", type=whole(0), help="trial number (the `trial` column of `paretolab frontier`)")
    export.add_argument("--out", required=True, metavar="DIR", help="the directory to write (must not exist unless --force)")
    export.add_argument("--force", action="store_true", help="replace DIR if it exists")
    export.add_argument("--save-as", metavar="NAME", help="also keep the model as a model source NAME (`paretolab models list`; `model: NAME` in a pipeline)")
    _store_flags(export)
    export.set_defaults(func=cmd_export)
    add_sensitivity(sub)

    report = sub.add_parser("report", help="method-vs-baseline tables of studies, as Markdown", description=(
        "For each study, group complete trials by method (the stages that ran, e.g. 'wanda+rtn') and print "
        "each method's own non-dominated trials (or every trial with --trials all) with the chosen metrics; "
        "with an unmodified-model trial ('none') the first objective is also shown relative to it. "
        "Metric columns no trial reported are left out. --output writes a whole Markdown document, "
        "e.g. `paretolab report wanda_vs_magnitude macko --trials all --output pipelines/README.md`."
    ))
    report.add_argument("studies", nargs="+", help="study names")
    report.add_argument("--metrics", default=REPORT_METRICS, help=f"comma-separated metric columns after the study's objectives, which are always shown (default {REPORT_METRICS})")
    report.add_argument("--trials", choices=("frontier", "all"), default="frontier", help="each method's Pareto set (default) or every complete trial")
    report.add_argument("--output", metavar="FILE", help="write a Markdown document to FILE instead of printing the tables")
    _bundle_flag(report)
    _store_flags(report)
    report.set_defaults(func=cmd_report)
    add_interaction(sub, _bundle_flag, _store_flags)
    add_pick(sub, _bundle_flag, _store_flags)

    bundle = sub.add_parser("bundle", help="a study's complete record in one file: export it, import it into other stores", description=(
        "A bundle holds studies whole: the pipeline and its hash, every trial (state, params, metrics with their intervals, "
        "per-example scores, curves, reports, pruned and feasible marks, failure reasons) and their provenance (paretolab "
        "version and commit, machine, model checksums, dates), as gzip-compressed JSON Lines (FILE.jsonl.gz, versioned). "
        "`report --bundle` and `frontier --bundle` read one without any store; `bundle import` loads one into stores "
        "(SQLite files or servers) without running anything. A bundle of another format version, or a corrupt or "
        "truncated one, is refused with one line."
    ), epilog=("examples:\n  paretolab bundle export demo --out demo.jsonl.gz\n"
               "  paretolab bundle import demo.jsonl.gz --home other-stores\n"
               "  paretolab report demo --bundle demo.jsonl.gz"), formatter_class=argparse.RawDescriptionHelpFormatter)
    bsub = bundle.add_subparsers(dest="bundle_command", metavar="ACTION")
    bsub.required = True
    bexport = bsub.add_parser("export", help="write studies from the stores to a bundle file", description=(
        "Write the named studies, whole, to FILE (its name ends in .jsonl.gz; written to a temporary file and renamed, "
        "so an interrupted export leaves nothing). The stores are only read. A study named twice is written once; a study "
        "still running is exported as it stands, its running trials unfinished, with a warning on stderr saying how many."))
    bexport.add_argument("studies", nargs="+", help="study names")
    bexport.add_argument("--out", required=True, metavar="FILE", help="the bundle to write (FILE.jsonl.gz; replaced if it exists)")
    _store_flags(bexport)
    bimport = bsub.add_parser("import", help="load a bundle's studies into stores, without rerunning", description=(
        "Load every study of FILE into the stores (created if missing). A study of the same name already there is refused; "
        "--as gives a one-study bundle another name. Trials keep their numbers, states, params, values and dates; their "
        "MLflow runs get new ids. The file is checked whole first (a bundle is untrusted input: its size, names, artifact "
        "paths and every record), and nothing is written if it fails. All or nothing: an import stopped by Ctrl-C, SIGTERM or an "
        "error removes what it wrote; one killed outright leaves its study marked partial, which `report` and `frontier` "
        "refuse and --resume removes and imports again."))
    bimport.add_argument("file", help="a bundle written by `paretolab bundle export`")
    bimport.add_argument("--as", dest="as_name", metavar="NAME", help="import a one-study bundle under another name")
    bimport.add_argument("--resume", action="store_true", help="a study left partial by an interrupted import of FILE: remove it "
                         "and import it again")
    _store_flags(bimport)
    bundle.set_defaults(func=cmd_bundle)

    results = sub.add_parser("results", help="the results documents (pipelines/*.md): status, rerun, render from bundles", description=(
        "results/documents.yaml lists each results document and its studies; each study's record is committed as "
        "results/bundles/STUDY.jsonl.gz. `status` says which bundles are current, missing or stale (made from another "
        "pipeline); `run FAMILY` runs only the missing or stale studies, one at a time, resuming an interrupted one, "
        "says the expected duration first and writes each bundle as its study finishes (commit each); `render` "
        "writes every document from the bundles alone, offline (`--check`: exit 1 when a committed document differs)."
    ), epilog=("examples:\n  paretolab results status\n  paretolab results run training --untimed   beside other work\n"
               "  paretolab results run --timed             every document's timed studies, while the machine is idle\n"
               "  paretolab results run compression          on an idle machine\n  paretolab results render --check"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    rsub = results.add_subparsers(dest="results_command", metavar="ACTION")
    rsub.required = True
    for action, text in (("status", "each document's studies: current, missing or stale, and how long each took"),
                         ("run", "run the missing or stale studies and write their bundles"),
                         ("render", "write the documents from the bundles")):
        r = rsub.add_parser(action, help=text, description=text)
        r.add_argument("families", nargs="*", metavar="FAMILY", help="documents by family (e.g. training) or path; default: all")
        r.add_argument("--root", default=".", help="the paretolab checkout (default: the current folder)")
        if action == "run":
            only = r.add_mutually_exclusive_group()
            only.add_argument("--untimed", action="store_true", help="skip the studies that time something (leave them for an idle machine)")
            only.add_argument("--timed", action="store_true", help="only the studies that time something: spend an idle machine on them, "
                              "run the rest later with --untimed beside other work")
            r.add_argument("--dry-run", action="store_true", help="say what would run, and for how long, then stop")
            r.add_argument("--no-progress", action="store_true", help="no progress bars")
            r.add_argument("--home", help="the results store (default ROOT/results/.store; kept between sittings so a study resumes)")
            r.add_argument("--max-load", type=number(0, 10_000), metavar="L",
                           help="a timed study starts only once the machine's 1-min load average is at most L (default 1); "
                                "a bundle timed while other work pushed the load past its own CPUs plus L is timed again")
            r.add_argument("--wait-min", type=number(0, 7 * 24 * 60), default=30.0, metavar="M",
                           help="how long to wait for that before stopping with an error (default 30 minutes)")
            r.add_argument("--busy-ok", action="store_true",
                           help="time anyway on a busy machine (each trial records the load; the documents print it)")
        if action == "render":
            r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a document differs from its rendering")
    results.set_defaults(func=cmd_results)

    studies = sub.add_parser("studies", help="list the studies with trial counts and status; remove interrupted or named ones", description=(
        "List the studies in the stores: trial counts by state and a status (finished, running while a driver owns it, "
        "or interrupted: stopped by Ctrl-C or SIGTERM, its driver died, or it stopped on an error, with the `run ... "
        "--resume` that continues it). --prune removes the interrupted studies that have no complete trial; `studies "
        "delete STUDY` removes one study. Removal takes both stores (the Optuna study, the MLflow experiment and its "
        "runs), is refused while a driver runs the study, and asks first unless --yes."
    ), epilog="examples:\n  paretolab studies\n  paretolab studies --prune\n  paretolab studies delete demo --yes",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    studies.add_argument("--prune", action="store_true", help="remove every interrupted study that has no complete trial (asks first)")
    studies.add_argument("--yes", action="store_true", help="remove without asking (needed where there is no terminal to ask on)")
    _store_flags(studies)
    studies.set_defaults(func=cmd_studies, studies_command=None)
    ssub = studies.add_subparsers(dest="studies_command", metavar="ACTION")
    delete = ssub.add_parser("delete", help="remove one study from both stores", description=(
        "Remove study STUDY from both stores: the Optuna study with its trials, and the MLflow experiment with its runs "
        "(renamed NAME.removed-TIME, then deleted, so a new `run` of that name starts fresh; `mlflow gc` frees the disk). "
        "Refused while a driver runs the study; asks first unless --yes."
    ))
    delete.add_argument("study", help="study name (as `paretolab studies` lists it)")
    delete.add_argument("--yes", action="store_true", default=argparse.SUPPRESS, help="remove without asking")
    _store_flags(delete, default=argparse.SUPPRESS)
    delete.set_defaults(func=cmd_studies)

    dashboard = sub.add_parser("dashboard", help="browse studies, frontiers and trials in a web app (Streamlit)", description=(
        "Start the Streamlit dashboard on the stores: studies, Pareto frontiers, trials, comparisons, methods and the "
        "Ray cluster. It only reads the stores. Bound to 127.0.0.1 unless --host says otherwise."
    ))
    dashboard.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    dashboard.add_argument("--port", type=whole(1, 65535), default=8501, help="port (default 8501)")
    dashboard.add_argument("--address", help="Ray cluster address for the Cluster page (env PARETOLAB_RAY_ADDRESS); default: local")
    _store_flags(dashboard)
    dashboard.set_defaults(func=cmd_dashboard)
    _no_abbreviations(parser)
    return parser


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """``--trial 20`` must not be read as ``--trials 20`` (and run trials): every parser takes whole flag names only."""
    parser.allow_abbrev = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _no_abbreviations(child)
