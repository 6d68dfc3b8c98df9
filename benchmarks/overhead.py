"""The runtime's host overhead on this machine: `noloco-rt up` against benchmarks/plain_loop.py run
in the same invocation, as ratios of tokens/s (CPU here, CUDA elsewhere).

    python -m benchmarks.overhead [--device cpu|cuda] [--runs 3] [--shapes launch,compute,pipeline,pipeline-compute]
        [--steps N] [--out benchmarks/results/overhead.md]

Four shapes, each measured --runs times (runs interleaved: run 1 of every shape, then run 2 ...);
the table shows the median and [min–max] of tokens/s and of each ratio, a ratio taken within
one run (the runtime over the mean of its reference measured just before and just after it:
this machine's speed drifts by half over minutes, and bracketing shifts both sides alike):

- launch (launch-bound): preset tiny, model.seq_len 32, data.batch_size 8,
  pipeline.max_inflight 4: 4 microbatches of 8 sequences, 32 x 32 tokens per inner step. Rows:
  the plain loop on one batch of 32 sequences per step; the plain loop accumulating the same 4
  microbatches of 8 (--microbatches 4); `up --stages 1 --replicas 1`. Ratios: the runtime over
  each plain loop, and the accumulating loop over the one-batch loop.
- compute (compute-bound): preset small, seq_len 256, otherwise as launch; the same rows.
- pipeline: `up --stages 2 --replicas 1` on the launch shape, against the schedule's ideal
  B / (B + S - 1) x (tokens per microbatch / t_slowest): t_slowest is the slowest stage's own
  forward + backward of one microbatch, timed with a worker's share of the cores in a fresh
  process: each stage alone, and (a second ideal) all stages side by side at the same moment,
  sharing the machine as the workers do but without anything of the runtime.
  The ideal leaves out the optimizer step and the wire between the stages: the runtime pays both.
  A third reference pays them too: benchmarks/plain_pipeline.py, the same schedule by hand in
  plain PyTorch (one process per stage, shared-memory slots and a pipe between them), whose own
  share of the ideal says how much of it this machine lets a pipeline of processes reach. A
  fourth sends the same bytes over ZeroMQ, received by a thread of each process that hands them
  over, as a worker's data link does: what this machine lets a pipeline built like the
  runtime's reach, before anything else of the runtime.
- pipeline-compute: the same rows on the compute shape (small, seq_len 256), where a
  microbatch is compute-bound: what the pipeline costs per microbatch shows against
  microbatches 30 times longer.

What is measured: every rate is the median over windows of 10 steps (WINDOW). The runtime's
come from its stage-0 worker's `train_progress` lines (at step 1, then every 10th), from the
line of step 10 on (so start-up and 9 warm-up steps are left out): (10 steps x tokens per inner
step) / (seconds between consecutive lines). The plain loops time the same number of steps
(N - 10) after their own warm-up, in windows of 10; the stage timings 4 windows of 10
microbatches each. The runtime runs with its defaults otherwise (outer steps every h inner steps, local
with one replica; a checkpoint every 300 s, so none inside the timed steps; the stdlib
corpus, where the plain loop cycles random tokens), and model.compile = off, so that both sides
are eager. `up` gives each worker cores // workers torch threads; the plain loops and the stage
timings get the same (the table's notes say how many).

Duration on this project's 2-core CPU machine (idle otherwise): one step of the compute shape
(small, 32 x 256 tokens, 2 threads) takes about 3 s on either side, a launch-shape step (tiny,
32 x 32) 0.04-0.07 s, and each `up` adds about 15 s of start-up, final checkpoint and consensus
scoring. With the references bracketing each runtime run, the default 3 runs take about 50
minutes (the first three shapes 29 of them, pipeline-compute 7 a run: the plain pipelines, over
pipes and over ZeroMQ, take about a minute each). Another process on the cores slows either
side several times over: run it alone (the notes give the load average).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import multiprocessing
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check import child_env, read_worker_events, runtime_config
from benchmarks.matched_runs import worker_pids
from benchmarks.plain_loop import run_plain_loop, synchronize
from benchmarks.plain_pipeline import PipelineShape, run_plain_pipeline
from benchmarks.table import emit, markdown_table
from noloco_rt.config import Config
from noloco_rt.logs import LogRecord, record_seconds
from noloco_rt.model.llama import build_stage, lm_loss
from workers.cluster.processes import threads_per_worker

REPO_ROOT = Path(__file__).resolve().parent.parent
# threads_per_worker(cores, workers): the torch threads `up` gives each of its workers
# (OMP_NUM_THREADS, commit f315739); the plain loops and the stage timings get the same.
RUNTIME_WARMUP_STEP = 10
"""The runtime's rate is measured from this step's progress line: workers log train_progress at
step 1 (after start-up) and at every 10th step."""
STAGE_TIMING_WARMUP = 5
STAGE_TIMING_REPEATS = 40
"""Microbatches timed per stage for t_slowest (tiny: ~10 ms each on one CPU thread)."""
WINDOW = 10
"""Every side's rate is the median of its windows of this many steps (the runtime: between its
progress lines, 10 inner steps apart; the stage timings: of this many microbatches). This
machine has stretches of half a second or more where everything runs 2-3 times slower (load
from outside: seen in a plain loop alone too), and a long measurement meets more of them
than a short one: the median of equal windows weighs every side alike."""

PLAIN, ACCUMULATED, RUNTIME, IDEAL = "plain", "accumulated", "runtime", "ideal"
IDEAL_SHARED = "ideal_shared"
"""The ideal with every stage timed side by side, each in its own process, as a pipeline's
workers share the machine (its cores, its memory bandwidth)."""
PLAIN_PIPELINE = "plain_pipeline"
"""benchmarks/plain_pipeline.py: the pipeline shape's schedule written by hand, one process a stage."""
PLAIN_PIPELINE_ZMQ = "plain_pipeline_zmq"
"""The same over ZeroMQ, a receiving thread in each process (2 stages): how far this machine lets
a pipeline built as the runtime's is go (ZeroMQ's I/O threads, a thread handing over what arrives)."""
SLOWEST, SLOWEST_SHARED = "slowest", "slowest_shared"
"""Not rows: the slowest stage's seconds per microbatch behind IDEAL and IDEAL_SHARED."""
RATIO_COLUMNS = ((PLAIN, "× plain one batch"), (ACCUMULATED, "× plain accumulated"), (IDEAL, "× schedule's ideal"),
                 (IDEAL_SHARED, "× ideal, side by side"), (PLAIN_PIPELINE, "× plain pipeline"),
                 (PLAIN_PIPELINE_ZMQ, "× plain pipeline over ZeroMQ"))
