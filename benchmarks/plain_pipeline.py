"""A plain S-process pipeline of the same model: what hand-written PyTorch gets from the schedule
the runtime's pipeline runs, on the same machine, as the runtime's pipeline is held to it.

    python -m benchmarks.plain_pipeline [--preset tiny] [--stages 2] [--microbatches 4]
        [--batch-size 8] [--seq-len 32] [--steps 100] [--warmup-steps 10] [--device cpu]
        [--transport pipe|zmq]

One process per stage (spawned, `--threads` torch threads each), stage k holding the layers a
worker of stage k holds (build_stage: the same weights as those layers of the whole model).
Each inner step: the first stage forwards its B microbatches one after another, each output
copied into a shared-memory slot and its index sent down a pipe; a later stage forwards what
arrives (the last: loss and backward at once) and sends each input's gradient back the same
way; the first stage backwards each gradient as it returns. Then every stage takes the inner
step of benchmarks/plain_loop.py (clip, AdamW) on its own parameters. Nothing else: no
membership, no routing, no codec, no retries, one thread per process. On CUDA the slots stay
in host memory (a copy to the host and back per hop, as between two machines).

--transport zmq (2 stages): the slot's bytes travel over ZeroMQ PUSH/PULL sockets on
127.0.0.1 instead, received by a thread of each process that copies them into its own slot
and hands the index over a queue, as a worker's data link does: what the runtime's transport
and threads cost without the rest of the runtime.

Every microbatch's loss is scaled by 1 / B, so one step's gradients are those of
plain_loop.py's --microbatches B on the same batches (random tokens, the same
DISTINCT_BATCHES): with grad_clip = 0 the two train alike (tests/benchmarks/).

Prints one JSON line: tokens/s over the timed steps, the rate of each window of --window-steps,
and each step's mean loss.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import queue
import statistics
import threading
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import zmq

from benchmarks.plain_loop import DISTINCT_BATCHES, PlainTrainer, random_batches, synchronize
from noloco_rt.config import OptimConfig
from noloco_rt.membership.embedded_redis import free_port
from noloco_rt.model.llama import PRESETS, build_stage, lm_loss

TRANSPORTS = ("pipe", "zmq")


@dataclasses.dataclass(frozen=True)
class PipelineShape:
    """What every stage's process needs to know: the model, the step, how long to train."""

    preset: str
    stages: int
    microbatches: int
    """B: microbatches per inner step."""
    batch_size: int
    """Sequences per microbatch."""
    seq_len: int
    vocab_size: int
    steps: int
    """Timed steps, after warmup_steps."""
    warmup_steps: int
    device: str
    threads: int
    optim: OptimConfig

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def tokens_per_step(self) -> int:
        return self.microbatches * self.batch_size * self.seq_len


@dataclasses.dataclass(frozen=True)
class PlainPipelineResult:
    tokens_per_step: int
    tokens_per_s: float
    """Over the timed steps, from the first stage's step ends."""
    window_tokens_per_s: tuple[float, ...]
    losses: tuple[float, ...]
    """Each step's mean microbatch loss (warm-up included), from the last stage."""
    compute_s_per_microbatch: tuple[float, ...] = ()
    """Each stage's forward + backward (and loss) seconds per microbatch over the timed steps,
    timed around the calls (on CUDA they time launches unless the device waits)."""
    step_s: float = 0.0
    """Seconds per timed step (the first stage's)."""


class ZmqLink:
    """One end of a stage boundary over ZeroMQ, used as the pipe end it replaces (send an index,
    receive one): `send` pushes the slot's bytes, a receiving thread copies what arrives into
    its own slot and queues the index. Its sockets open in the stage's process, at first use."""

    def __init__(self, push_to: str, pull_from: str, *, binds: bool, send_slots: list[torch.Tensor],
                 receive_slots: list[torch.Tensor]) -> None:
        self.push_to, self.pull_from, self.binds = push_to, pull_from, binds
        self.send_slots, self.receive_slots = send_slots, receive_slots
        self._push: zmq.Socket | None = None
        self._arrived: queue.Queue[int] = queue.Queue()

    def __getstate__(self) -> dict[str, Any]:  # to the stage's process before any socket exists
        return {k: v for k, v in self.__dict__.items() if k != "_arrived"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _arrived=queue.Queue())

    def _open(self) -> zmq.Socket:
        context = zmq.Context.instance()
        push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        for socket, address in ((push, self.push_to), (pull, self.pull_from)):
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(address) if self.binds else socket.connect(address)
        threading.Thread(target=self._receive, args=(pull,), daemon=True).start()
        return push

    def _receive(self, pull: zmq.Socket) -> None:
        while True:
            index_frame, payload = pull.recv_multipart(copy=False)
            index = int.from_bytes(index_frame.bytes, "little")
            slot = self.receive_slots[index]
            slot.copy_(torch.frombuffer(payload.buffer, dtype=slot.dtype).view(slot.shape))
            self._arrived.put(index)

    def send(self, index: int) -> None:
        if self._push is None:
            self._push = self._open()
        view = memoryview(self.send_slots[index].numpy()).cast("B")
        self._push.send_multipart([index.to_bytes(4, "little"), view], copy=False)

    def recv(self) -> int:
        if self._push is None:
            self._push = self._open()
        return self._arrived.get()


