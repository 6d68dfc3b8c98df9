"""A pair whose views of the stage differ still keeps the replicas' mean
(noloco_rt/outer/correction.py: each pair weighs by the larger computed group size).

After a member dies, one survivor's view may still list it while the other's has dropped
it: the first computes a group of three (the dead one's push never comes, a partial
step), the second a pair. Both used each other's state; weighted each by its own group
size (1/3 and 1/2) their corrections did not cancel. Two workers' exchange parts over
loopback ZeroMQ; the dead member is an address nothing listens on.
"""

from __future__ import annotations

import socket

from noloco_rt.membership.records import MemberRecord, WorkerState
from tests.support.exchange_pair import ExchangeParts, member_record, overlapped_pair

COLLECT_S = 1.0


def _unused_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _dead_member() -> MemberRecord:
    return MemberRecord(worker_id="c" * 32, run_id="devices", stage=0, data_addr="tcp://127.0.0.1:1",
                        exchange_addr=f"tcp://127.0.0.1:{_unused_loopback_port()}", state=WorkerState.ONLINE)


def _done(worker: ExchangeParts) -> dict:
    (done,) = worker.log.events("outer_step_done")
    return done


def test_a_survivor_that_still_lists_the_dead_member_and_one_that_does_not_cancel():
    with overlapped_pair(collect_s=COLLECT_S) as (a, b):
        a.peers.views.members = [member_record(b), _dead_member()]  # a's view is stale
        a.step.take()
        b.step.take()
        a.step.finish()
        b.step.finish()
        assert len(_done(a)["group"]) == 2 and len(_done(b)["group"]) == 1  # partners: groups of 3 and 2
        assert dict(a.counters.outer_kinds) == {"partial": 1}, a.log.lines
        assert dict(b.counters.outer_kinds) == {"matched": 1}, b.log.lines
        assert _done(a)["used"] == [b.worker_id[:8]] and _done(b)["used"] == [a.worker_id[:8]]
        sums = [_done(w)["correction_sum"] for w in (a, b)]
        assert abs(sums[0]) > 0 and abs(sum(sums)) <= 1e-5 * max(abs(x) for x in sums), sums
