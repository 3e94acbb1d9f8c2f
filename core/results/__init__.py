"""Reading results back: frontiers, claim verdicts, quality differences with their noise, the results documents.

- :mod:`paretolab.results.frontier` — Pareto frontiers (and the report's ``frontiers:`` lines).
- :mod:`paretolab.results.noise` — paired quality differences with their intervals, from per-example scores.
- :mod:`paretolab.results.claims` — a pipeline's claim judged on the stored trials.
- :mod:`paretolab.results.read` — studies read from the stores: frontiers, per-method tables, summaries, failures.
- :mod:`paretolab.results.section` — one study as a Markdown section of a results document.
"""
