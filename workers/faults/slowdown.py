"""FAULT INJECTION for tests and chaos runs only (worker.fault_slowdown; off by default): a worker
whose device is this factor slower.

Only the training's own time is stretched: the time from the end of one inner step's
bookkeeping to the end of the next step's compute. What the training thread spends in
between (an outer step waiting for a partner that died, a checkpoint, a progress line)
is not device time; stretching it too would turn one stall into two and make a "2x"
worker fall whole outer steps behind."""

from __future__ import annotations

import time
from collections.abc import Callable


class InjectedSlowdown:
    """Idles `factor - 1` of each inner step's training time (factor 1.0: off)."""

    def __init__(self, factor: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.factor = factor
        self.clock = clock
        self.sleep = sleep
        self._training_since: float | None = None

    def after_compute(self) -> None:
        """The step's compute is done: idle in proportion to the training time since
        `resume`. The first step (no `resume` yet) is not stretched."""
        if self.factor > 1.0 and self._training_since is not None:
            self.sleep((self.factor - 1.0) * (self.clock() - self._training_since))
        self._training_since = None

    def resume(self) -> None:
        """The step's bookkeeping (outer step, progress) is done: training time counts again."""
        self._training_since = self.clock()
