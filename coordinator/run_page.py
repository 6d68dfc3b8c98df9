"""The live page's state: the latest reading of the members (refreshed by the page's own
thread), the curves the observer measured, and recent events; read by the HTTP handlers.
Bounded whatever the run's length or size: the curves keep their last CURVE_POINTS points,
the events their last EVENTS."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from coordinator.page_data import changes, stage_summaries, stage_workers

CURVE_POINTS = 2000
EVENTS = 50


class RunPage:
    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._lock = threading.Lock()
        self._members: dict[str, Any] = {}
        self._known: dict[str, str] = {}
        """Name -> the last worker id seen with it: a new id for a known name is a restart."""
        self._restarts: dict[str, int] = {}
        self._curves: dict[str, deque[tuple[int, float]]] = {
            "val_loss": deque(maxlen=CURVE_POINTS), "spread": deque(maxlen=CURVE_POINTS)}
        self._events: deque[dict[str, Any]] = deque(maxlen=EVENTS)
        self._read_at: float | None = None
        self.redis_available = True
        self.refresh_failures: dict[str, int] = {}
        """Exceptions of the refresher by type: shown on the page, not only logged."""

    def refresh(self, members: Sequence[Any], *, now: float, redis_available: bool = True) -> None:
        """A new reading of every member of the run (any state)."""
        after = {m.worker_id: m for m in members}
        with self._lock:
            first = self._read_at is None
            for kind, name, text in changes(self._members, after, self._known):
                if kind == "restarted":
                    self._restarts[name] = self._restarts.get(name, 0) + 1
                if not (first and kind == "joined"):  # the workers already there when we started
                    self._events.append({"time": now, "kind": kind, "text": text})
            self._members = after
            self._known.update({m.name: m.worker_id for m in members if m.name})
            self._read_at, self.redis_available = now, redis_available

    def refresh_failed(self, exc: BaseException, *, now: float) -> None:
        with self._lock:
            kind = type(exc).__name__
            self.refresh_failures[kind] = self.refresh_failures.get(kind, 0) + 1
            self._events.append({"time": now, "kind": "page_error", "text": f"reading the members failed: {kind}"})

    def add_point(self, curve: str, step: int, value: float | None) -> None:
        if value is None:
            return
        with self._lock:
            points = self._curves[curve]
            if points and points[-1][0] == step:
                points.pop()  # a second measurement of the same step replaces the first
            points.append((int(step), float(value)))

    def add_event(self, kind: str, text: str, *, now: float | None = None) -> None:
        with self._lock:
            self._events.append({"time": time.time() if now is None else now, "kind": kind, "text": text})

    def data(self, *, now: float, status: dict[str, Any] | None = None) -> dict[str, Any]:
        """The page's JSON: per-stage rows, curves, the recent events (newest first)."""
        with self._lock:
            members = list(self._members.values())
            return {
                "run_id": self.run_id, "time": now,
                "read_age_s": None if self._read_at is None else round(now - self._read_at, 1),
                "redis_available": self.redis_available, "workers": len(members),
                "stages": stage_summaries(members, self._restarts),
                "curves": {name: list(points) for name, points in self._curves.items()},
                "events": list(reversed(self._events)), "page_errors": dict(self.refresh_failures),
                "final": (status or {}).get("final"), "note": (status or {}).get("note", ""),
            }

    def stage(self, stage: int, *, now: float) -> dict[str, Any]:
        with self._lock:
            return stage_workers(list(self._members.values()), stage, self._restarts, now=now)

