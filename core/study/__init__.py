"""A study from its pipeline to its recorded trials.

- :mod:`paretolab.study.spec` — the pipeline YAML parsed into a ``StudySpec`` (with :mod:`~paretolab.study.stages`,
  :mod:`~paretolab.study.report_spec` for ``claim:``/``frontiers:``, :mod:`~paretolab.study.fields`, :mod:`~paretolab.study.yaml_read`).
- :mod:`paretolab.study.search` — samplers and the define-by-run plan of one trial; :mod:`~paretolab.study.proposer` — the next trial's parameters.
- :mod:`paretolab.study.driver` — ``run_study``: the only writer of both stores; :mod:`~paretolab.study.optuna_study` — the study in Optuna, resume.
- :mod:`paretolab.study.pool` — the Ray workers of one study; :mod:`~paretolab.study.worker` — one worker; :mod:`~paretolab.study.trial` — one trial.
"""
