"""Log lines go to whatever sys.stderr is when they are written."""

from __future__ import annotations

import io
import json
import sys

from noloco_rt.logs import configure_logging, get_logger


def test_log_lines_follow_a_replaced_stderr_and_survive_a_closed_one(monkeypatch):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("json")
    get_logger(role="test").info("one")
    first.close()  # what a test's captured stream does after the test
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    get_logger(role="test").info("two")  # raised "I/O operation on closed file" before
    assert json.loads(second.getvalue())["event"] == "two"
