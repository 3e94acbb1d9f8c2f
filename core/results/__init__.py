"""Reading results back: frontiers, claim verdicts, quality differences with their noise, the results documents.

- :mod:`paretolab.results.frontier` — Pareto frontiers (and the report's ``frontiers:`` lines).
- :mod:`paretolab.results.noise` — paired quality differences with their intervals, from per-example scores.
- :mod:`paretolab.results.claims` — a pipeline's claim judged on the stored trials.
- :mod:`paretolab.results.verdicts` — a study's claims and verdicts as data (``load_study``, the dashboard).
- :mod:`paretolab.results.read` — studies read from the stores: frontiers, per-method tables, summaries, failures.
- :mod:`paretolab.results.section` — one study as a Markdown section of a results document.
- :mod:`paretolab.results.source` — where the readers find a study: the stores or study bundles.
- :mod:`paretolab.results.bundle` — a study's complete record in one file (export, import, read).
- :mod:`paretolab.results.documents` — the results documents (pipelines/*.md) rendered from committed bundles.

Only constants live here, so the CLI's parser can name them without importing the readers.
"""

# The report's default columns after a study's objectives: the speedups against the unmodified model (timed beside
# each trial) lead; absolute times follow.
REPORT_METRICS = ("ppl,acc,size_bytes,bits_per_weight,sqnr_db,psum_sqnr_db,depth_alpha,depth_fit_r2,depth_ce_inf,prefill_speedup,"
                  "decode_speedup,prefill_ms,decode_tok_s,energy_j")
