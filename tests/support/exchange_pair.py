"""Two workers' outer-exchange parts (snapshot service, exchange server, exchanger, outer
step) over loopback ZeroMQ, each replica on the stand-in device of tests/support/other_device.py.
Only the membership view is given (no Redis): each worker sees the other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import zmq

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.membership.records import MemberRecord, WorkerState
from noloco_rt.net.transport import ExchangeServer
from noloco_rt.routing.peers import Blacklist
from tests.support.other_device import OTHER_DEVICE, on_other_device
from workers.counters import Counters
from workers.metrics import WorkerMetrics
from workers.outer.device_boundary import ExchangeBoundary
from workers.outer.exchanger import OuterExchanger
from workers.outer.service import SnapshotService
from workers.outer.step import OuterStep


@dataclass
class RecordingLog:
    """The structlog calls a part made, by level (the parts take their logger as an argument)."""

    lines: list[tuple[str, str, dict]] = field(default_factory=list)

    def _add(self, level: str, event: str, **fields: Any) -> None:
        self.lines.append((level, event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self._add("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._add("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._add("error", event, **fields)

    def events(self, name: str) -> list[dict]:
        """The fields of every line logged as `name`, in order."""
        return [fields for _, event, fields in self.lines if event == name]

    def errors(self) -> list[tuple[str, dict]]:
        return [(event, fields) for level, event, fields in self.lines if level == "error"]


class GivenViews:
    def __init__(self, members: list[MemberRecord]) -> None:
        self.members = members

    def view(self, stage: int) -> list[MemberRecord]:
        return [m for m in self.members if m.stage == stage]


class GivenPeers:
    """What the outer step asks of a PeerView: the stage's view and a blacklist."""

    def __init__(self) -> None:
        self.views = GivenViews([])
        self.blacklist = Blacklist()


@dataclass
class ExchangeParts:
    worker_id: str
    replica: StageReplica
    counters: Counters
    log: RecordingLog
    server: ExchangeServer
    exchanger: OuterExchanger
    step: OuterStep
    peers: GivenPeers

    def close(self) -> None:
        self.exchanger.close()
        self.server.stop()


def replica_on_other_device(cfg, seed: int, *, device: str = "other") -> StageReplica:
    """A small replica whose θ, φ and δ live on the stand-in device (`device="cpu"`: on the
    host); θ moved away from φ as inner steps would (each worker differently)."""
    place = on_other_device if device == "other" else (lambda t: t)
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    from noloco_rt.algo.optim import InnerOptimizer

    replica = StageReplica(module, InnerOptimizer(module.parameters(), cfg.optim, total_steps=10))
    generator = torch.Generator().manual_seed(seed)
    replica.fast = [place(t + 0.01 * torch.randn(t.shape, generator=generator)) for t in replica.slow]
    replica.slow = [place(t) for t in replica.slow]
    replica.momentum = [place(t) for t in replica.momentum]
    return replica


def exchange_parts(ctx: zmq.Context, cfg, worker_id: str, seed: int, *, collect_s: float = 10.0,
                   boundary: ExchangeBoundary | None = None) -> ExchangeParts:
    """`boundary`: the replica on the host with this boundary (else on the stand-in device)."""
    replica = replica_on_other_device(cfg, seed, device="other" if boundary is None else "cpu")
    log, metrics, counters, peers = RecordingLog(), WorkerMetrics(), Counters(), GivenPeers()
    service = SnapshotService(cfg, 0, worker_id, metrics=metrics, log=log, blacklist=peers.blacklist,
                              expected_shapes=[tuple(t.shape) for t in replica.slow],
                              boundary=boundary or ExchangeBoundary.on(OTHER_DEVICE))
    server = ExchangeServer(ctx, bind_host="127.0.0.1", port=0, advertise_host="", handler=service.handle)
    server.start()
    exchanger = OuterExchanger(ctx, service, peers, collect_s=collect_s, log=log)
    step = OuterStep(cfg, exchanger=exchanger, service=service, replica=replica, peers=peers, counters=counters,
                     metrics=metrics, log=log)
    return ExchangeParts(worker_id, replica, counters, log, server, exchanger, step, peers)


def member_record(parts: ExchangeParts) -> MemberRecord:
    return MemberRecord(worker_id=parts.worker_id, run_id="devices", stage=0, data_addr="tcp://127.0.0.1:1",
                        exchange_addr=parts.server.address, state=WorkerState.ONLINE)


def see_each_other_and_take_a_step(workers: list[ExchangeParts], timeout_s: float = 60.0) -> None:
    """Each worker of the pair sees the other; both take their outer step at once, each on a
    thread of its own, and both return within `timeout_s`."""
    workers[0].peers.views.members = [member_record(workers[1])]
    workers[1].peers.views.members = [member_record(workers[0])]
    threads = [threading.Thread(target=w.step.take) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    assert not any(t.is_alive() for t in threads), "an outer step did not return"


def assert_both_matched_once(a: ExchangeParts, b: ExchangeParts, outer_step: int) -> None:
    """b has finished; a's overlapped round for `outer_step` ends and is settled at a's next
    inner-step boundary: each side has exactly one outer step, matched, and no error logged."""
    assert a.exchanger.round_over(outer_step, wait_s=30)
    a.step.after_inner_step()
    for worker in (a, b):
        assert dict(worker.counters.outer_kinds) == {"matched": 1}, worker.log.lines
        assert worker.log.errors() == []


@contextlib.contextmanager
def overlapped_pair(*, collect_s: float = 10.0, **outer: Any) -> Iterator[tuple[ExchangeParts, ExchangeParts]]:
    """Workers a and b, each seeing the other: overlapped steps, max_delay_steps 1 (unless
    `outer` says otherwise), lossless; `collect_s` their collection window."""
    cfg = load_config(environ={}, overrides=[{"run": {"run_id": "devices"},
                                              "outer": {"method": "noloco", "overlap": True, "max_delay_steps": 1,
                                                        **outer},
                                              "worker": {"snapshot_codec": "shuffle-zstd"}}])
    ctx = zmq.Context()
    a, b = exchange_parts(ctx, cfg, "a" * 32, seed=1, collect_s=collect_s), exchange_parts(ctx, cfg, "b" * 32, seed=2, collect_s=collect_s)
    try:
        a.peers.views.members, b.peers.views.members = [member_record(b)], [member_record(a)]
        yield a, b
    finally:
        for worker in (a, b):
            worker.close()
        ctx.term()
