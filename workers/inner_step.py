"""The inner step (docs/architecture.md §3): once the step's forwards are all back, step the optimizer,
and every H inner steps the outer step."""

from __future__ import annotations

from typing import Any

import torch

from noloco_rt.algo.replica import StageReplica
from noloco_rt.host_reads import HostReadCounter
from noloco_rt.logs import EventLog
from workers.counters import Counters, TokenRate
from workers.data_path.role import Role
from workers.device import memory_fields
from workers.faults.slowdown import InjectedSlowdown
from workers.metrics import WorkerMetrics
from workers.outer.step import OuterStep

PROGRESS_LOG_EVERY = 10


class InnerStep:
    def __init__(self, *, data_path: Role, replica: StageReplica, outer: OuterStep, counters: Counters,
                 tokens: TokenRate, metrics: WorkerMetrics, log: EventLog, slowdown: float = 1.0,
                 count_host_reads: bool = False) -> None:
        self.data_path = data_path
        self.replica = replica
        self.outer = outer
        self.counters = counters
        self.tokens = tokens
        self.metrics = metrics
        self.log = log
        self.slowdown = InjectedSlowdown(slowdown)
        """FAULT INJECTION (worker.fault_slowdown): a device this factor slower."""
        self.last_loss: float | None = None
        """Mean training loss of the inner step at the last progress line (stages that compute
        the loss): read from the device at that cadence only."""
        self._unread_loss: torch.Tensor | None = None
        self.host_reads = HostReadCounter() if count_host_reads else None
        """worker.count_host_reads: the training thread's reads of device values, per progress line."""

    def maybe_step(self) -> None:
        """Step if the data path is ready: no optimizer step touches weights an in-flight
        microbatch still needs."""
        if self.data_path.ready_to_step():
            self._close_step()

    def take_last_steps(self) -> None:
        """The run is over: a partial inner step's gradients are stepped rather than thrown away,
        and the outer step its data made due is taken (its partners took theirs). Without one,
        an outer step a partner has pushed for is taken: a later stage's worker none of whose
        microbatches came from the run's last outer-step boundary (its peers took them all)
        would otherwise leave that partner's round without it."""
        if self.data_path.holds_partial_step():
            self._close_step()
        elif (pulled_to := self.outer.pulled_to()) is not None:
            self.outer.take(pulled_to=pulled_to)

    def _close_step(self) -> None:
        if self.replica.has_gradients():
            self._step()
        else:
            self.replica.inner.clear_gradients()
        self.data_path.end_step()
        self.metrics.queue_depth.set(self.data_path.queue_depth())

    def _step(self) -> None:
        self.replica.finish_inner_step()
        self.slowdown.after_compute()
        self.counters.inner_steps += 1
        self.metrics.inner_steps.inc()
        step = self.counters.inner_steps
        if (loss := self.data_path.take_step_loss()) is not None:
            self._unread_loss = loss
        self.outer.after_inner_step()  # an overlapped outer step's correction, if its partners' states are in
        if step % PROGRESS_LOG_EVERY == 0 or step == 1:
            self._log_progress(step)
        if self.outer.due(self.data_path.data_step()):
            self.outer.take()
        elif (pulled_to := self.outer.pulled_to()) is not None:
            self.outer.take(pulled_to=pulled_to)
        self.slowdown.resume()

    def _log_progress(self, step: int) -> None:
        """The train_progress line: the one place an inner step reads values back from the device."""
        fields: dict[str, Any] = {}
        if self.host_reads is not None:  # counted before this line's own reads
            fields["host_reads"] = self.host_reads.take()
        if (loss := self.read_loss()) is not None:
            fields["loss"] = round(loss, 4)
        fields |= memory_fields(self.replica.parameters[0].device)
        # clock_step: the run's step this worker is at (stage 0: its clock; later stages: their
        # data's), ahead of inner_step after pulls or, downstream, after a restart's gap.
        self.log.info("train_progress", inner_step=step, clock_step=self.data_path.data_step(),
                      tokens_per_s=round(self.tokens.per_s(), 1),
                      lr=self.replica.inner.current_lr(), **fields)
        if self.host_reads is not None:
            self.host_reads.take()  # this line's reads are not the next window's

    def read_loss(self) -> float | None:
        """The newest inner step's loss, read from the device (None: no loss here since the last read)."""
        if self._unread_loss is None:
            return None
        self.last_loss = float(self._unread_loss)
        self._unread_loss = None
        self.metrics.loss.set(self.last_loss)
        return self.last_loss
