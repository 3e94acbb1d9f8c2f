"""Any exception a plugin raises in a worker, BaseException included, is a readable one-line reason on a failed trial."""

from __future__ import annotations

import pytest

from paretolab import Method
from paretolab.records import StagePlan, TrialSettings
from paretolab.study.trial import run_trial

SETTINGS = TrialSettings("r", "perplexity", {"max_tokens": 128, "context": 64, "stride": 64}, {"params": {}}, seed=0)


def raising(exc):
    class Raises(Method):
        name = f"raises_{type(exc).__name__.lower()}"

        def transform(self, subject, params, ctx):
            raise exc

    return Raises()



@pytest.mark.parametrize("exc, expected", [
    (KeyboardInterrupt(), "KeyboardInterrupt: interrupted inside the trial"),
    (SystemExit(3), "SystemExit: a plugin called exit(3) inside the trial"),
    (GeneratorExit(), "GeneratorExit"),
])
def test_a_base_exception_in_a_plugin_fails_the_trial_with_a_reason(exc, expected, register, tiny):
    result = run_trial(tiny, [StagePlan("stage0", register(raising(exc)).name, {})], SETTINGS, number=0)
    assert result.failed and result.error == expected and result.traceback


def test_ray_s_task_error_is_read_by_its_cause_without_colour_codes():
    from paretolab.study.reasons import readable_reason

    class RayTaskError(Exception):
        def __init__(self):
            super().__init__("\x1b[36mray::Worker.run()\x1b[39m (pid=1, ip=127.0.0.1)\n  File ...\nKeyboardInterrupt")
            self.cause = KeyboardInterrupt()

    assert readable_reason(RayTaskError()) == "KeyboardInterrupt: interrupted inside the trial"
    plain = Exception("\x1b[31mboom\x1b[0m")
    assert readable_reason(plain) == "Exception: boom"
