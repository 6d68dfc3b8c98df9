"""The heartbeat thread: keeps a worker's record alive whatever its training thread is doing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from noloco_rt.membership.table import Membership


class HeartbeatThread:
    """Heartbeats from a daemon thread; Redis errors are absorbed so training never stops for them.

    When `leave_event` is set (a SIGTERM handler sets it) the thread deletes the record at
    once, whatever the training thread is busy with, and stops heartbeating.
    """

    TICK_S = 0.02

    def __init__(self, membership: Membership, updates: Callable[[], dict[str, Any]] | None = None, *,
                 leave_event: threading.Event | None = None) -> None:
        self.membership = membership
        self.updates = updates or dict
        self.leave_event = leave_event or threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.beats = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_beat = time.monotonic() + self.membership.heartbeat_interval_s
        while not self._stop.is_set():
            if self.leave_event.is_set():
                self.membership.leave()
                return
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.membership.heartbeat_interval_s
                try:
                    ok = self.membership.heartbeat(**self.updates())
                except Exception:  # noqa: BLE001 - the thread's last line of defence
                    # e.g. OOM or READONLY from Redis: a dead heartbeat thread would let the
                    # record expire while this worker keeps training, so log and beat again.
                    self.membership.log.exception("heartbeat_failed")
                    ok = False
                if ok:
                    self.beats += 1
                else:
                    self.failures += 1
            self._stop.wait(self.TICK_S)

    @property
    def running(self) -> bool:
        """Whether the heartbeat thread is alive (a Redis error must not end it)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
