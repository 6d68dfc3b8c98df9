"""What one peer can make a later stage hold: forwards queue while the training thread waits
(for gradients, for its step's end), and a sender flooding them, or all senders together, are
cut off at a bound counted as `over_budget`, while other senders' forwards still get in."""

from __future__ import annotations

import threading

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import load_config
from noloco_rt.model.staged import preset_model
from noloco_rt.net import messages
from noloco_rt.net.wire import MessageKind
from workers.counters import Counters
from workers.data_path.context import DataContext
from workers.data_path.receiver import ALL_SENDERS_STEPS, PER_SENDER_STEPS, ForwardIntake
from workers.device import HostStaging
from workers.metrics import WorkerMetrics


class QuietLog:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _intake() -> ForwardIntake:
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": 2, "max_inflight": 2}}])
    ctx = DataContext(cfg=cfg, stage=1, worker_id="me", model=preset_model(cfg), replica=StageReplica.create(cfg, 1),
                      staging=HostStaging(torch.device("cpu")), data=None, peers=None, counters=Counters(),
                      metrics=WorkerMetrics(), log=QuietLog(), leave_requested=threading.Event())
    return ForwardIntake(ctx)


def _forward(cfg, sender: str, microbatch: int) -> messages.DataMessage:
    batch, seq, dim = cfg.data.batch_size, cfg.model.seq_len, 64
    return messages.DataMessage(kind=MessageKind.FORWARD, sender=sender, microbatch_id=microbatch, attempt=0,
                                stage=0, tensors=[torch.zeros(batch, seq, dim), torch.zeros(batch, seq, dtype=torch.long)],
                                reply_to="tcp://127.0.0.1:1")


def test_one_flooding_sender_is_cut_off_and_others_still_get_in():
    intake = _intake()
    cfg, budget = intake.ctx.cfg, intake.ctx.budget
    for index in range(100):
        intake.offer(_forward(cfg, "flooder", index), accepting=True)
    assert len(intake) == PER_SENDER_STEPS * budget == 8
    assert intake.ctx.rejected.counts() == {"over_budget": 100 - 8}
    intake.offer(_forward(cfg, "honest", 0), accepting=True)
    assert len(intake) == 9 and intake.ctx.rejected.counts()["over_budget"] == 92
    # Taken forwards free their sender's room again.
    taken = [intake.take() for _ in range(3)]
    assert [m.sender for m in taken] == ["flooder"] * 3
    for index in range(100, 105):
        intake.offer(_forward(cfg, "flooder", index), accepting=True)
    assert intake.queued_by_sender == {"flooder": 8, "honest": 1}
    intake.clear()
    assert len(intake) == 0 and not intake.queued_by_sender


def test_many_senders_together_are_bounded_too():
    intake = _intake()
    cfg, budget = intake.ctx.cfg, intake.ctx.budget
    for sender in range(40):
        for index in range(2):
            intake.offer(_forward(cfg, f"s{sender}", index), accepting=True)
    assert len(intake) == ALL_SENDERS_STEPS * budget == 32
    assert intake.ctx.rejected.counts() == {"over_budget": 80 - 32}
    assert sum(intake.queued_by_sender.values()) == len(intake)
