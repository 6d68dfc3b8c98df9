"""Waiting for something a test cannot be told about: a poll with a deadline, never a bare sleep."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout_s: float = 30.0, what: str = "the condition", *,
               interval_s: float = 0.02, on_poll: Callable[[], Any] | None = None,
               process: subprocess.Popen | None = None) -> Any:
    """condition()'s first truthy result, polled every interval_s (on_poll called before each
    poll); AssertionError naming `what` after timeout_s, or at once when `process` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if on_poll is not None:
            on_poll()
        if result := condition():
            return result
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{process.args[0] if process.args else 'the process'} exited with "
                                 f"{process.returncode} while waiting for {what}:\n"
                                 f"{process.stdout.read()[-4000:] if process.stdout else ''}")
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