@dataclasses.dataclass
class Links:
    """A stage's pipes (or ZeroMQ links) and slots toward its neighbours (None at either end)."""

    up: Connection | ZmqLink | None
    """To the previous stage: slot indices of arrived activations in, of sent gradients out."""
    down: Connection | ZmqLink | None
    """To the next stage: slot indices of sent activations out, of arrived gradients in."""
    inputs: list[torch.Tensor] | None
    """One slot per microbatch: the previous stage writes its activation there."""
    input_grads: list[torch.Tensor] | None
    """One slot per microbatch: this stage writes the gradient of that activation there."""
    outputs: list[torch.Tensor] | None
    """One slot per microbatch: this stage writes its output there."""
    output_grads: list[torch.Tensor] | None
    """One slot per microbatch: the next stage writes the output's gradient there."""


class PlainStage:
    """One stage's model, optimizer and inner step."""

    def __init__(self, shape: PipelineShape, stage: int, links: Links) -> None:
        self.shape, self.links = shape, links
        self.device = torch.device(shape.device)
        self.model = build_stage(shape.preset, vocab_size=shape.vocab_size, stage=stage, num_stages=shape.stages,
                                 seed=0, device=self.device)
        self.trainer = PlainTrainer(self.model, shape.optim, total_steps=shape.total_steps, compiled=False)
        self.batches = random_batches(sequences=shape.microbatches * shape.batch_size, seq_len=shape.seq_len,
                                      vocab_size=shape.vocab_size, device=self.device)
        self.losses: list[torch.Tensor] = []
        self.compute_s = 0.0
        """Seconds inside the model's forward and backward calls (and the loss), all steps."""

    def pieces(self, step: int) -> list[torch.Tensor]:
        """The step's microbatches, (b, T + 1) each: inputs [:, :-1], targets [:, 1:]."""
        return list(self.batches[step % DISTINCT_BATCHES].chunk(self.shape.microbatches))

    def step(self, step: int) -> None:
        if self.links.up is None:
            self._first(step)
        elif self.links.down is None:
            self._last(step)
        else:
            self._middle()
        self.trainer.optimizer_step()

    def _send_down(self, index: int, output: torch.Tensor) -> None:
        assert self.links.outputs is not None and self.links.down is not None
        self.links.outputs[index].copy_(output.detach())
        self.links.down.send(index)

    def _received(self, index: int) -> torch.Tensor:
        assert self.links.inputs is not None
        return self.links.inputs[index].to(self.device, copy=True).requires_grad_()

    def _send_up(self, index: int, hidden_in: torch.Tensor) -> None:
        assert self.links.input_grads is not None and self.links.up is not None and hidden_in.grad is not None
        self.links.input_grads[index].copy_(hidden_in.grad)
        self.links.up.send(index)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The stage's forward, timed into compute_s."""
        started = time.perf_counter()
        with self.trainer.autocast:
            output = self.model(inputs)
        self.compute_s += time.perf_counter() - started
        return output

    def _backward_returned(self, index: int, output: torch.Tensor) -> None:
        assert self.links.output_grads is not None
        gradient = self.links.output_grads[index].to(self.device, output.dtype)  # bfloat16 under autocast
        started = time.perf_counter()
        output.backward(gradient)
        self.compute_s += time.perf_counter() - started

    def _first(self, step: int) -> None:
        assert self.links.down is not None
        outputs = []
        for index, piece in enumerate(self.pieces(step)):
            outputs.append(self._forward(piece[:, :-1]))
            self._send_down(index, outputs[-1])
        for _ in outputs:
            index = self.links.down.recv()
            self._backward_returned(index, outputs[index])

    def _middle(self) -> None:
        assert self.links.up is not None and self.links.down is not None
        held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        forwarded = backwarded = 0
        while backwarded < self.shape.microbatches:
            ready = wait([self.links.up, self.links.down] if forwarded < self.shape.microbatches else [self.links.down])
            if self.links.up in ready and forwarded < self.shape.microbatches:
                index = self.links.up.recv()
                hidden_in = self._received(index)
                output = self._forward(hidden_in)
                held[index] = (hidden_in, output)
                self._send_down(index, output)
                forwarded += 1
            if self.links.down in ready:
                index = self.links.down.recv()
                hidden_in, output = held.pop(index)
                self._backward_returned(index, output)
                self._send_up(index, hidden_in)
                backwarded += 1

    def _last(self, step: int) -> None:
        assert self.links.up is not None
        pieces, losses = self.pieces(step), []
        for _ in pieces:
            index = self.links.up.recv()
            hidden_in = self._received(index)
            logits = self._forward(hidden_in)
            started = time.perf_counter()
            loss = lm_loss(logits.float(), pieces[index][:, 1:])
            (loss / self.shape.microbatches).backward()
            self.compute_s += time.perf_counter() - started
            losses.append(loss.detach())
            self._send_up(index, hidden_in)
        self.losses.append(torch.stack(losses).mean())


