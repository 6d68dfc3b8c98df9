"""The views a worker needs, kept fresh by a background thread (docs/architecture.md §5).

The data path and the exchange read the last view of a stage without any I/O; the thread
refreshes every watched stage once per interval, sooner when someone asks (a peer failed,
a joiner looks for a donor). The interval grows with the fleet so that the whole fleet's
reads stay within what one Redis serves; the age of each view is exported as staleness.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.membership.table import Membership

MIN_AUTO_INTERVAL_S = 0.5
MAX_AUTO_INTERVAL_S = 10.0
MIN_GAP_S = 0.2
"""Requests for a sooner refresh are served at most this often (a data path waiting for a
next stage asks at every tick)."""
MEMBERS_PER_SECOND_OF_INTERVAL = 5_000
"""Auto interval: 0.5 s up to 2,500 members seen, then one second more per 5,000 (10,000
members: 2 s), so that the fleet's view reads grow like its size, not its square."""


def auto_refresh_interval_s(members_seen: int) -> float:
    """The refresh interval for a fleet of about `members_seen` workers (pure)."""
    return min(MAX_AUTO_INTERVAL_S, max(MIN_AUTO_INTERVAL_S, members_seen / MEMBERS_PER_SECOND_OF_INTERVAL))


class ViewRefresher:
    """Last view of each watched stage (ONLINE members, sorted by id) and its age."""

    def __init__(self, membership: Membership, stages: Iterable[int], *, interval_s: float = 0.0,
                 run_stages: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.membership = membership
        self.fixed_interval_s = interval_s
        """0: auto_refresh_interval_s of the members seen in the table."""
        self.clock = clock
        self._stages = sorted(set(stages))
        self._run_stages = max(run_stages, len(self._stages))
        self._views: dict[int, list[MemberRecord]] = {stage: [] for stage in self._stages}
        self._read_at: dict[int, float | None] = {stage: None for stage in self._stages}
        self._run_size = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="view-refresher", daemon=True)
        self.refreshes = 0

    @property
    def interval_s(self) -> float:
        if self.fixed_interval_s > 0:
            return self.fixed_interval_s
        return auto_refresh_interval_s(self._run_size)

    def start(self) -> None:
        self.refresh()  # views exist before anyone routes on them
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def view(self, stage: int) -> list[MemberRecord]:
        """The last view of `stage` read (no I/O); empty for a stage not watched."""
        return list(self._views.get(stage, ()))

    def staleness_s(self) -> float:
        """Age of the oldest watched view (inf before the first successful read)."""
        now = self.clock()
        ages = [now - at if at is not None else float("inf") for at in self._read_at.values()]
        return max(ages, default=0.0)

    def request(self) -> None:
        """Refresh soon, from the thread (non-blocking: the data path calls it)."""
        self._wake.set()

    def refresh(self, stages: Iterable[int] | None = None) -> None:
        """Refresh now, in the caller's thread (start-up, bootstrap; never the data path)."""
        for stage in self._stages if stages is None else stages:
            members = self.membership.stage_view(stage, states=None)
            if self.membership.redis_available:
                self._read_at[stage] = self.clock()
            self._views[stage] = [m for m in members if m.state == WorkerState.ONLINE]
        self._run_size = self._estimate_run_size()
        self.refreshes += 1

    def _estimate_run_size(self) -> int:
        """Members of the run, extrapolated from the watched stages (every stage about as big)."""
        seen = [len(self._views[s]) for s in self._stages]
        return int(sum(seen) / max(1, len(seen)) * self._run_stages)

    def _run(self) -> None:
        while not self._stop.is_set():
            # At least MIN_GAP_S between refreshes, at most interval_s: a request ends the wait.
            if self._stop.wait(MIN_GAP_S):
                return
            self._wake.wait(max(0.0, self.interval_s - MIN_GAP_S))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a dead refresher would freeze every view: log, go on
                self.membership.log.exception("view_refresh_failed")
