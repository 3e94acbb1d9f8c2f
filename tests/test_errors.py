"""One line of a wrapped error, for the messages the driver, the worker pool, Ray connections and job listings print."""

from __future__ import annotations

from types import SimpleNamespace

from paretolab.cluster.jobs import _explain, _row
from paretolab.errors import first_line


def test_first_line_keeps_the_first_line_of_the_message() -> None:
    assert first_line(RuntimeError("  worker died\nTraceback (most recent call last):\n  ...")) == "worker died"


def test_first_line_of_an_empty_or_blank_message_is_the_errors_type() -> None:
    assert first_line(ConnectionError()) == "ConnectionError"
    assert first_line(ValueError(" \n ")) == "ValueError"


def test_a_job_api_error_is_explained_in_one_line() -> None:
    err = _explain(RuntimeError("boom\nlong ray traceback"), "http://127.0.0.1:8265")
    assert str(err) == "Ray job API at http://127.0.0.1:8265: boom"
    assert str(_explain(ConnectionError(), "http://127.0.0.1:8265")).endswith(": ConnectionError")


def test_a_job_row_takes_the_first_line_of_its_message_and_survives_a_blank_one() -> None:
    info = SimpleNamespace(submission_id="raysubmit_1", status="FAILED", metadata={}, message="Job failed\nstack", start_time=1, end_time=2)
    assert _row(info)["message"] == "Job failed"
    assert _row(SimpleNamespace(**{**vars(info), "message": "  \n"}))["message"] == ""
    assert _row(SimpleNamespace(**{**vars(info), "message": None}))["message"] == ""