def _run_stage(shape: PipelineShape, stage: int, links: Links, results: Any) -> None:
    """A stage's process: train every step, then report its step end times (and the losses)."""
    try:
        torch.set_num_threads(shape.threads)
        plain = PlainStage(shape, stage, links)
        ends = []
        for step in range(shape.total_steps):
            if step == shape.warmup_steps:
                plain.compute_s = 0.0  # from here on: the timed steps'
            plain.step(step)
            synchronize(plain.device)
            ends.append(time.perf_counter())
        per_microbatch = plain.compute_s / (shape.steps * shape.microbatches)
        results.put((stage, ends, [float(loss) for loss in plain.losses], per_microbatch, None))
    except BaseException as error:  # the parent waits on the queue: say what failed rather than hang it
        results.put((stage, [], [], 0.0, f"{type(error).__name__}: {error}"))
        raise


def window_rates(ends: list[float], *, warmup_steps: int, window_steps: int, tokens_per_step: int) -> list[float]:
    """Tokens/s of each whole window of `window_steps` steps after the first `warmup_steps`
    (`ends`: each step's end time)."""
    timed = ends[warmup_steps - 1:] if warmup_steps else ends
    return [window_steps * tokens_per_step / (timed[i + window_steps] - timed[i])
            for i in range(0, len(timed) - window_steps, window_steps)]


def _collect(results: Any, children: list[Any], timeout_s: float) -> dict[int, tuple[list[float], list[float], float]]:
    """Every stage's report; RuntimeError when a stage reports a failure, dies without a
    report (killed, or a crash below Python), or the time is up."""
    reports: dict[int, tuple[list[float], list[float], float]] = {}
    deadline = time.monotonic() + timeout_s
    while len(reports) < len(children):
        try:
            stage, ends, losses, compute_s, error = results.get(timeout=1.0)
        except queue.Empty:
            dead = [k for k, child in enumerate(children) if child.exitcode not in (None, 0) and k not in reports]
            if dead:
                raise RuntimeError(f"plain pipeline: stage {dead[0]} exited with {children[dead[0]].exitcode} "
                                   "without a result") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"plain pipeline: no result within {timeout_s:.0f} s") from None
            continue
        if error is not None:
            raise RuntimeError(f"plain pipeline: stage {stage} failed: {error}")
        reports[stage] = (ends, losses, compute_s)
    return reports


def _zmq_boundary(shape: PipelineShape, dim: int) -> tuple[ZmqLink, ZmqLink]:
    """The two ends of the one boundary of a 2-stage pipeline over ZeroMQ, each with slots of
    its own (copied into its process, not shared)."""
    def slots() -> list[torch.Tensor]:
        return [torch.zeros(shape.batch_size, shape.seq_len, dim) for _ in range(shape.microbatches)]

    forward, backward = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    first = ZmqLink(forward, backward, binds=True, send_slots=slots(), receive_slots=slots())
    last = ZmqLink(backward, forward, binds=False, send_slots=slots(), receive_slots=slots())
    return first, last


