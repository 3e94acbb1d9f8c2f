"""What a method sees of the trial it runs in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from paretolab.plugin_api.costs import CostLedger
from paretolab.plugin_api.examples import ExampleSplit


@dataclass
class TrialContext:
    """Per-trial facts and helpers handed to ``transform``, ``evaluate`` and ``measure``.

    ``seed`` is the study seed plus the trial number: use ``generator()`` for any randomness
    so that a trial is reproducible from its number. ``device`` is the subject's device: put new
    tensors there. Files written under ``workdir`` and listed with ``add_artifact`` are logged
    to MLflow by the driver. ``base`` is the worker's unmodified subject (shared by every trial
    of the worker: read it, never change it). ``stage_s`` / ``stage_energy_j`` hold the stages
    finished so far (a measure sees every transform stage and ``evaluate``). ``models`` holds the
    pipeline's ``models:`` by role (``small``, ``large``, ...), loaded once per worker and shared by
    its trials: read them, never change them; record what each role's model did in ``costs``.
    """

    seed: int
    workdir: Path
    study: str = ""
    trial_number: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    stage: str = ""
    cpus: float = 0.0  # the trial's resources.cpus (0: not set); timing measures fix torch's threads to it
    base: Any = None  # the unmodified base Subject, for measures that time it beside the method; never modify it
    task: dict[str, Any] = field(default_factory=dict)
    deadline: float | None = None  # time.time() when the driver gives up on this trial (None: no limit); long stages stop before it
    artifacts: list[Path] = field(default_factory=list)
    # the trial's finished windows so far, live: "copy", "transform:<stage id>", "evaluate" (seconds; joules, see paretolab.energy)
    stage_s: dict[str, float] = field(default_factory=dict)
    stage_energy_j: dict[str, float] = field(default_factory=dict)
    models: dict[str, Any] = field(default_factory=dict)  # role -> Subject, shared read-only by the worker's trials
    costs: CostLedger = field(default_factory=CostLedger)  # per-role calls, tokens, seconds (see paretolab.costs)
    reporter: Callable[[int, dict[str, float]], bool] | None = None  # the study's pruner (set by the worker with search.pruner)
    pruned_at: int | None = None  # the step ``report`` was told to stop at
    # each calibration draw the trial made ("pydoc seed 17, 16x256"): a verdict resting on one draw says so (see results.claims)
    calibration_draws: list[str] = field(default_factory=list)
    split: ExampleSplit | None = None  # the pipeline's confirm split and this run's part (None: every example is scored)
    examples_used: str = ""  # what ``examples`` handed out ("search part: 6 of 12 windows ..."): the trial's info records it

    def report(self, step: int, values: dict[str, float]) -> bool:
        """Hand intermediate values (e.g. ``{"val_loss": 3.2}`` at optimizer step ``step``) to the study's pruner.

        Returns True when the trial should stop now: return from ``transform`` at once (the trial is
        then recorded as pruned, with what it spent so far). Always False without ``search.pruner``.
        """
        if self.pruned_at is not None:
            return True
        if self.reporter is None:
            return False
        if self.reporter(int(step), {k: float(v) for k, v in values.items()}):
            self.pruned_at = int(step)
            return True
        return False

    def examples(self, n: int, unit: str = "example") -> list[int]:
        """The indices of the ``n`` examples (windows, questions) this run scores: all of them, or under a pipeline's
        ``confirm:`` split only its part's (the search scores the search part; ``paretolab pick`` the confirm part)."""
        if self.split is None:
            return list(range(n))
        kept = self.split.indices(n, unit)
        self.examples_used = f"{self.split.describe(n, unit)}: {unit}s {','.join(map(str, kept))}"
        return kept

    def generator(self, offset: int = 0) -> torch.Generator:
        """A seeded torch RNG for this trial (``offset`` separates independent streams)."""
        return torch.Generator(device="cpu").manual_seed(self.seed + offset)  # CPU: the same stream on any device

    def calibration_ids(self, tokenizer: Any, *, corpus: str = "pydoc", n_samples: int = 16, seq_len: int = 256) -> torch.Tensor:
        """(n_samples, seq_len) calibration token ids from ``corpus``, seeded by the trial (the draw is recorded with the trial)."""
        return self.calibration_draw(tokenizer, corpus=corpus, n_samples=n_samples, seq_len=seq_len, seed=self.seed)

    def calibration_draw(self, tokenizer: Any, *, corpus: str, n_samples: int, seq_len: int, seed: int) -> torch.Tensor:
        """Calibration ids from an explicit ``seed`` (a ``calib_seed`` parameter that pairs draws across trials), recorded like
        :meth:`calibration_ids`' draws: the trial's ``info.calibration_draws`` names every draw it made."""
        from paretolab.data import calibration_ids

        draw = f"{corpus} seed {seed}, {n_samples}x{seq_len}"
        if draw not in self.calibration_draws:
            self.calibration_draws.append(draw)
        return calibration_ids(tokenizer, corpus=corpus, n_samples=n_samples, seq_len=seq_len, seed=seed)

    def add_artifact(self, name: str, content: str | bytes) -> Path:
        """Write a file into this trial's workdir and have it logged as an MLflow artifact.

        A second ``per_example.json`` (a method scoring its own problems beside the task's windows) is merged into the
        first (:func:`paretolab.stats.merge_per_example`), so every per-example score reaches the verdicts."""
        from paretolab.stats import ARTIFACT, merge_per_example

        self.workdir.mkdir(parents=True, exist_ok=True)
        path = self.workdir / name
        if name == ARTIFACT and path.is_file():
            text = content.decode() if isinstance(content, bytes) else content
            content = merge_per_example(path.read_text(encoding="utf-8"), text)
        if path in self.artifacts:
            self.artifacts.remove(path)
        if isinstance(content, str):
            path.write_text(content, encoding="utf-8")
        else:
            path.write_bytes(content)
        self.artifacts.append(path)
        return path
