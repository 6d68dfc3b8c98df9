"""One pipeline stage's forward + backward of one microbatch, three ways: eager; each block
compiled (model.compile_scope = block, the default); and the whole stage compiled as one graph
(model.compile_scope = stage: embedding, blocks and head). Both compiled ways are
noloco_rt.model.compile_stage.compile_stage, as a worker calls it; the loss stays eager, as in a worker.

    PYTHONPATH=. python benchmarks/stage_compile.py [--device cpu|cuda] [--preset tiny] [--seq-len 32]
        [--batch-size 8] [--stages 2] [--stage all|K] [--rounds 15] [--microbatches 10] [--out FILE]

Each variant runs on its own stage module built from the same seed (compiling in place would
otherwise stack), with its own copy of the inputs. It is warmed up first: the first call (the
compile, forward and backward) and the second (where a recompile shows) are timed on their own,
and the first call's output and gradients are checked against eager's. Then the variants
alternate in --rounds rounds of --microbatches microbatches each, their order rotated every
round; the table gives the median ms per microbatch over the rounds, with [min–max]. Gradients
accumulate across microbatches, as in a worker: the loss on the last stage, a random output
gradient elsewhere, and later stages' input hidden states need a gradient. bfloat16 autocast on
CUDA (the runtime's precision=auto), float32 on CPU.

Compile seconds are cold: each stage's variants compile in a fresh inductor cache (no kernel
or graph reused from an earlier stage or run); the process's first compile (stage 0, per block)
also pays inductor's imports and its compile workers' start. Graphs and graph breaks come from
torch._dynamo.utils.counters; TORCH_LOGS=recompiles prints why a graph was compiled again.
Defaults are benchmarks/overhead.py's launch-bound shape, one torch thread (a worker's share
of a 2-core machine). On CPU, inductor compiles C++: the defaults take about 2.5 minutes on
this project's 2-core machine, nearly all of it compiling.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch._inductor.utils import fresh_cache

from benchmarks.plain_loop import synchronize
from benchmarks.table import emit, markdown_table
from noloco_rt.config import ModelConfig
from noloco_rt.model.compile_stage import compile_stage
from noloco_rt.model.llama import PipelineStage, build_stage, lm_loss

VARIANTS = ("eager", "per block", "whole stage")
SCOPES = {"per block": "block", "whole stage": "stage"}
"""The compiled variants' model.compile_scope."""
BASELINE = "per block"


@dataclass
class Inputs:
    """One microbatch for a stage: what comes in, the targets, the gradient from downstream."""

    inputs: torch.Tensor
    targets: torch.Tensor
    output_grad: torch.Tensor


@dataclass
class Variant:
    name: str
    module: PipelineStage
    forward: Callable[[PipelineStage, torch.Tensor, torch.Tensor], torch.Tensor]
    inputs: torch.Tensor
    first_s: float = float("nan")
    second_s: float = float("nan")
    graphs: int = 0
    graph_breaks: Counter[str] = field(default_factory=Counter)
    error: str | None = None
    error_vs_eager: float = float("nan")
    ms: list[float] = field(default_factory=list)


