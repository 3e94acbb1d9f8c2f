"""Tool scripts run by another environment's Python (see :mod:`paretolab.plugin_api.external`): they import nothing of paretolab."""
