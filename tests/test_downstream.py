"""Re-sending forwards (workers/data_path/downstream.py), with stand-ins for sockets and Redis."""

from __future__ import annotations

import threading

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.membership.peers import Blacklist, PeerView
from noloco_rt.membership.table import MemberRecord, WorkerState
from workers.counters import Counters
from workers.data_path.context import DataContext
from workers.data_path.downstream import Downstream
from workers.device import HostStaging
from workers.metrics import WorkerMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class StageOne:
    """The member views, reduced to two live next-stage workers."""

    def view(self, stage):
        return [MemberRecord(worker_id=w, run_id="r", stage=1, data_addr=f"tcp://{w}:1", exchange_addr="",
                             state=WorkerState.ONLINE) for w in ("a", "b")]

    def request(self):
        pass


class SilentSocket:
    """Takes every send (the peers then never answer)."""

    address = "tcp://me:1"
    curve = None

    def __init__(self) -> None:
        self.sent_to: list[str] = []

    def send(self, address, parts, *, timeout_s):
        self.sent_to.append(address)
        return True

    def forget(self, address):
        pass


class QuietLog:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _downstream(clock: Clock) -> tuple[Downstream, SilentSocket, Counters]:
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}, "worker": {"max_retries": 5}}])
    peers = PeerView(StageOne(), own_id="me")
    peers.blacklist = Blacklist(base_s=1.0, clock=clock)
    data, counters = SilentSocket(), Counters()
    ctx = DataContext(cfg=cfg, stage=0, worker_id="me", replica=StageReplica.create(cfg, 0),
                      staging=HostStaging(torch.device("cpu")), data=data, peers=peers, counters=counters,
                      metrics=WorkerMetrics(), log=QuietLog(), leave_requested=threading.Event())
    return Downstream(ctx, clock=clock), data, counters


def test_a_retry_never_goes_back_to_a_peer_that_failed_the_microbatch():
    clock = Clock()
    downstream, data, counters = _downstream(clock)
    output = torch.zeros(2, 3, 4)
    downstream.forward(output, torch.zeros(2, 3, dtype=torch.long), output, downstream.choose(exclude={"b"}))
    assert data.sent_to == ["tcp://a:1"]
    clock.now += 100.0  # a's deadline passes: a is blacklisted, the retry goes to b
    downstream.retry_expired()
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"]
    clock.now += 100.0  # b's deadline passes too; a's blacklisting has lapsed, but a failed this one already
    downstream.retry_expired()
    assert data.sent_to == ["tcp://a:1", "tcp://b:1"]
    assert len(downstream) == 0 and (counters.sent, counters.retried, counters.dropped) == (1, 1, 1)