def stage_forward(module: PipelineStage, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The stage's output, or on the last stage its loss. The runtime's precision=auto:
    bfloat16 autocast on CUDA, float32 elsewhere."""
    device = inputs.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = module(inputs)
    return lm_loss(out.float(), targets) if module.is_last else out


def microbatch(args: argparse.Namespace, stage: int, device: torch.device, dim: int, vocab: int) -> Inputs:
    generator = torch.Generator().manual_seed(stage)
    micro = (args.batch_size, args.seq_len)
    if stage == 0:
        inputs = torch.randint(vocab, micro, generator=generator)
    else:
        inputs = torch.randn((*micro, dim), generator=generator)
    targets = torch.randint(vocab, micro, generator=generator)
    output_grad = torch.randn((*micro, dim), generator=generator)
    return Inputs(inputs.to(device), targets.to(device), output_grad.to(device))


def step(variant: Variant, batch: Inputs) -> torch.Tensor:
    """One microbatch's forward + backward; returns the loss or output (detached)."""
    out = variant.forward(variant.module, variant.inputs, batch.targets)
    if variant.module.is_last:
        out.backward()
    else:
        out.backward(batch.output_grad.to(out.dtype))
    return out.detach()


def build_variant(name: str, args: argparse.Namespace, stage: int, device: torch.device,
                  batch: Inputs) -> Variant:
    # A fresh module each: compiling is in place, and each variant's gradients are its own.
    module = build_stage(args.preset, vocab_size=args.vocab_size, stage=stage, num_stages=args.stages,
                         seed=0, device=device)
    if name in SCOPES:
        compile_stage(module, scope=SCOPES[name], seq_len=args.seq_len, backend=args.backend)
    inputs = batch.inputs.clone().requires_grad_(stage > 0)  # its own, so input gradients don't mix
    return Variant(name, module, stage_forward, inputs)


def grads(module: PipelineStage) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """|got - ref| / |ref| over the whole tensor: summation order moves single elements of a
    gradient summed over thousands of tokens (the embedding's) by a lot relative to themselves."""
    got, ref = got.detach().float(), ref.detach().float()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def check_same(variant: Variant, out: torch.Tensor, reference: tuple[torch.Tensor, dict[str, torch.Tensor]],
               device: torch.device) -> None:
    """The compiled variant's first output and gradients equal eager's: the same computation is timed.
    Records the largest relative error (variant.error_vs_eager)."""
    # float32 on CPU; bfloat16 autocast on CUDA, where kernels fused differently round differently.
    tolerance = 5e-2 if device.type == "cuda" else 1e-3
    ref_out, ref_grads = reference
    got = grads(variant.module)
    assert got.keys() == ref_grads.keys(), \
        f"{variant.name}: gradients for {sorted(got)}, eager's for {sorted(ref_grads)}"
    errors = {"output": relative_error(out, ref_out)}
    errors |= {name: relative_error(got[name], grad) for name, grad in ref_grads.items()}
    worst = max(errors, key=errors.__getitem__)
    variant.error_vs_eager = errors[worst]
    assert errors[worst] <= tolerance, (
        f"{variant.name} differs from eager on the first microbatch: {worst} off by {errors[worst]:.2e} "
        f"(|difference| / |eager|), above {tolerance:.0e}")


def warm_up(variant: Variant, batch: Inputs, device: torch.device, warmup: int) -> torch.Tensor | None:
    """Time the first call (compile included) and the second; returns the first call's output,
    or None if compiling failed (recorded in variant.error, the variant is then not timed)."""
    graphs_before, breaks_before = counters["stats"]["unique_graphs"], Counter(counters["graph_break"])
    first = None
    for call in range(warmup):
        started = time.perf_counter()
        try:
            out = step(variant, batch)
        except Exception as error:  # a compile failure is a result to report, not a crash
            if variant.name == "eager":
                raise
            variant.error = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            return None
        synchronize(device)
        seconds = time.perf_counter() - started
        if call == 0:
            variant.first_s, first = seconds, out
        elif call == 1:
            variant.second_s = seconds
    variant.graphs = counters["stats"]["unique_graphs"] - graphs_before
    variant.graph_breaks = Counter(counters["graph_break"]) - breaks_before
    return first


def time_rounds(variants: list[Variant], batch: Inputs, device: torch.device, rounds: int, per_round: int) -> None:
    """Alternate the variants, their order rotated each round, so drift in the machine's speed
    (another process on the cores) weighs on all of them alike."""
    for r in range(rounds):
        for variant in variants[r % len(variants):] + variants[:r % len(variants)]:
            synchronize(device)
            started = time.perf_counter()
            for _ in range(per_round):
                step(variant, batch)
            synchronize(device)
            variant.ms.append((time.perf_counter() - started) * 1000 / per_round)


def measure_stage(args: argparse.Namespace, stage: int, device: torch.device) -> tuple[list[Variant], int]:
    """Every variant of one stage; returns them and the graphs compiled during the timed rounds."""
    torch._dynamo.reset()  # no compiled code kept from the previous stage
    with fresh_cache():  # cold compiles: no kernels or graphs from an earlier stage or run
        probe = build_stage(args.preset, vocab_size=args.vocab_size, stage=stage, num_stages=args.stages,
                            seed=0, device="meta")
        batch = microbatch(args, stage, device, probe.shape.dim, args.vocab_size)
        variants = [build_variant(name, args, stage, device, batch) for name in VARIANTS]
        reference = None
        for variant in variants:
            first = warm_up(variant, batch, device, args.warmup)
            if variant.name == "eager":
                # The first call's gradients are one microbatch's; the eager run has just made them.
                assert first is not None
                reference = (first, grads(variant.module))
            elif first is not None:
                assert reference is not None  # eager is warmed up first
                check_same(variant, first, reference, device)
        timed = [v for v in variants if v.error is None]
        graphs_before = counters["stats"]["unique_graphs"]
        time_rounds(timed, batch, device, args.rounds, args.microbatches)
        return variants, counters["stats"]["unique_graphs"] - graphs_before


def rows_for(stage: int, variants: list[Variant]) -> list[list[object]]:
    medians = {v.name: statistics.median(v.ms) for v in variants if v.ms}

    def ratio(name: str, to: str) -> str:
        return f"{medians[to] / medians[name]:.2f}×" if name in medians and to in medians else "—"

    rows: list[list[object]] = []
    for v in variants:
        compiled = v.name != "eager"
        ms = f"{medians[v.name]:.2f} [{min(v.ms):.2f}–{max(v.ms):.2f}]" if v.ms else f"failed: {v.error}"
        breaks = sum(v.graph_breaks.values())
        rows.append([stage, v.name, ms, ratio(v.name, BASELINE), ratio(v.name, "eager"),
                     f"{v.first_s:.1f}" if compiled and v.ms else "—",
                     f"{v.second_s * 1000:.0f}" if compiled and v.ms else "—",
                     v.graphs if compiled else "—", breaks if compiled else "—"])
    return rows


def notes(args: argparse.Namespace, measured: dict[int, tuple[list[Variant], int]], device: torch.device) -> str:
    lines = []
    for stage, (variants, late_graphs) in measured.items():
        params = sum(p.numel() for p in variants[0].module.parameters())
        lines.append(f"- stage {stage}: {params:,} parameters; graphs compiled during the timed rounds: {late_graphs}")
        for v in variants:
            if v.name != "eager" and v.error is None:
                lines.append(f"  - {v.name}: first output and gradients against eager's, largest "
                             f"|difference| / |eager|: {v.error_vs_eager:.1e}")
            for reason, count in v.graph_breaks.items():
                lines.append(f"  - {v.name} graph break ×{count}: {reason.strip().splitlines()[0][:200]}")
            if v.error is not None:
                lines.append(f"  - {v.name} failed to compile: {v.error}")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    lines.append(f"- torch {torch.__version__}, backend {args.backend}, {torch.get_num_threads()} torch thread(s), "
                 f"{device.type} ({machine}), {os.cpu_count()} cores, load average {load} at the end")
    lines.append("- × per block = per block's median / the row's (above 1: the row is faster); × eager likewise. "
                 "1st call s: the first forward + backward, compile included; 2nd call ms: the next one "
                 "(a recompile shows here); graphs and graph breaks: torch._dynamo counters over the warm-up.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--vocab-size", type=int, default=ModelConfig().vocab_size)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--stage", default="all", help="a stage index, or all: the first and the last")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant (at least 2)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--microbatches", type=int, default=10, help="per variant per round")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = parser.parse_args(argv)
    if args.warmup < 2:
        parser.error("--warmup: at least 2 (the first call and the second are reported)")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    stages = sorted({0, args.stages - 1}) if args.stage == "all" else [int(args.stage)]
    measured = {stage: measure_stage(args, stage, device) for stage in stages}
    rows = [row for stage, (variants, _) in measured.items() for row in rows_for(stage, variants)]
    title = (f"One microbatch's forward + backward of a stage, preset {args.preset}, {args.batch_size} x "
             f"{args.seq_len} tokens, {args.stages} stages, {args.rounds} rounds of {args.microbatches} "
             "microbatches per variant: median ms [min–max]")
    header = ["stage", "variant", "ms / microbatch", "× per block", "× eager", "1st call s", "2nd call ms",
              "graphs", "graph breaks"]
    emit(markdown_table(title, header, rows) + "\n" + notes(args, measured, device), args.out)


if __name__ == "__main__":
    main()
