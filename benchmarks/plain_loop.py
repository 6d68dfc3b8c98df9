"""The baseline `make gpu-check` holds the runtime against: a plain single-process PyTorch
training loop of the whole model, eager or torch.compile'd, on random tokens.

    python -m benchmarks.plain_loop [--preset 125m] [--mode eager|compiled|cuda-graphs] [--sequences 32]
        [--seq-len 1024] [--steps 30] [--warmup-steps 10] [--device cuda] [--microbatches 1]

It trains as a worker does, with one batch per step: the same model (noloco_rt.model.llama), bfloat16
autocast on CUDA (float32 on CPU, as model.precision = auto), the runtime's inner AdamW
(optim section: lr schedule, betas, weight decay, grad clipping; the same kernel: fused). It prints one
JSON line: tokens/s over the steps after warm-up (compiling happens in warm-up), peak memory
(torch.cuda.max_memory_allocated; 0 on CPU) and the last loss. cuda-graphs is compiled in
torch.compile's reduce-overhead mode (CUDA graphs), its gradients kept in buffers of their own
(a replay reuses its outputs' memory), as a worker with model.cuda_graphs = on does.

--microbatches M splits each step's batch into M microbatches of sequences / M, each one's loss
backwarded at once (scaled by 1 / M, so the gradient is the batch's mean), then one optimizer
step: the gradient accumulation a worker alone does over its in-flight microbatches
(benchmarks/overhead.py). The JSON line then also says "microbatches".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass

import torch

from noloco_rt.algo.optim import adamw_kernel, lr_at
from noloco_rt.config import OptimConfig
from noloco_rt.model.llama import PipelineStage, build_stage, lm_loss

MODES = ("eager", "compiled", "cuda-graphs")
DISTINCT_BATCHES = 4
"""Random batches made up front and cycled: no data loading, and no RNG inside the timed steps."""


@dataclass(frozen=True)
class PlainLoopResult:
    mode: str
    tokens_per_step: int
    tokens_per_s: float
    peak_mib: float
    """Peak memory allocated on the GPU; 0 on CPU."""
    loss: float
    """The last step's loss."""
    microbatches: int = 1
    """Microbatches each step's batch is split into, their gradients accumulated."""
    window_tokens_per_s: tuple[float, ...] = ()
    """With window_steps: the rate of each window of that many timed steps, in order."""


def compile_skip_reason(device: torch.device) -> str | None:
    """Why torch.compile is not measured on this device, or None when it is."""
    if device.type != "cuda":
        return "torch.compile is measured on CUDA only (on CPU, inductor compiles C++ for minutes)"
    return None


