"""Who a worker exchanges with at an outer step (docs/architecture.md §4): its seeded matched group, or a
partner found by readiness through the stage's Redis queue (the seeded group when Redis
is away). Runs on the exchanger thread: waiting in the queue never holds up training."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from noloco_rt.logs import EventLog
from noloco_rt.membership.pairing import PairingQueue, ReadyEntry
from noloco_rt.membership.records import MemberRecord

POLL_S = 0.02
"""How often a waiter asks whether it was taken (one tiny script call)."""


@dataclass(frozen=True)
class Partner:
    worker_id: str
    exchange_addr: str
    outer_step: int
    """The partner's own outer step: what our push to it is for."""

    @classmethod
    def of(cls, record: MemberRecord, outer_step: int) -> Partner:
        return cls(record.worker_id, record.exchange_addr, outer_step)


class ReadinessPairing:
    """Take a waiting worker of our stage, or wait for one to take us, within a window."""

    def __init__(self, queue: PairingQueue, *, worker_id: str, exchange_addr: str, log: EventLog) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.exchange_addr = exchange_addr
        self.log = log
        self.redis_failures = 0

    def find(self, outer_step: int, *, window_s: float, fallback: list[Partner],
             cancelled: Callable[[], bool], wake: threading.Event) -> tuple[list[Partner], str]:
        """([our partner] or [] for a local step, how it was found: taken / waited / alone /
        seeded when Redis could not be asked)."""
        me = ReadyEntry(self.worker_id, outer_step, self.exchange_addr)
        try:
            taken = self.queue.offer(me, window_s=window_s)
            if taken is not None:
                return [_partner(taken)], "took"
            waited = self._wait(me, window_s, cancelled, wake)
        except redis.RedisError as exc:
            self.redis_failures += 1
            if self.redis_failures == 1 or self.redis_failures % 100 == 0:
                self.log.warning("pairing_queue_unreachable", error=str(exc), failures=self.redis_failures,
                                 fallback="seeded matching over the cached view")
            return fallback, "seeded"
        return ([_partner(waited)], "taken") if waited is not None else ([], "alone")

    def _wait(self, me: ReadyEntry, window_s: float, cancelled: Callable[[], bool],
              wake: threading.Event) -> ReadyEntry | None:
        deadline = time.monotonic() + window_s
        while time.monotonic() < deadline and not cancelled():
            taker = self.queue.taken_by(me)
            if taker is not None:
                return taker
            wake.wait(POLL_S)
        return self.queue.withdraw(me)  # taken at the last moment: we still pair with it


def _partner(entry: ReadyEntry) -> Partner:
    return Partner(entry.worker_id, entry.exchange_addr, entry.outer_step)
