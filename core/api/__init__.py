"""paretolab from Python: apply a method to a model, read a study as data frames, export a trial's model.

``paretolab.apply``, ``paretolab.load_study`` and ``paretolab.export`` are these functions (the
package's ``__init__`` imports them on first use); the CLI's ``paretolab export`` calls the same code.
"""

from __future__ import annotations

from paretolab.api.apply import Applied, apply
from paretolab.api.export import Exported, ExportError, export
from paretolab.api.frames import StudyFrames, load_study

__all__ = ["Applied", "ExportError", "Exported", "StudyFrames", "apply", "export", "load_study"]
