"""Pairing by readiness (docs/architecture.md §4, "Drift") against a real redis-server: each waiter is
taken by exactly one worker, and a waiter that gives up either was not taken or learns
who took it."""

from __future__ import annotations

import threading

import pytest

from noloco_rt.membership.embedded_redis import EmbeddedRedis
from noloco_rt.membership.layout import TableKeys
from noloco_rt.membership.pairing import PairingQueue, ReadyEntry
from noloco_rt.membership.redis_access import connect

KEYS = TableKeys("noloco", "run")


@pytest.fixture(scope="module")
def client():
    with EmbeddedRedis() as running:
        yield connect(running.url)


def entry(i: int, step: int = 1) -> ReadyEntry:
    return ReadyEntry(f"w{i}", step, f"tcp://127.0.0.1:{5000 + i}")


def test_entries_round_trip_and_junk_is_refused():
    assert ReadyEntry.decode(entry(3, 7).encode().encode()) == entry(3, 7)
    for junk in ("", "w1", "w1|x|tcp://a", "|1|tcp://a", "w1|1|"):
        with pytest.raises(ValueError):
            ReadyEntry.decode(junk)


def test_the_second_worker_takes_the_first_and_both_know(client):
    queue = PairingQueue(client, KEYS, stage=0)
    assert queue.offer(entry(1), window_s=5) is None  # nobody waits: w1 waits
    assert queue.offer(entry(2, step=3), window_s=5) == entry(1)  # w2 takes w1 (another step is fine)
    assert queue.taken_by(entry(1)) == entry(2, step=3)
    assert queue.taken_by(entry(1)) is None  # told once
    assert queue.offer(entry(3), window_s=5) is None  # w1 is gone from the queue: w3 waits
    assert queue.withdraw(entry(3)) is None  # untaken: a local step
    assert PairingQueue(client, KEYS, stage=1).offer(entry(4), window_s=5) is None  # stages apart
    PairingQueue(client, KEYS, stage=1).withdraw(entry(4))


def test_a_waiter_that_gives_up_after_being_taken_learns_its_taker(client):
    queue = PairingQueue(client, KEYS, stage=2)
    assert queue.offer(entry(1), window_s=5) is None
    assert queue.offer(entry(2), window_s=5) == entry(1)
    assert queue.withdraw(entry(1)) == entry(2)  # too late to leave untaken: pair with w2


def test_an_expired_waiter_is_never_taken(client):
    queue = PairingQueue(client, KEYS, stage=3)
    assert queue.offer(entry(1), window_s=0.001) is None
    client.execute_command("DEBUG", "SLEEP", "0.01")  # Redis' own clock moves past the deadline
    assert queue.offer(entry(2), window_s=5) is None  # w1 expired: w2 waits instead
    assert queue.withdraw(entry(1)) is None
    assert queue.withdraw(entry(2)) is None


def test_concurrent_offers_form_disjoint_pairs(client):
    """64 workers offering at once (8 threads): every pair is mutual, nobody is in two."""
    queue = PairingQueue(client, KEYS, stage=4)
    took: dict[str, str] = {}
    lock = threading.Lock()

    def offer_all(indices: range) -> None:
        for i in indices:
            taken = queue.offer(entry(i), window_s=30)
            if taken is not None:
                with lock:
                    took[f"w{i}"] = taken.worker_id

    threads = [threading.Thread(target=offer_all, args=(range(k * 8, k * 8 + 8),)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    waiters = {f"w{i}" for i in range(64)} - set(took)
    told = {w: queue.taken_by(entry(int(w[1:]))) for w in waiters}
    taken_waiters = {w: t.worker_id for w, t in told.items() if t is not None}
    assert len(took) == 32 and len(taken_waiters) == 32
    assert sorted(took.values()) == sorted(taken_waiters)
    assert all(took[taker] == waiter for waiter, taker in taken_waiters.items())