"""The table's ratio columns: the row each divides by, and its header."""


@dataclasses.dataclass(frozen=True)
class ShapeSpec:
    """One benchmark shape: the model, the runtime's pipeline and how long each side trains."""

    name: str
    preset: str
    seq_len: int
    batch_size: int
    max_inflight: int
    stages: int
    """1: two plain loops and `up` 1 x 1; more: `up` S x 1 against the schedule's ideal."""
    steps: int
    """The runtime's inner steps; the plain loops time steps - RUNTIME_WARMUP_STEP of theirs."""
    plain_warmup_steps: int

    @property
    def tokens_per_microbatch(self) -> int:
        return self.batch_size * self.seq_len

    @property
    def tokens_per_step(self) -> int:
        return self.max_inflight * self.tokens_per_microbatch

    @property
    def sequences_per_step(self) -> int:
        return self.max_inflight * self.batch_size

    @property
    def timed_steps(self) -> int:
        return self.steps - RUNTIME_WARMUP_STEP

    def settings(self) -> list[str]:
        """The runtime's --set flags (compile off: the plain loop is eager too)."""
        return [f"model.seq_len={self.seq_len}", f"data.batch_size={self.batch_size}",
                f"pipeline.max_inflight={self.max_inflight}", "model.compile=off"]


