"""Reading a pipeline's YAML: the platform's one YAML reader, :mod:`paretolab.data.yaml_read` (kept here for old imports)."""

from __future__ import annotations

from paretolab.data.yaml_read import MAX_PIPELINE_BYTES, MAX_PIPELINE_NODES, read_yaml, read_yaml_file

__all__ = ["MAX_PIPELINE_BYTES", "MAX_PIPELINE_NODES", "read_yaml", "read_yaml_file"]