def _stage_links(shape: PipelineShape, transport: str, context: Any) -> list[Links]:
    """Each stage's links: over pipes, one pipe and two shared lists of slots per boundary
    (activations, gradients); over ZeroMQ, each end with slots of its own."""
    dim = PRESETS[shape.preset].dim
    if transport == "zmq":
        first, last = _zmq_boundary(shape, dim)
        return [Links(up=None, down=first, inputs=None, input_grads=None, outputs=first.send_slots,
                      output_grads=first.receive_slots),
                Links(up=last, down=None, inputs=last.receive_slots, input_grads=last.send_slots, outputs=None,
                      output_grads=None)]
    slots = [([torch.zeros(shape.batch_size, shape.seq_len, dim).share_memory_() for _ in range(shape.microbatches)],
              [torch.zeros(shape.batch_size, shape.seq_len, dim).share_memory_() for _ in range(shape.microbatches)])
             for _ in range(shape.stages - 1)]
    pipes = [context.Pipe() for _ in range(shape.stages - 1)]
    links = []
    for stage in range(shape.stages):
        above, below = (stage - 1, stage) if stage else (None, stage)
        has_below = below < shape.stages - 1
        links.append(Links(up=pipes[above][1] if above is not None else None,
                           down=pipes[below][0] if has_below else None,
                           inputs=slots[above][0] if above is not None else None,
                           input_grads=slots[above][1] if above is not None else None,
                           outputs=slots[below][0] if has_below else None,
                           output_grads=slots[below][1] if has_below else None))
    return links


def run_plain_pipeline(shape: PipelineShape, *, window_steps: int = 10, timeout_s: float = 600.0,
                       transport: str = "pipe") -> PlainPipelineResult:
    """Train `shape` in one spawned process per stage, its stages joined by `transport` (pipe:
    shared slots and pipes; zmq: ZeroMQ, 2 stages); raises RuntimeError if a stage fails or
    does not finish within timeout_s."""
    if transport not in TRANSPORTS or (transport == "zmq" and shape.stages != 2):
        raise ValueError(f"transport is pipe (any stages) or zmq (2 stages), not {transport} with "
                         f"{shape.stages} stages")
    if shape.stages < 2 or shape.stages > PRESETS[shape.preset].n_layers:
        raise ValueError(f"need 2 <= stages <= {PRESETS[shape.preset].n_layers} (the preset's layers), "
                         f"got {shape.stages}")
    if shape.microbatches < 1 or shape.steps < 1 or shape.warmup_steps < 1:
        raise ValueError(f"need microbatches, steps and warmup_steps >= 1, got {shape.microbatches}, "
                         f"{shape.steps}, {shape.warmup_steps}")
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    children = []
    for stage, links in enumerate(_stage_links(shape, transport, context)):
        children.append(context.Process(target=_run_stage, args=(shape, stage, links, results), daemon=True))
    for child in children:
        child.start()
    try:
        reports = _collect(results, children, timeout_s)
    except BaseException:  # the other stages wait on their pipes for ever: end them now
        for child in children:
            child.kill()
        raise
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
    ends = reports[0][0]
    timed_s = ends[-1] - ends[shape.warmup_steps - 1]
    return PlainPipelineResult(
        tokens_per_step=shape.tokens_per_step, tokens_per_s=shape.steps * shape.tokens_per_step / timed_s,
        window_tokens_per_s=tuple(window_rates(ends, warmup_steps=shape.warmup_steps, window_steps=window_steps,
                                               tokens_per_step=shape.tokens_per_step)),
        losses=tuple(reports[shape.stages - 1][1]),
        compute_s_per_microbatch=tuple(reports[stage][2] for stage in range(shape.stages)),
        step_s=timed_s / shape.steps)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--window-steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per stage")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--transport", choices=TRANSPORTS, default="pipe",
                        help="between the stages: pipes and shared slots, or ZeroMQ and a receiving thread (2 stages)")
    args = parser.parse_args(argv)
    if args.preset not in PRESETS:
        parser.error(f"--preset is one of {', '.join(PRESETS)}")
    shape = PipelineShape(preset=args.preset, stages=args.stages, microbatches=args.microbatches,
                          batch_size=args.batch_size, seq_len=args.seq_len, vocab_size=args.vocab_size,
                          steps=args.steps, warmup_steps=args.warmup_steps, device=args.device,
                          threads=args.threads, optim=OptimConfig())
    try:
        result = run_plain_pipeline(shape, window_steps=args.window_steps, transport=args.transport)
    except ValueError as error:
        parser.error(str(error))
    fields = dataclasses.asdict(result)
    fields["median_window_tokens_per_s"] = statistics.median(result.window_tokens_per_s or (result.tokens_per_s,))
    print(json.dumps(fields))


if __name__ == "__main__":
    main()