SHAPES = {
    "launch": ShapeSpec("launch", "tiny", seq_len=32, batch_size=8, max_inflight=4, stages=1, steps=200,
                        plain_warmup_steps=10),
    "compute": ShapeSpec("compute", "small", seq_len=256, batch_size=8, max_inflight=4, stages=1, steps=20,
                         plain_warmup_steps=2),
    "pipeline": ShapeSpec("pipeline", "tiny", seq_len=32, batch_size=8, max_inflight=4, stages=2, steps=200,
                          plain_warmup_steps=10),
    "pipeline-compute": ShapeSpec("pipeline-compute", "small", seq_len=256, batch_size=8, max_inflight=4,
                                  stages=2, steps=30, plain_warmup_steps=2),
}


# --- pure parts: the ideal, medians and ranges, ratios, the table ---------------------------------


def ideal_pipeline_tokens_per_s(*, microbatches: int, stages: int, tokens_per_microbatch: int,
                                slowest_stage_s: float) -> float:
    """Tokens/s of a synchronous pipeline schedule (B microbatches through S stages per step, each
    stage taking slowest_stage_s per microbatch forward + backward): a step lasts (B + S - 1)
    slots of the slowest stage and trains B microbatches."""
    if microbatches < 1 or stages < 1 or slowest_stage_s <= 0:
        raise ValueError(f"need B, S >= 1 and t > 0, got {microbatches}, {stages}, {slowest_stage_s}")
    return microbatches / (microbatches + stages - 1) * tokens_per_microbatch / slowest_stage_s


@dataclasses.dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median, min and max of the values measured (None: a run that gave none); None if none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present))


def paired_ratios(numerators: Sequence[float | None], denominators: Sequence[float | None]) -> list[float | None]:
    """Run i's numerator over run i's denominator (measured minutes apart, on the same machine
    state); None where either is missing."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerators against {len(denominators)} denominators")
    return [n / d if n is not None and d else None for n, d in zip(numerators, denominators, strict=True)]


def format_spread(value: Spread | None, spec: str, unit: str = "") -> str:
    """'1.02× [0.98–1.05]'; just the value when min = max (one run); 'failed' when none."""
    if value is None:
        return "failed"
    text = f"{value.median:{spec}}{unit}"
    if value.low != value.high:
        text += f" [{value.low:{spec}}–{value.high:{spec}}]"
    return text


def runtime_tokens_per_s(progress: Sequence[LogRecord], *, tokens_per_step: int,
                         warmup_step: int = RUNTIME_WARMUP_STEP) -> float | None:
    """A worker's tokens/s from its train_progress records (inner_step, timestamp): the median
    rate between consecutive records from the first at or past `warmup_step` on (WINDOW); None
    when there are not two such records."""
    measured = [r for r in progress if r.get("event") == "train_progress" and r["inner_step"] >= warmup_step]
    rates = []
    for first, last in itertools.pairwise(measured):
        seconds = record_seconds(last["timestamp"]) - record_seconds(first["timestamp"])
        steps = last["inner_step"] - first["inner_step"]
        if steps > 0 and seconds > 0:
            rates.append(steps * tokens_per_step / seconds)
    return statistics.median(rates) if rates else None


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the table: tokens/s of each run (None: that run failed)."""

    shape: str
    kind: str
    """PLAIN, ACCUMULATED, RUNTIME or IDEAL: which ratios it gets and which rows divide by it."""
    name: str
    tokens_per_s: list[float | None]
    references: tuple[str, ...] = ()
    """The kinds of row of its shape it is divided by, one ratio column each."""