def random_batches(*, sequences: int, seq_len: int, vocab_size: int, device: torch.device) -> list[torch.Tensor]:
    """DISTINCT_BATCHES token batches, each (sequences, seq_len + 1): inputs and shifted targets."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(vocab_size, (sequences, seq_len + 1), generator=generator).to(device)
            for _ in range(DISTINCT_BATCHES)]


class PlainTrainer:
    """The model, its AdamW and one training step, as a worker holding every layer runs them."""

    def __init__(self, model: PipelineStage, optim: OptimConfig, *, total_steps: int, compiled: bool,
                 microbatches: int = 1, cuda_graphs: bool = False) -> None:
        if microbatches < 1:
            raise ValueError(f"need microbatches >= 1, got {microbatches}")
        self.microbatches = microbatches
        self.device = next(model.parameters()).device
        self.params = list(model.parameters())
        self.forward = torch.compile(model, mode="reduce-overhead" if cuda_graphs else None) if compiled else model
        self.keeps_grads = cuda_graphs
        if cuda_graphs:  # backward adds into these in place, never installs a graph's output
            for param in self.params:
                param.grad = torch.zeros_like(param)
        self.optim = optim
        self.total_steps = total_steps
        self.steps_taken = 0
        on_cuda = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2),
                                           weight_decay=optim.weight_decay, **adamw_kernel(self.device))
        # bfloat16 matmuls on CUDA, float32 on CPU: what model.precision = auto gives a worker
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()

    def _backward(self, batch: torch.Tensor, scale: float | None) -> torch.Tensor:
        """Forward and backward of one (b, T + 1) batch, its loss times `scale` when given."""
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (b, T) each
        with self.autocast:
            logits = self.forward(inputs)  # (b, T, V)
        loss = lm_loss(logits.float(), targets)
        (loss if scale is None else loss * scale).backward()
        return loss.detach()

    def accumulate_gradients(self, batch: torch.Tensor) -> torch.Tensor:
        """The gradients of a (B, T + 1) batch's mean loss, in self.microbatches pieces of B / M
        sequences (each backwarded at once, so only one piece's activations are held); returns
        the mean loss, still on the device (no sync)."""
        if self.microbatches == 1:
            return self._backward(batch, None)  # unscaled: exactly the one-batch step
        if batch.shape[0] % self.microbatches:
            raise ValueError(f"{batch.shape[0]} sequences do not split into {self.microbatches} microbatches")
        # equal pieces, each loss / M: the sum of their gradients is the whole batch's mean
        losses = [self._backward(piece, 1.0 / self.microbatches) for piece in batch.chunk(self.microbatches)]
        return torch.stack(losses).mean()

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        """One step on a (B, T + 1) batch; returns the loss, still on the device (no sync)."""
        loss = self.accumulate_gradients(batch)
        self.optimizer_step()
        return loss

    def optimizer_step(self) -> None:
        """Clip, set the step's learning rate, AdamW, zero the gradients (a plain pipeline's
        stage runs this after its own backwards: benchmarks/plain_pipeline.py)."""
        if self.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.optim.grad_clip, foreach=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.steps_taken, lr=self.optim.lr, lr_min=self.optim.lr_min,
                                warmup_steps=self.optim.warmup_steps_for(self.total_steps),
                                total_steps=self.total_steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=not self.keeps_grads)
        self.steps_taken += 1


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_plain_loop(preset: str, *, sequences: int, seq_len: int, vocab_size: int, steps: int, warmup_steps: int,
                   device: torch.device | str, compiled: bool = False, cuda_graphs: bool = False,
                   optim: OptimConfig | None = None, microbatches: int = 1,
                   window_steps: int | None = None) -> PlainLoopResult:
    """Warm up, then time `steps` training steps of the whole model; steps must be >= 1.
    `microbatches`: each step's `sequences` in that many pieces, gradients accumulated.
    `cuda_graphs` (with `compiled`): replayed as CUDA graphs.
    `window_steps`: also the rate of each window of that many steps (the device synchronised
    at each window's end)."""
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"need steps >= 1 and warmup_steps >= 0, got {steps} and {warmup_steps}")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_stage(preset, vocab_size=vocab_size, stage=0, num_stages=1, seed=0, device=device)
    trainer = PlainTrainer(model, optim or OptimConfig(), total_steps=warmup_steps + steps, compiled=compiled,
                           microbatches=microbatches, cuda_graphs=cuda_graphs)
    batches = random_batches(sequences=sequences, seq_len=seq_len, vocab_size=vocab_size, device=device)
    for index in range(warmup_steps):
        trainer.step(batches[index % DISTINCT_BATCHES])
    synchronize(device)
    tokens_per_step = sequences * seq_len
    windows: list[float] = []
    started = window_started = time.perf_counter()
    for index in range(steps):
        loss = trainer.step(batches[index % DISTINCT_BATCHES])
        if window_steps and (index + 1) % window_steps == 0:
            synchronize(device)
            now = time.perf_counter()
            windows.append(window_steps * tokens_per_step / (now - window_started))
            window_started = now
    synchronize(device)
    elapsed_s = time.perf_counter() - started
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    mode = ("cuda-graphs" if cuda_graphs else "compiled") if compiled else "eager"
    return PlainLoopResult(mode=mode, tokens_per_step=tokens_per_step,
                           tokens_per_s=steps * tokens_per_step / elapsed_s, peak_mib=peak_mib, loss=float(loss),
                           microbatches=microbatches, window_tokens_per_s=tuple(windows))


def result_json(result: PlainLoopResult) -> str:
    """The result's JSON line; "microbatches" only where there are several and the window rates
    only where they were asked for, so that the line of a plain run stays what it was."""
    fields = asdict(result)
    if result.microbatches == 1:
        del fields["microbatches"]
    if not result.window_tokens_per_s:
        del fields["window_tokens_per_s"]
    return json.dumps(fields)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--mode", choices=MODES, default="eager")
    parser.add_argument("--sequences", type=int, default=32, help="per step: max_inflight x batch_size")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--microbatches", type=int, default=1,
                        help="split each step's sequences into this many, gradients accumulated")
    args = parser.parse_args(argv)
    if args.microbatches < 1 or args.sequences % args.microbatches:
        parser.error(f"--microbatches must be >= 1 and divide --sequences ({args.sequences})")
    device = torch.device(args.device)
    compiled, cuda_graphs = args.mode != "eager", args.mode == "cuda-graphs"
    if compiled and (reason := compile_skip_reason(device)):
        print(f"plain-loop: {args.mode} skipped: {reason}", file=sys.stderr)
        raise SystemExit(0)
    result = run_plain_loop(args.preset, sequences=args.sequences, seq_len=args.seq_len, vocab_size=args.vocab_size,
                            steps=args.steps, warmup_steps=args.warmup_steps, device=device, compiled=compiled,
                            cuda_graphs=cuda_graphs, microbatches=args.microbatches)
    if not math.isfinite(result.loss):
        print(f"plain-loop: the loss is not finite ({result.loss})", file=sys.stderr)
    print(result_json(result))


if __name__ == "__main__":
    main()
