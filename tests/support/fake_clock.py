"""A clock that moves only when a test moves it, for code that takes `clock=` (and `sleep=`)."""

from __future__ import annotations


class FakeClock:
    """Call it for the time; set `now` to move it; `sleep` moves it too and records how long."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