def references_of(kind: str, stages: int) -> tuple[str, ...]:
    """The runtime 1 x 1 against both plain loops, S x 1 against the schedule's ideal and the
    plain pipelines; the accumulating loop against the one-batch loop (what accumulation alone
    costs), the plain pipelines against the ideal (what a pipeline of processes reaches here, and
    one over ZeroMQ)."""
    if kind == RUNTIME:
        return (PLAIN, ACCUMULATED) if stages == 1 else (IDEAL, IDEAL_SHARED, PLAIN_PIPELINE, PLAIN_PIPELINE_ZMQ)
    if kind in (PLAIN_PIPELINE, PLAIN_PIPELINE_ZMQ):
        return (IDEAL, IDEAL_SHARED)
    return (PLAIN,) if kind == ACCUMULATED else ()


def ratio_cells(row: Row, rows: Sequence[Row]) -> list[str]:
    """The row's ratio columns: its tokens/s over each reference row of its shape, run by run."""
    by_kind = {r.kind: r for r in rows if r.shape == row.shape}
    cells = []
    for kind, _ in RATIO_COLUMNS:
        reference = by_kind.get(kind)
        if kind not in row.references or reference is None:
            cells.append("–")
            continue
        cells.append(format_spread(spread(paired_ratios(row.tokens_per_s, reference.tokens_per_s)), ".2f", "×"))
    return cells


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    return [[row.shape, row.name, format_spread(spread(row.tokens_per_s), ",.0f"), *ratio_cells(row, rows)]
            for row in rows]


def render_table(title: str, rows: Sequence[Row], notes: Sequence[str]) -> str:
    header = ["shape", "run", "tokens/s", *(label for _, label in RATIO_COLUMNS)]
    return markdown_table(title, header, table_rows(rows)) + "".join(f"\n{note}\n" for note in notes)


# --- measuring: plain loops and stage timings in fresh processes, `up` as a child -----------------


def _plain_in_child(spec: ShapeSpec, cfg: Config, microbatches: int, device: str, threads: int) -> float:
    torch.set_num_threads(threads)
    result = run_plain_loop(spec.preset, sequences=spec.sequences_per_step, seq_len=spec.seq_len,
                            vocab_size=cfg.model.vocab_size, steps=spec.timed_steps,
                            warmup_steps=spec.plain_warmup_steps, device=torch.device(device), optim=cfg.optim,
                            microbatches=microbatches, window_steps=WINDOW)
    return statistics.median(result.window_tokens_per_s)


def plain_tokens_per_s(spec: ShapeSpec, cfg: Config, *, microbatches: int, device: torch.device,
                       threads: int) -> float:
    """The plain loop's tokens/s, in a fresh process as a worker is (nothing this process did
    before, its threads or its allocations, weighs on one side only)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_plain_in_child, spec, cfg, microbatches, str(device), threads).result()


def stage_seconds_per_microbatch(spec: ShapeSpec, cfg: Config, *, stage: int, device: torch.device,
                                 start_together: Any = None) -> float:
    """One stage's forward + backward of one microbatch, alone: token ids into stage 0, random
    hidden states (B, T, C) needing a gradient into later ones; the loss on the last stage, a
    random output gradient elsewhere. Gradients accumulate across microbatches, as in a worker."""
    model = build_stage(spec.preset, vocab_size=cfg.model.vocab_size, stage=stage, num_stages=spec.stages,
                        seed=0, device=device)
    generator = torch.Generator().manual_seed(stage)
    micro = (spec.batch_size, spec.seq_len)
    hidden = (*micro, model.shape.dim)
    if model.is_first:
        inputs = torch.randint(cfg.model.vocab_size, micro, generator=generator).to(device)
    else:
        inputs = torch.randn(hidden, generator=generator).to(device).requires_grad_()
    targets = torch.randint(cfg.model.vocab_size, micro, generator=generator).to(device)
    output_gradient = torch.randn(hidden, generator=generator).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    def forward_backward() -> None:
        with autocast:
            output = model(inputs)
        if model.is_last:
            lm_loss(output.float(), targets).backward()
        else:
            output.backward(output_gradient.to(output.dtype))

    for _ in range(STAGE_TIMING_WARMUP):
        forward_backward()
    synchronize(device)
    if start_together is not None:  # side by side: every stage's process times at once
        start_together.wait()
    windows = []
    for _ in range(STAGE_TIMING_REPEATS // WINDOW):
        started = time.perf_counter()
        for _ in range(WINDOW):
            forward_backward()
        synchronize(device)
        windows.append((time.perf_counter() - started) / WINDOW)
    return statistics.median(windows)


def _time_stage_in_child(spec: ShapeSpec, cfg: Config, stage: int, threads: int, device: str,
                         start_together: Any, results: Any) -> None:
    torch.set_num_threads(threads)
    results.put((stage, stage_seconds_per_microbatch(spec, cfg, stage=stage, device=torch.device(device),
                                                     start_together=start_together)))


def stage_seconds_in_processes(spec: ShapeSpec, cfg: Config, *, device: torch.device, threads: int,
                               side_by_side: bool) -> list[float]:
    """Every stage's seconds per microbatch, each in a fresh process as a worker is: one after
    another (alone), or all timing at the same moment (side by side: the machine shared as the
    pipeline's workers share it, its cores and memory bandwidth, without anything of the runtime's)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    timings: dict[int, float] = {}
    batches = [list(range(spec.stages))] if side_by_side else [[k] for k in range(spec.stages)]
    for stages in batches:
        start_together = context.Barrier(len(stages))
        children = [context.Process(target=_time_stage_in_child, args=(spec, cfg, k, threads, str(device),
                                                                       start_together, results))
                    for k in stages]
        for child in children:
            child.start()
        timings.update(results.get(timeout=300) for _ in children)
        for child in children:
            child.join()
    return [timings[k] for k in range(spec.stages)]


