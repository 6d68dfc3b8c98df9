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

    The thread sleeps until its next beat, not on a short tick: each wakeup would take a core
    from a training thread (a 20 ms tick is 50 a second). When `leave_event` is set, wake()
    (a SIGTERM handler calls it) has the thread delete the record at once, whatever the
    training thread is busy with, and stop heartbeating; without wake() it leaves at its
    next beat.
    """

    def __init__(self, membership: Membership, updates: Callable[[], dict[str, Any]] | None = None, *,
                 leave_event: threading.Event | None = None) -> None:
        self.membership = membership
        self.updates = updates or dict
        self.leave_event = leave_event or threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.beats = 0
        self.failures = 0

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Look at `leave_event` now, not at the next beat. Safe in a signal handler: only the
        heartbeat thread waits on this event, never the main thread a handler interrupts, so
        its lock is never held by the interrupted thread."""
        self._wake.set()

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
            # Cleared after waking: whoever set the leave or stop flag did so before wake(),
            # so the checks above see it on the next pass.
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()

    @property
    def running(self) -> bool:
        """Whether the heartbeat thread is alive (a Redis error must not end it)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
