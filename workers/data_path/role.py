"""What every data-path role shares: the step budget, the loss, gradients sent back upstream.

A worker's role (alone, first, middle or last stage) is decided once, when its data path
is built (workers/data_path/roles.py); each role is a class whose `tick` reads top to
bottom. The parts here are what several roles share, written once.
"""

from __future__ import annotations

import time
import zlib
from typing import Any

import torch

from noloco_rt.data import DataCursor, ShardedBatches, load_corpus
from noloco_rt.membership.table import Membership
from noloco_rt.model.staged import CountedBatches
from noloco_rt.net import messages
from workers.data_path.context import DataContext
from workers.data_path.receiver import ForwardIntake, Receiver
from workers.finish import FinishRule, StepLimit, UpstreamFinished


class Role:
    """The base: counts forwards accepted this step; trains on a loss; replies upstream."""

    intake: ForwardIntake | None = None
    """Where forwards from the previous stage queue (stages that take them)."""

    def __init__(self, ctx: DataContext) -> None:
        self.ctx = ctx
        self.accepted_this_step = 0
        self._losses: list[torch.Tensor] = []
        """Detached losses on the stage's device, never read one by one (each read waits for
        the device)."""
        self.receiver = Receiver(ctx, on_gradient=self._on_gradient, intake=self.intake)

    def tick(self) -> None:
        """One turn of the training loop's data path."""
        raise NotImplementedError

    def ready_to_step(self) -> bool:
        """The step's budget of forwards is done and every gradient is back or dropped."""
        return self.accepted_this_step >= self.ctx.budget and self.in_flight() == 0

    def end_step(self) -> None:
        self.accepted_this_step = 0

    def holds_partial_step(self) -> bool:
        """Forwards accepted this step, fewer than the budget, all trained: at the end of the run
        a later stage's share of the last steps' data need not fill an inner step."""
        return 0 < self.accepted_this_step < self.ctx.budget and self.in_flight() == 0

    def data_step(self) -> int:
        """The clock this worker's outer steps follow (noloco_rt/outer/schedule.py): for a later
        stage the furthest stage-0 step of the data trained on so far; for stage 0 its own."""
        raise NotImplementedError

    def in_flight(self) -> int:
        return 0

    def queued(self) -> int:
        return len(self.intake) if self.intake is not None else 0

    def queue_depth(self) -> int:
        """Forwards waiting or in flight at this worker (the routing hint it advertises)."""
        return self.in_flight() + self.queued()

    def idle(self) -> bool:
        return self.queue_depth() == 0

    def take_step_loss(self) -> torch.Tensor | None:
        """The mean training loss of the microbatches since the last call, still on the device
        (stages that compute the loss; None otherwise). Reading it waits for the device: the
        inner step does so at the progress cadence only."""
        if not self._losses:
            return None
        loss = torch.stack(self._losses).mean()
        self._losses = []
        return loss

    def finish_rule(self, membership: Membership, max_steps: int, *, upstream_lost_s: float,
                    upstream_gone_s: float) -> FinishRule:
        return UpstreamFinished(membership, self.ctx.stage, idle=self.idle, lost_s=upstream_lost_s,
                                gone_s=upstream_gone_s, log=self.ctx.log,
                                received_from_upstream=lambda: self.intake is not None and self.intake.upstream_seen,
                                heard_from_upstream_at=lambda: self.intake.heard_at if self.intake is not None else None)

    def open_data(self, name: str, cursor: DataCursor | None) -> None:
        """Stages that read the corpus open their shard here; others have none."""

    def cursor_state(self) -> dict[str, Any] | None:
        return None

    def wind_down(self, deadline: float) -> None:
        """Leaving: queued forwards are never taken (their senders re-route them)."""
        if self.intake is not None:
            self.intake.clear()

    def _on_gradient(self, message: messages.DataMessage) -> None:
        self.ctx.discard("late_or_duplicate")  # nothing of ours is in flight downstream

    def _train_on(self, output: torch.Tensor, targets: torch.Tensor) -> None:
        """The model's loss of `output` against `targets` (a preset: (B, T, vocab) logits and
        (B, T) ids), backward at once."""
        ctx = self.ctx
        loss = ctx.model.loss(output.float(), ctx.staging.to_device(targets))  # float32 loss under autocast too
        loss.backward()
        ctx.replica.record_microbatch()
        self._losses.append(loss.detach())
        ctx.tokens.add(targets.numel())

    def _reply_gradient(self, upstream: messages.DataMessage, grad: torch.Tensor) -> None:
        """Send the input gradient back to the exact worker that sent the forward."""
        ctx = self.ctx
        host = ctx.to_wire(grad, gradient=True)
        held_s = None if upstream.received_at is None else time.monotonic() - upstream.received_at
        reply = messages.backward(ctx.cfg.run.run_id, ctx.worker_id, ctx.stage, upstream.microbatch_id,
                                  upstream.attempt, host.tensors, held_s=held_s, ready=host.ready)
        # If no connection takes it, the origin died or is unreachable: its microbatch is lost with it.
        ctx.data.send(upstream.reply_to, reply.parts(), ready=reply.ready,
                      on_failure=lambda: ctx.drop(upstream.microbatch_id, "origin_unreachable"))