def plain_pipeline_shape(spec: ShapeSpec, cfg: Config, *, device: torch.device, threads: int,
                         steps: int) -> PipelineShape:
    """The plain pipeline of a pipeline shape: its microbatches, and the vocabulary and
    optimizer `cfg` gives the runtime's workers; `steps` timed after the plain warm-up."""
    return PipelineShape(preset=spec.preset, stages=spec.stages, microbatches=spec.max_inflight,
                         batch_size=spec.batch_size, seq_len=spec.seq_len, vocab_size=cfg.model.vocab_size,
                         steps=steps, warmup_steps=spec.plain_warmup_steps, device=str(device), threads=threads,
                         optim=cfg.optim)


def plain_pipeline_tokens_per_s(spec: ShapeSpec, cfg: Config, *, device: torch.device, threads: int,
                                transport: str = "pipe") -> float:
    """The plain S-process pipeline's tokens/s (the median of its windows), its processes
    spawned fresh as the workers are, its stages joined by `transport` (pipe or zmq)."""
    shape = plain_pipeline_shape(spec, cfg, device=device, threads=threads, steps=spec.timed_steps)
    return statistics.median(run_plain_pipeline(shape, window_steps=WINDOW, transport=transport).window_tokens_per_s)


def up_env(device: torch.device) -> dict[str, str]:
    """This checkout's packages without an install; no GPU for the workers when measuring the CPU."""
    env = child_env()
    if device.type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def up_command(spec: ShapeSpec, out: Path) -> list[str]:
    """`up --stages S --replicas 1` of the shape, its run directory `out`."""
    return [sys.executable, "-m", "noloco_rt.cli", "up", "--stages", str(spec.stages), "--replicas", "1",
            "--steps", str(spec.steps), "--preset", spec.preset, "--out", str(out), "--no-coordinator",
            "--no-tensorboard", *(flag for s in spec.settings() for flag in ("--set", s))]


