"""paretolab from Python: apply a method to a model, read a study as data frames, export a trial's model, pick the
cheapest configuration whose quality holds.

``paretolab.apply``, ``paretolab.load_study``, ``paretolab.export`` and ``paretolab.pick`` are these functions (the
package's ``__init__`` imports them on first use); the CLI's ``paretolab export`` and ``paretolab pick`` call the same code.
"""

from __future__ import annotations

from paretolab.api.apply import Applied, apply
from paretolab.api.export import Exported, ExportError, export
from paretolab.api.frames import StudyFrames, load_study
from paretolab.api.pick import Decision, pick

__all__ = ["Applied", "Decision", "ExportError", "Exported", "StudyFrames", "apply", "export", "load_study", "pick"]