class ReadsData(Role):
    """The first stage: reads its own shard of the corpus; done after max_steps inner steps."""

    batches: ShardedBatches | CountedBatches | None = None

    def open_data(self, name: str, cursor: DataCursor | None) -> None:
        cfg = self.ctx.cfg
        # Each first-stage worker reads its own stream, fixed by its name, so a restarted
        # worker resumes the same stream from its checkpointed cursor.
        seed = (cfg.run.seed * 1_000_003 + zlib.crc32(name.encode())) % 2**32
        if self.ctx.model.train_batches is not None:  # your own model's data
            self.batches = CountedBatches(self.ctx.model.train_batches, seed=seed, cursor=cursor)
            return
        corpus = load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
        self.batches = ShardedBatches(corpus.train, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size,
                                      shard=0, num_shards=1, seed=seed, cursor=cursor)

    def cursor_state(self) -> dict[str, Any] | None:
        return self.batches.cursor.state_dict() if self.batches else None

    def data_step(self) -> int:
        """Our own clock: inner steps, plus those skipped when a partner pulled us ahead."""
        return self.ctx.counters.clock_steps

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.batches is None:
            raise RuntimeError("open_data() must be called before training")
        return self.batches.next_batch()

    def finish_rule(self, membership: Membership, max_steps: int, *, upstream_lost_s: float,
                    upstream_gone_s: float) -> FinishRule:
        return StepLimit(self.ctx.counters, max_steps)


class TakesForwards(Role):
    """A later stage: takes forwards from the previous stage, up to the step budget."""

    def __init__(self, ctx: DataContext) -> None:
        self.intake = ForwardIntake(ctx)
        super().__init__(ctx)
        self._data_step: int | None = None

    def data_step(self) -> int:
        """Forwards that do not say their origin step (an older sender): our own count."""
        return self._data_step if self._data_step is not None else self.ctx.counters.inner_steps

    def tick(self) -> None:
        self.take_forwards()

    def take_forwards(self) -> None:
        """Receive one message; compute on queued forwards while the step's budget allows."""
        assert self.intake is not None
        self.receiver.poll(accept_forwards=True)
        while len(self.intake) and self.accepted_this_step < self.ctx.budget:
            message = self.intake.take()
            self.accepted_this_step += 1
            if message.origin_step is not None:
                self._data_step = max(self._data_step or 0, message.origin_step)
            self.on_forward(message, self.ctx.staging.to_device(message.tensors[0]).requires_grad_(True))

    def on_forward(self, message: messages.DataMessage, hidden_in: torch.Tensor) -> None:
        """Compute on one accepted forward; `hidden_in` (B, T, C) requires grad."""
        raise NotImplementedError