@contextlib.contextmanager
def up_process(spec: ShapeSpec, out: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """`up` of the shape into `out` (its output in out/up.out) with this environment, in a
    process group of its own; on leaving, the group is ended if `up` still runs (a timeout,
    Ctrl-C: no workers left behind) and `up` waited for."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "up.out").open("w") as log, subprocess.Popen(
            up_command(spec, out), env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT) as child:
        try:
            yield child
        finally:
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


@contextlib.contextmanager
def up_with_workers(spec: ShapeSpec, out: Path, *, deadline: float) -> Iterator[tuple[subprocess.Popen, dict[str, int]]]:
    """`up` of the shape on the CPU into `out` (up_process), entered once its workers have
    started or `deadline` (time.monotonic) or its exit came first: the child and {worker name:
    pid} of those seen. After a body that returned, RuntimeError if `up` exited non-zero."""
    with up_process(spec, out, up_env(torch.device("cpu"))) as child:
        pids: dict[str, int] = {}
        while len(pids) < spec.stages and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            pids = worker_pids(out / "up.out")
        yield child, pids
    if child.returncode != 0:
        raise RuntimeError(f"up exited with {child.returncode}: see {out / 'up.out'}")


def run_up(spec: ShapeSpec, out: Path, *, device: torch.device, timeout_s: float,
           extra_env: dict[str, str] | None = None) -> int:
    """`up --stages S --replicas 1` of the shape into `out` (its output in out/up.out), with
    `extra_env` over its environment; its exit code, 124 after ending its whole process group
    on timeout."""
    with up_process(spec, out, {**up_env(device), **(extra_env or {})}) as child:
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return 124  # up_process ends its group on the way out


def stage0_progress(out: Path) -> list[LogRecord]:
    """The train_progress records of the run's stage-0 worker (its first incarnation)."""
    events = read_worker_events(out / "logs")
    stage0 = [records for name, records in events.items() if name.startswith("s0-")]
    return [r for r in stage0[0] if r.get("event") == "train_progress"] if stage0 else []


@dataclasses.dataclass
class Measurements:
    """Every row's tokens/s, run by run, and what went wrong."""

    values: dict[tuple[str, str], list[float | None]]
    failures: list[str]
    slowest_stage_s: dict[str, list[float]]

    def add(self, shape: str, kind: str, value: float | None) -> None:
        self.values.setdefault((shape, kind), []).append(value)


def measure_runtime(spec: ShapeSpec, run_out: Path, args: argparse.Namespace, results: Measurements,
                    label: str) -> None:
    code = run_up(spec, run_out, device=args.device, timeout_s=args.timeout_s)
    rate = runtime_tokens_per_s(stage0_progress(run_out), tokens_per_step=spec.tokens_per_step)
    if code != 0 or rate is None:
        results.failures.append(f"{label}: `up` exited with code {code}, rate {rate} (see {run_out / 'up.out'})")
    results.add(spec.name, RUNTIME, rate if code == 0 else None)


def reference_rates(spec: ShapeSpec, cfg: Config, device: torch.device, cores: int) -> dict[str, float]:
    """The shape's references, tokens/s by kind (and the ideal's t_slowest under SLOWEST)."""
    if spec.stages == 1:
        threads = threads_per_worker(cores, 1)
        return {PLAIN: plain_tokens_per_s(spec, cfg, microbatches=1, device=device, threads=threads),
                ACCUMULATED: plain_tokens_per_s(spec, cfg, microbatches=spec.max_inflight, device=device,
                                                threads=threads)}
    threads = threads_per_worker(cores, spec.stages)
    slowest = max(stage_seconds_in_processes(spec, cfg, device=device, threads=threads, side_by_side=False))
    shared = max(stage_seconds_in_processes(spec, cfg, device=device, threads=threads, side_by_side=True))

    def ideal(seconds: float) -> float:
        return ideal_pipeline_tokens_per_s(microbatches=spec.max_inflight, stages=spec.stages,
                                           tokens_per_microbatch=spec.tokens_per_microbatch, slowest_stage_s=seconds)

    rates = {SLOWEST: slowest, SLOWEST_SHARED: shared, IDEAL: ideal(slowest), IDEAL_SHARED: ideal(shared),
             PLAIN_PIPELINE: plain_pipeline_tokens_per_s(spec, cfg, device=device, threads=threads)}
    if spec.stages == 2:  # the ZeroMQ variant joins two stages
        rates[PLAIN_PIPELINE_ZMQ] = plain_pipeline_tokens_per_s(spec, cfg, device=device, threads=threads,
                                                                transport="zmq")
    return rates


def measure_shape_once(spec: ShapeSpec, args: argparse.Namespace, run_out: Path, results: Measurements,
                       label: str) -> None:
    """One run of a shape: its references just before and just after the runtime, averaged, so
    that a machine whose speed drifts over minutes (a shared host) shifts both sides alike."""
    cfg = runtime_config(spec.settings())
    device = args.device
    before = reference_rates(spec, cfg, device, args.cores)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the workers share this GPU
    measure_runtime(spec, run_out, args, results, label)
    after = reference_rates(spec, cfg, device, args.cores)
    for kind, value in before.items():
        mean = (value + after[kind]) / 2
        if kind in (SLOWEST, SLOWEST_SHARED):
            results.slowest_stage_s.setdefault(f"{spec.name} {kind}", []).append(mean)
        else:
            results.add(spec.name, kind, mean)


def row_names(spec: ShapeSpec) -> dict[str, str]:
    micro = f"{spec.batch_size} x {spec.seq_len}"
    return {PLAIN: f"plain, one batch of {spec.sequences_per_step} x {spec.seq_len}",
            ACCUMULATED: f"plain, {spec.max_inflight} microbatches of {micro} accumulated",
            IDEAL: f"schedule's ideal, B = {spec.max_inflight}, S = {spec.stages}",
            IDEAL_SHARED: "schedule's ideal, stages timed side by side",
            PLAIN_PIPELINE: f"plain {spec.stages}-process pipeline, same schedule",
            PLAIN_PIPELINE_ZMQ: f"plain {spec.stages}-process pipeline over ZeroMQ, a receiving thread",
            RUNTIME: f"noloco-rt {spec.stages} x 1"}


def collect_rows(specs: Sequence[ShapeSpec], results: Measurements) -> list[Row]:
    rows = []
    for spec in specs:
        for kind, name in row_names(spec).items():
            if (spec.name, kind) in results.values:
                rows.append(Row(spec.name, kind, name, results.values[(spec.name, kind)],
                                references_of(kind, spec.stages)))
    return rows


# --- the invocation: arguments, provenance, notes -------------------------------------------------


def git_commit() -> str:
    """HEAD's short hash, and whether the tree differs from it (benchmarks of uncommitted code)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def device_description(device: torch.device, cores: int) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({cores} CPU cores)"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU, {cores} cores ({line.split(':', 1)[1].strip()})"
    return f"CPU, {cores} cores ({platform.processor() or platform.machine()})"


def load_note(before: float, after: float, cores: int) -> str:
    """The 1-minute load average before and after: a busy machine (another process on the cores)
    can slow either side several-fold, and the table cannot tell otherwise."""
    return (f"load average (1 min; it trails by about a minute) {before:.1f} before the runs, {after:.1f} after, "
            f"on {cores} cores")


def notes(specs: Sequence[ShapeSpec], results: Measurements, cores: int, elapsed_s: float) -> list[str]:
    lines = []
    for spec in specs:
        threads = threads_per_worker(cores, spec.stages)
        what = (f"{spec.name}: preset {spec.preset}, {spec.max_inflight} microbatches of {spec.batch_size} x "
                f"{spec.seq_len} tokens per inner step; the runtime trains {spec.steps} steps, its tokens/s from "
                f"its stage-0 worker's progress lines of steps {RUNTIME_WARMUP_STEP} to {spec.steps}; ")
        if spec.stages == 1:
            what += (f"the plain loops time {spec.timed_steps} steps after {spec.plain_warmup_steps} of warm-up; "
                     f"torch threads: {threads} for the runtime's worker and {threads} for the plain loops")
        else:
            alone, shared = (", ".join(f"{s * 1e3:.1f}" for s in results.slowest_stage_s.get(f"{spec.name} {kind}", []))
                             for kind in (SLOWEST, SLOWEST_SHARED))
            what += (f"{spec.stages} workers with {threads} torch thread(s) each; t_slowest per microbatch "
                     f"(ms, run by run, {threads} thread(s) a stage): {alone} with each stage timed alone, "
                     f"{shared} with the stages timed side by side; the plain pipelines time {spec.timed_steps} "
                     f"steps after {spec.plain_warmup_steps} of warm-up")
        lines.append(what)
    lines.append(f"runtime settings beyond the shape: the defaults, and model.compile = off; this invocation took "
                 f"{elapsed_s:.0f} s")
    return lines


def parse_shape_names(text: str) -> list[ShapeSpec]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or any(n not in SHAPES for n in names):
        raise argparse.ArgumentTypeError(f"shapes are {', '.join(SHAPES)}, comma-separated, not {text!r}")
    return [SHAPES[n] for n in names]


def parse_device(text: str) -> torch.device:
    if text not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"--device is cpu or cuda, not {text!r}")
    return torch.device(text)


def with_steps(specs: list[ShapeSpec], steps: int | None) -> list[ShapeSpec]:
    """The shapes with --steps for the runtime's inner steps, where given."""
    if steps is None:
        return specs
    return [dataclasses.replace(spec, steps=steps) for spec in specs]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=parse_device, default=torch.device("cuda" if torch.cuda.is_available() else "cpu"),
                        help="cpu or cuda (default: cuda where there is one)")
    parser.add_argument("--runs", type=int, default=3, help="measurements of every row")
    parser.add_argument("--shapes", type=parse_shape_names, default=list(SHAPES.values()),
                        help="comma-separated: " + ",".join(SHAPES))
    parser.add_argument("--steps", type=int, default=None,
                        help="the runtime's inner steps for every shape, a multiple of 10 above 10 (default: "
                             + ", ".join(f"{s.name} {s.steps}" for s in SHAPES.values()) + ")")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per `up` run")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="keep the runs' folders (logs) here, an empty or new folder; default: deleted")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    if args.steps is not None and (args.steps <= RUNTIME_WARMUP_STEP or args.steps % 10):
        parser.error(f"--steps must be a multiple of 10 above {RUNTIME_WARMUP_STEP}: workers log progress every "
                     "10 steps, and the rate is measured from step 10")
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if args.runs_dir is not None and args.runs_dir.is_dir() and any(args.runs_dir.iterdir()):
        parser.error(f"{args.runs_dir} is not empty: `up` would resume the runs there instead of training")
    args.shapes = with_steps(args.shapes, args.steps)
    args.cores = os.cpu_count() or 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started, load_before = time.monotonic(), os.getloadavg()[0]
    results = Measurements({}, [], {})
    with tempfile.TemporaryDirectory(prefix="overhead-") as tmp:
        runs_dir = args.runs_dir or Path(tmp)
        for run in range(args.runs):
            for spec in args.shapes:
                label = f"run {run + 1}/{args.runs} {spec.name}"
                print(f"overhead: {label}", file=sys.stderr, flush=True)
                measure_shape_once(spec, args, runs_dir / f"{spec.name}-{run + 1}", results, label)
    title = (f"noloco-rt's host overhead against a plain PyTorch loop on {device_description(args.device, args.cores)}, "
             f"commit {git_commit()}; {args.runs} run(s) of each row: median [min–max]")
    table = render_table(title, collect_rows(args.shapes, results),
                         [*notes(args.shapes, results, args.cores, time.monotonic() - started),
                          load_note(load_before, os.getloadavg()[0], args.cores)])
    failures = "".join(f"\noverhead: FAIL {line}\n" for line in results.failures)
    emit(table + failures, args.out)
    raise SystemExit(1 if results.failures else 0)


if __name__ == "__main__":
    main()
