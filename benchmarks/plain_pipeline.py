"""A plain S-process pipeline of the same model: what hand-written PyTorch gets from the schedule
the runtime's pipeline runs, on the same machine, as the runtime's pipeline is held to it.

    python -m benchmarks.plain_pipeline [--preset tiny] [--stages 2] [--microbatches 4]
        [--batch-size 8] [--seq-len 32] [--steps 100] [--warmup-steps 10] [--device cpu]

One process per stage (spawned, `--threads` torch threads each), stage k holding the layers a
worker of stage k holds (build_stage: the same weights as those layers of the whole model).
Each inner step: the first stage forwards its B microbatches one after another, each output
copied into a shared-memory slot and its index sent down a pipe; a later stage forwards what
arrives (the last: loss and backward at once) and sends each input's gradient back the same
way; the first stage backwards each gradient as it returns. Then every stage takes the inner
step of benchmarks/plain_loop.py (clip, AdamW) on its own parameters. Nothing else: no
membership, no routing, no codec, no retries, one thread per process. On CUDA the slots stay
in host memory (a copy to the host and back per hop, as between two machines).

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
import time
from multiprocessing.connection import Connection, wait
from typing import Any

import torch

from benchmarks.plain_loop import DISTINCT_BATCHES, PlainTrainer, random_batches, synchronize
from noloco_rt.config import OptimConfig
from noloco_rt.model.llama import PRESETS, build_stage, lm_loss


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


@dataclasses.dataclass
class Links:
    """A stage's pipes and shared slots toward its neighbours (None at either end)."""

    up: Connection | None
    """To the previous stage: slot indices of arrived activations in, of sent gradients out."""
    down: Connection | None
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


def run_plain_pipeline(shape: PipelineShape, *, window_steps: int = 10, timeout_s: float = 600.0) -> PlainPipelineResult:
    """Train `shape` in one spawned process per stage; raises RuntimeError if a stage fails or
    does not finish within timeout_s."""
    if shape.stages < 2 or shape.stages > PRESETS[shape.preset].n_layers:
        raise ValueError(f"need 2 <= stages <= {PRESETS[shape.preset].n_layers} (the preset's layers), "
                         f"got {shape.stages}")
    if shape.microbatches < 1 or shape.steps < 1 or shape.warmup_steps < 1:
        raise ValueError(f"need microbatches, steps and warmup_steps >= 1, got {shape.microbatches}, "
                         f"{shape.steps}, {shape.warmup_steps}")
    context = multiprocessing.get_context("spawn")
    dim = PRESETS[shape.preset].dim
    # one boundary between each stage and the next: its activation and gradient slots, a pipe
    slots = [([torch.zeros(shape.batch_size, shape.seq_len, dim).share_memory_() for _ in range(shape.microbatches)],
              [torch.zeros(shape.batch_size, shape.seq_len, dim).share_memory_() for _ in range(shape.microbatches)])
             for _ in range(shape.stages - 1)]
    pipes = [context.Pipe() for _ in range(shape.stages - 1)]
    results = context.Queue()
    children = []
    for stage in range(shape.stages):
        above, below = (stage - 1, stage) if stage else (None, stage)
        links = Links(up=pipes[above][1] if above is not None else None,
                      down=pipes[below][0] if below < shape.stages - 1 else None,
                      inputs=slots[above][0] if above is not None else None,
                      input_grads=slots[above][1] if above is not None else None,
                      outputs=slots[below][0] if below < shape.stages - 1 else None,
                      output_grads=slots[below][1] if below < shape.stages - 1 else None)
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
    args = parser.parse_args(argv)
    if args.preset not in PRESETS:
        parser.error(f"--preset is one of {', '.join(PRESETS)}")
    shape = PipelineShape(preset=args.preset, stages=args.stages, microbatches=args.microbatches,
                          batch_size=args.batch_size, seq_len=args.seq_len, vocab_size=args.vocab_size,
                          steps=args.steps, warmup_steps=args.warmup_steps, device=args.device,
                          threads=args.threads, optim=OptimConfig())
    try:
        result = run_plain_pipeline(shape, window_steps=args.window_steps)
    except ValueError as error:
        parser.error(str(error))
    fields = dataclasses.asdict(result)
    fields["median_window_tokens_per_s"] = statistics.median(result.window_tokens_per_s or (result.tokens_per_s,))
    print(json.dumps(fields))


if __name__ == "__main__":
    main()
