"""The four data-path roles (docs/architecture.md §3), one class each, chosen once by `data_path_for`.

- Alone (a one-stage pipeline): reads a batch, computes the loss, backward.
- First: reads a batch, forwards it to a next-stage worker, applies the gradient that returns.
- Middle: forwards what it receives, applies the gradient that returns, sends its input
  gradient back to the exact sender.
- Last: computes the loss on what it receives, backward at once, gradient back to the sender.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from noloco_rt.net import messages
from workers.data_path.context import DataContext
from workers.data_path.downstream import Downstream
from workers.data_path.role import ReadsData, Role, TakesForwards


@dataclass(frozen=True)
class SentForward:
    """What a gradient from downstream is applied to: our output (B, T, C) with its graph,
    and for a middle stage our input and the upstream message to answer."""

    output: torch.Tensor
    hidden_in: torch.Tensor | None = None
    upstream: messages.DataMessage | None = None


class SendsDownstream(Role):
    """A stage with a next stage: forwards in flight there, gradients applied as they return."""

    def __init__(self, ctx: DataContext) -> None:
        super().__init__(ctx)
        self.downstream = Downstream(ctx)

    def in_flight(self) -> int:
        return len(self.downstream)

    def _on_gradient(self, message: messages.DataMessage) -> None:
        ctx = self.ctx
        entry = self.downstream.resolve(message.microbatch_id, message.attempt,
                                        received_at=message.received_at, held_s=message.held_s)
        if entry is None:
            ctx.discard("late_or_duplicate")
            return
        sent: SentForward = entry.context
        grad = ctx.staging.to_device(message.tensors[0]).to(sent.output.dtype)  # the output's own dtype, whatever autocast made it
        if grad.shape != sent.output.shape:
            ctx.rejected.count("gradient_shape")
            ctx.drop(message.microbatch_id, "gradient_shape")
            return
        sent.output.backward(grad)
        self.backward_done(sent)
        ctx.replica.record_microbatch()
        ctx.counters.microbatches += 1
        ctx.metrics.backwarded.inc()

    def backward_done(self, sent: SentForward) -> None:
        """After our backward of a returned gradient (a middle stage passes it on)."""

    def wind_down(self, deadline: float) -> None:
        """Leaving: wait for what is in flight until `deadline`, then give the rest up, counted
        so that sent == trained + dropped holds for every graceful exit (the chaos driver checks it)."""
        super().wind_down(deadline)
        while self.in_flight() and time.monotonic() < deadline:
            self.receiver.poll(accept_forwards=False)
            self.downstream.drop_expired("leaving")
        self.downstream.drop_expired("leaving", now=float("inf"))


class Alone(ReadsData):
    """One stage holds the whole model: nothing to pipeline, so a preset's step goes through
    as one batch of all its microbatches (fewer, larger launches; the mean token loss, and so
    the gradient, is that of the microbatches averaged, as they hold equal token counts). The
    memory plan sizes a one-stage worker for that batch. Your own model's batches go one by
    one: its loss need not be a mean over the batch."""

    def tick(self) -> None:
        ctx = self.ctx
        merged = ctx.model.train_batches is None
        count = ctx.budget - self.accepted_this_step if merged else 1
        inputs, targets = self.next_batches(count)
        self.accepted_this_step += count
        self._train_on(ctx.run_stage(ctx.staging.to_device(inputs)), targets)

    def next_batches(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """`count` microbatches of the stream, in order, as one batch."""
        if count == 1:
            return self.next_batch()
        pairs = [self.next_batch() for _ in range(count)]
        return torch.cat([inputs for inputs, _ in pairs]), torch.cat([targets for _, targets in pairs])


class First(ReadsData, SendsDownstream):
    def __init__(self, ctx: DataContext) -> None:
        super().__init__(ctx)
        self.sent_this_step = 0

    def tick(self) -> None:
        self._send_one_or_receive()
        self.downstream.retry_expired()

    def _send_one_or_receive(self) -> None:
        if self.sent_this_step >= self.ctx.budget:
            self.receiver.poll(accept_forwards=False)  # the step's forwards are out: wait for gradients
            return
        origin_step = self.ctx.counters.clock_steps + 1  # the step being built, on our clock
        peer = self.downstream.choose(origin_step)
        if peer is None:
            self.receiver.poll(accept_forwards=False)  # nobody downstream yet: keep serving gradients
            self.ctx.peers.refresh_soon()
            return
        inputs, targets = self.next_batch()
        output = self.ctx.run_stage(self.ctx.staging.to_device(inputs))  # (B, T, C) with its graph
        self.sent_this_step += 1
        self.downstream.forward(output, targets, SentForward(output), peer, origin_step=origin_step)

    def ready_to_step(self) -> bool:
        return self.sent_this_step >= self.ctx.budget and self.in_flight() == 0

    def end_step(self) -> None:
        super().end_step()
        self.sent_this_step = 0


class Middle(TakesForwards, SendsDownstream):
    def tick(self) -> None:
        self.take_forwards()
        self.downstream.retry_expired()

    def on_forward(self, message: messages.DataMessage, hidden_in: torch.Tensor) -> None:
        output = self.ctx.run_stage(hidden_in)
        self.downstream.forward(output, message.tensors[1], SentForward(output, hidden_in, message),
                                self.downstream.choose(message.origin_step), origin_step=message.origin_step)

    def backward_done(self, sent: SentForward) -> None:
        assert sent.upstream is not None and sent.hidden_in is not None
        self._reply_gradient(sent.upstream, sent.hidden_in.grad)


class Last(TakesForwards):
    def on_forward(self, message: messages.DataMessage, hidden_in: torch.Tensor) -> None:
        self._train_on(self.ctx.run_stage(hidden_in), message.tensors[1])
        self._reply_gradient(message, hidden_in.grad)
        self.ctx.counters.microbatches += 1


def data_path_for(ctx: DataContext, num_stages: int) -> Role:
    """The role of a worker of stage ctx.stage in a pipeline of num_stages."""
    first, last = ctx.stage == 0, ctx.stage == num_stages - 1
    if first and last:
        return Alone(ctx)
    if first:
        return First(ctx)
    return Last(ctx) if last else Middle(ctx)
