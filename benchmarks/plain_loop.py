"""The baseline `make gpu-check` holds the runtime against: a plain single-process PyTorch
training loop of the whole model, eager or torch.compile'd, on random tokens.

    python -m benchmarks.plain_loop [--preset 125m] [--mode eager|compiled] [--sequences 32]
        [--seq-len 1024] [--steps 30] [--warmup-steps 10] [--device cuda]

It trains as a worker does, with one batch per step: the same model (noloco_rt.model), bfloat16
autocast on CUDA (float32 on CPU, as model.precision = auto), the runtime's inner AdamW
(optim section: lr schedule, betas, weight decay, grad clipping; fused on CUDA). It prints one
JSON line: tokens/s over the steps after warm-up (compiling happens in warm-up), peak memory
(torch.cuda.max_memory_allocated; 0 on CPU) and the last loss.
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

from noloco_rt.algo.optim import lr_at
from noloco_rt.config import OptimConfig
from noloco_rt.model import PipelineStage, build_stage, lm_loss

MODES = ("eager", "compiled")
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

    def __init__(self, model: PipelineStage, optim: OptimConfig, *, total_steps: int, compiled: bool) -> None:
        self.device = next(model.parameters()).device
        self.params = list(model.parameters())
        self.forward = torch.compile(model) if compiled else model
        self.optim = optim
        self.total_steps = total_steps
        self.steps_taken = 0
        on_cuda = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.params, lr=optim.lr, betas=(optim.adam_beta1, optim.adam_beta2),
                                           weight_decay=optim.weight_decay, fused=on_cuda, foreach=not on_cuda)
        # bfloat16 matmuls on CUDA, float32 on CPU: what model.precision = auto gives a worker
        self.autocast = torch.autocast("cuda", dtype=torch.bfloat16) if on_cuda else contextlib.nullcontext()

    def step(self, batch: torch.Tensor) -> torch.Tensor:
        """One step on a (B, T + 1) batch; returns the loss, still on the device (no sync)."""
        inputs, targets = batch[:, :-1], batch[:, 1:]  # (B, T) each
        with self.autocast:
            logits = self.forward(inputs)  # (B, T, V)
        loss = lm_loss(logits.float(), targets)
        loss.backward()
        if self.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.optim.grad_clip, foreach=True)
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.steps_taken, lr=self.optim.lr, lr_min=self.optim.lr_min,
                                warmup_steps=self.optim.warmup_steps_for(self.total_steps),
                                total_steps=self.total_steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps_taken += 1
        return loss.detach()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_plain_loop(preset: str, *, sequences: int, seq_len: int, vocab_size: int, steps: int, warmup_steps: int,
                   device: torch.device | str, compiled: bool = False,
                   optim: OptimConfig | None = None) -> PlainLoopResult:
    """Warm up, then time `steps` training steps of the whole model; steps must be >= 1."""
    if steps < 1 or warmup_steps < 0:
        raise ValueError(f"need steps >= 1 and warmup_steps >= 0, got {steps} and {warmup_steps}")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    model = build_stage(preset, vocab_size=vocab_size, stage=0, num_stages=1, seed=0, device=device)
    trainer = PlainTrainer(model, optim or OptimConfig(), total_steps=warmup_steps + steps, compiled=compiled)
    batches = random_batches(sequences=sequences, seq_len=seq_len, vocab_size=vocab_size, device=device)
    for index in range(warmup_steps):
        trainer.step(batches[index % DISTINCT_BATCHES])
    _synchronize(device)
    started = time.perf_counter()
    for index in range(steps):
        loss = trainer.step(batches[index % DISTINCT_BATCHES])
    _synchronize(device)
    elapsed_s = time.perf_counter() - started
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else 0.0
    tokens_per_step = sequences * seq_len
    return PlainLoopResult(mode="compiled" if compiled else "eager", tokens_per_step=tokens_per_step,
                           tokens_per_s=steps * tokens_per_step / elapsed_s, peak_mib=peak_mib, loss=float(loss))


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
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    compiled = args.mode == "compiled"
    if compiled and (reason := compile_skip_reason(device)):
        print(f"plain-loop: compiled skipped: {reason}", file=sys.stderr)
        raise SystemExit(0)
    result = run_plain_loop(args.preset, sequences=args.sequences, seq_len=args.seq_len, vocab_size=args.vocab_size,
                            steps=args.steps, warmup_steps=args.warmup_steps, device=device, compiled=compiled)
    if not math.isfinite(result.loss):
        print(f"plain-loop: the loss is not finite ({result.loss})", file=sys.stderr)
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    main()
