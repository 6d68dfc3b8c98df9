"""Fuzzing a live worker: random and mutated messages on its data and exchange sockets.

Each message is built to be invalid, and the reason the worker must give is predicted
beforehand by running the worker's own validation on it locally (noloco_rt.net.messages.decode
for the data path, a SnapshotService.handle for the exchange path); a message the local
check would accept is not sent. The worker's Prometheus rejected counters must then
grow by exactly the predicted counts per reason, and the exchange server must answer
every request with an ERROR. Used by tests/cluster/test_fuzz_live.py (a small count) and
benchmarks/fuzz_live.py (10,000 messages).
"""

from __future__ import annotations

import collections
import random
import re
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zmq

from noloco_rt.config import load_config
from noloco_rt.net import messages
from noloco_rt.net.wire import MessageKind, WireReject
from workers.cluster.fuzz_messages import (
    DATA_MUTATIONS,
    EXCHANGE_MUTATIONS,
    RUN_ID,
    TARGET_STAGE,
    Frames,
    stage_shapes,
)
from workers.cluster.local_cluster import LocalCluster, WorkerProcess
from workers.metrics import WorkerMetrics
from workers.outer.service import SnapshotService

# -- prediction: the worker's own checks, run locally -----------------------------------------

class _QuietLog:
    def info(self, *_: Any, **__: Any) -> None: ...

    def warning(self, *_: Any, **__: Any) -> None: ...


def predict_data(frames: Frames) -> str | None:
    """The reason the worker's data path rejects these frames with, or None if it would accept."""
    try:
        messages.decode(list(frames), run_id=RUN_ID)
    except WireReject as reject:
        return reject.reason.value
    return None


class ExchangePredictor:
    """A SnapshotService like the worker's, answering locally."""

    def __init__(self) -> None:
        cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2}}])
        self.service = SnapshotService(cfg, TARGET_STAGE, "predictor", metrics=WorkerMetrics(), log=_QuietLog(),
                                       expected_shapes=stage_shapes())

    def predict(self, frames: Frames) -> str | None:
        before = dict(self.service.rejects)
        self.service.handle([zmq.Frame(f) for f in frames])
        after = self.service.rejects
        changed = [k for k in after if after[k] != before.get(k, 0)]
        self.service.inbox.clear()  # a predicted-valid one would sit there
        self.service.assemblies.clear()
        return changed[0] if changed else None


# -- the run ----------------------------------------------------------------------------------

@dataclass
class FuzzReport:
    sent: collections.Counter = field(default_factory=collections.Counter)
    """Expected rejections by reason (what was sent)."""
    counted: dict[str, float] = field(default_factory=dict)
    """Growth of the worker's rejected counters by reason."""
    sent_data: int = 0
    sent_exchange: int = 0
    error_replies: int = 0
    missing_replies: int = 0
    skipped_valid: int = 0
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    inner_before: int = 0
    inner_after_fuzz: int = 0
    seconds: float = 0.0


def rejected_counters(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    pattern = r'^noloco_messages_rejected_total\{reason="([^"]+)"\} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, text, re.MULTILINE)}


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start_target(cluster: LocalCluster) -> WorkerProcess:
    """A 2-stage pipeline of one worker each; the stage-1 worker is the target."""
    cluster.start_worker(0, "feeder")
    target = cluster.start_worker(1, "target")
    cluster.wait_online(2)
    cluster.wait_event(target, "train_progress", timeout_s=60)
    return target


def _invalid_message(rng: random.Random, to_data: bool, predictor: ExchangePredictor,
                     report: FuzzReport) -> tuple[Frames, str] | None:
    """A mutated message for one socket with the reason the worker must give, or None when 20
    draws in a row stayed valid (bounded: the rare mutation that is still valid is redrawn)."""
    for _ in range(20):
        frames = rng.choice(DATA_MUTATIONS if to_data else EXCHANGE_MUTATIONS)(rng)
        reason = predict_data(frames) if to_data else predictor.predict(frames)
        if reason is not None:
            return frames, reason
        report.skipped_valid += 1
    return None


def fuzz(cluster: LocalCluster, target: WorkerProcess, *, count: int, seed: int = 0,
         reply_timeout_s: float = 5.0) -> FuzzReport:
    """Send `count` invalid messages (half to each socket) and collect the figures."""
    rng = random.Random(seed)
    started = target.events("worker_started")[0]
    port = cluster.wait_event(target, "metrics_serving", timeout_s=30)["port"]
    report = FuzzReport(inner_before=target.latest_inner_step(), rss_before_kb=vm_rss_kb(target.process.pid))
    baseline = rejected_counters(port)
    predictor = ExchangePredictor()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDTIMEO, 10_000)  # a full queue blocks (no silent drop), but not forever
    push.connect(started["data_addr"])
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(started["exchange_addr"])
    began = time.monotonic()
    try:
        for index in range(count):
            to_data = index % 2 == 0
            picked = _invalid_message(rng, to_data, predictor, report)
            if picked is None:
                continue
            frames, reason = picked
            report.sent[reason] += 1
            if to_data:
                push.send_multipart(frames)
                report.sent_data += 1
                continue
            dealer.send_multipart(frames)
            report.sent_exchange += 1
            if not dealer.poll(int(reply_timeout_s * 1000), zmq.POLLIN):
                report.missing_replies += 1
                continue
            reply = dealer.recv_multipart()
            kind = msgpack.unpackb(reply[0], raw=False).get("kind")
            report.error_replies += kind == MessageKind.ERROR.value
    finally:
        push.close()
        dealer.close()
        ctx.term()
    report.seconds = time.monotonic() - began
    expected_total = sum(report.sent.values())

    def delta() -> dict[str, float]:
        now = rejected_counters(port)
        return {k: v - baseline.get(k, 0.0) for k, v in now.items() if v - baseline.get(k, 0.0)}

    # The data socket may still hold queued messages: wait (bounded) for the counts to settle.
    try:
        cluster.wait_for(lambda: sum(delta().values()) >= expected_total, timeout_s=30,
                         what="the worker to count every fuzz message")
    except AssertionError:
        pass  # the caller compares what was counted with what was sent
    report.counted = delta()
    report.inner_after_fuzz = target.latest_inner_step()
    report.rss_after_kb = vm_rss_kb(target.process.pid)
    return report
