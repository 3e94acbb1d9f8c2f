"""The error hierarchy: one root, and subclasses that also inherit the built-in they mean."""

from __future__ import annotations


class ParetolabError(Exception):
    """Root of every error paretolab raises on purpose."""


class ConfigError(ParetolabError, ValueError):
    """A pipeline, a parameter or a setting has a wrong value; the message names it."""


class UnknownNameError(ParetolabError, KeyError):
    """A method, task, measure, model or metric name that nobody registered."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence.
        return str(self.args[0]) if self.args else ""


class DuplicateNameError(ParetolabError, ValueError):
    """Two plugins registered the same name."""


class PluginError(ParetolabError, RuntimeError):
    """A plugin failed to import, has a wrong hook signature or broke its contract."""


class TrialError(ParetolabError, RuntimeError):
    """A trial could not produce usable metrics (NaN, missing objective, timeout)."""


class TrialPruned(ParetolabError):
    """The study's pruner stopped this trial at ``step`` (see ``TrialContext.report``); ``subject`` is the model as it stopped."""

    def __init__(self, step: int, subject: object = None) -> None:
        super().__init__(f"pruned at step {step}")
        self.step = step
        self.subject = subject


class CalibrationLeakError(ConfigError):
    """A method would calibrate on the very corpus the task evaluates on (its score would be inflated)."""


class SaveNameError(ConfigError):
    """A trained model cannot be saved under the name given (``train.save_as``) or cannot be saved as a model source at all."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none): for one-line errors that wrap another."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
