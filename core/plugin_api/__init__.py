"""The plugin API: what a method, task, measure or model plugin is written against.

- :mod:`paretolab.plugin_api.hookspec` — every hook paretolab calls, and ``hookimpl``.
- :mod:`paretolab.plugin_api.method` — ``Method``, its kinds and paper, and the checks a registered method passes.
- :mod:`paretolab.plugin_api.subject` / :mod:`~paretolab.plugin_api.storage` — what a method transforms, and how its tensors are stored (``size_bytes``).
- :mod:`paretolab.plugin_api.context` / :mod:`~paretolab.plugin_api.costs` — what a method sees of its trial, and the per-role cost ledger.
- :mod:`paretolab.plugin_api.measure` — ``Measure`` (and ``NoOptions``), what a measure plugin subclasses.
- :mod:`paretolab.plugin_api.options` — typed option blocks parsed from YAML with errors that name field and value.
- :mod:`paretolab.plugin_api.metrics` — metric definitions (and the core's own, registered as a plugin).
- :mod:`paretolab.plugin_api.registry` / :mod:`~paretolab.plugin_api.manager` — typed registries, plugin discovery, the process-wide registries.

It imports only :mod:`paretolab.errors`, :mod:`paretolab.records`, :mod:`paretolab.version` and :mod:`paretolab.data`.
The public names plugin authors use are re-exported by :mod:`paretolab` itself.
"""
