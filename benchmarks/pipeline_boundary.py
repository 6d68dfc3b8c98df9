"""Where a 2-stage pipeline's step boundary goes: the overhead benchmark's pipeline shape
(benchmarks/overhead.py), `up --stages 2 --replicas 1`, with every data-path call of both
workers timestamped (benchmarks/boundary_trace/).

    PYTHONPATH=. .venv/bin/python -m benchmarks.pipeline_boundary [--runs 3] [--out FILE]

At each inner step the last stage waits for stage 0: the gradient of the step's last
microbatch crosses back, stage 0 runs that microbatch's backward, its inner step and the next
step's first forward, and the activation crosses over. The schedule's ideal counts one
stage's forward + backward for that wait; the table splits what the runtime spends, and
what each worker spends per step, as medians over the inner steps of the middle of the run,
with how much of each call its thread spent off the CPU (a compute call's share is time
lost to other threads and processes). Tracing costs a few microseconds a call.

After each traced run, benchmarks/plain_pipeline.py trains the same shape by hand, over
pipes and then over ZeroMQ with a receiving thread (the runtime's transport and threads,
without the rest of it), and a third table holds the three side by side in slots: a step
over its slowest stage's compute per microbatch (forward, backward and loss, as each
measured them). The schedule's ideal is B + S - 1 slots; slots do not move with the
machine's speed, which drifts between runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from benchmarks.gpu_check import child_env, runtime_config
from benchmarks.overhead import (
    SHAPES,
    format_spread,
    git_commit,
    plain_pipeline_shape,
    run_up,
    spread,
)
from benchmarks.plain_pipeline import run_plain_pipeline
from benchmarks.table import emit, markdown_table

TRACER = Path(__file__).resolve().parent / "boundary_trace"
SKIP_STEPS = 50
"""Inner steps left out at the start (start-up, warm-up) before the steps analysed."""

Record = tuple
"""(call, start, end, took a message[, CPU seconds of the calling thread]), perf_counter
seconds; see boundary_trace/sitecustomize.py."""
OFF_CPU = " off the CPU"
"""per_step's key suffix: of a call's time, what its thread spent waiting or runnable
while other threads had the cores (wall minus thread CPU)."""

BOUNDARY = ("the gradient crosses back", "stage 0: the last backward", "stage 0: inner step",
            "stage 0: between calls", "stage 0: the next first forward", "stage 0: forward to sent",
            "the activation crosses over")
"""The wait of the last stage at a step boundary, part by part; they add up to it."""


def _last(records: Sequence[Record], name: str, before: float, *, took: bool | None = None) -> Record:
    return next(r for r in reversed(records) if r[0] == name and r[2] <= before and (took is None or r[3] == took))


def _first(records: Sequence[Record], name: str, after: float, *, took: bool | None = None,
           ended: bool = False) -> Record:
    """The first such call that started (or, `ended`, ended: a receive may wait from before) after `after`."""
    return next(r for r in records if r[0] == name and r[2 if ended else 1] >= after
                and (took is None or r[3] == took))


def boundary_parts(first: Sequence[Record], last: Sequence[Record], *, skip: int = SKIP_STEPS,
                   steps: int = 100) -> dict[str, list[float]]:
    """Milliseconds of each part of the last stage's wait (BOUNDARY, then "the last stage's
    wait"), one value per inner step of stage 0 from `skip` on, `steps` of them."""
    parts: dict[str, list[float]] = {name: [] for name in (*BOUNDARY, "the last stage's wait")}
    for step in [r for r in first if r[0] == "inner_step"][skip:skip + steps]:
        gradient = _last(first, "gradient", step[1])
        received = _last(first, "receive", step[1], took=True)
        replied = _last(last, "send", received[2])
        forward = _first(first, "forward", step[2])
        sent = _first(first, "send", forward[2])
        arrived = _first(last, "receive", sent[2], took=True, ended=True)
        values = (received[2] - replied[2], gradient[2] - gradient[1], step[2] - step[1],
                  (step[1] - gradient[2]) + (forward[1] - step[2]), forward[2] - forward[1], sent[2] - forward[2],
                  arrived[2] - sent[2], arrived[2] - replied[2])
        for name, seconds in zip(parts, values, strict=True):
            parts[name].append(seconds * 1000)
    return parts


def per_step(records: Sequence[Record], *, skip: int = SKIP_STEPS, steps: int = 100) -> dict[str, float]:
    """Milliseconds per inner step of each call (and of a whole step), over `steps` inner steps
    from `skip` on; a receive that waited and took a message counts as "receive (waiting)".
    Records that carry their CPU seconds also give "<call> off the CPU" (see OFF_CPU)."""
    ends = [r[2] for r in records if r[0] == "inner_step"][skip:skip + steps + 1]
    if len(ends) < 2:
        raise ValueError(f"{len(ends)} inner steps traced after the first {skip}: too few")
    window = [r for r in records if ends[0] <= r[1] < ends[-1]]
    count = len(ends) - 1
    totals: dict[str, float] = {"a whole inner step": (ends[-1] - ends[0]) * 1000 / count}
    for name, start, end, took, *cpu in window:
        key = "receive (waiting)" if name == "receive" and took else name
        totals[key] = totals.get(key, 0.0) + (end - start) * 1000 / count
        if cpu:
            totals[key + OFF_CPU] = totals.get(key + OFF_CPU, 0.0) + (end - start - cpu[0]) * 1000 / count
    return totals


COMPUTE_CALLS = {0: ("forward", "gradient"), 1: ("forward", "loss_backward")}
"""The traced calls that hold each stage's forward and backward (the gradient call of stage 0
also takes the message in, a few microseconds)."""


@dataclasses.dataclass(frozen=True)
class Slots:
    """One pipeline's step in slots of its slowest stage's compute per microbatch."""

    step_ms: float
    compute_ms: float
    """The slowest stage's forward + backward per microbatch."""

    @property
    def slots(self) -> float:
        return self.step_ms / self.compute_ms


def runtime_slots(totals: dict[str, dict[str, float]], microbatches: int) -> Slots:
    """From a traced run's per-step totals (per_step of each stage)."""
    compute = max(sum(totals[f"stage {k}"].get(name, 0.0) for name in names) / microbatches
                  for k, names in COMPUTE_CALLS.items())
    return Slots(totals["stage 0"]["a whole inner step"], compute)


PIPELINES = ("noloco-rt 2 x 1", "plain 2-process pipeline, right after", "the same over ZeroMQ, then")
"""The slots table's rows: the traced run, then plain_slots over each transport."""


def plain_slots(steps: int, transport: str = "pipe") -> Slots:
    """The plain pipeline of the traced shape over `transport`, trained now (about 15 s on 2
    cores), with the vocabulary and optimizer the traced run's configuration gave its workers."""
    spec = SHAPES["pipeline"]
    shape = plain_pipeline_shape(spec, runtime_config(spec.settings()), device=torch.device("cpu"), threads=1,
                                 steps=steps)
    result = run_plain_pipeline(shape, transport=transport)
    return Slots(result.step_s * 1000, max(result.compute_s_per_microbatch) * 1000)


def load_traces(trace_dir: Path) -> dict[int, list[Record]]:
    """The trace of each worker, by its stage (read from its command line)."""
    traces: dict[int, list[Record]] = {}
    for path in trace_dir.glob("*.jsonl"):
        head, *lines = path.read_text().splitlines()
        argv, records = json.loads(head)["argv"], [json.loads(line) for line in lines]
        if "--stage" in argv and records:
            traces[int(argv[argv.index("--stage") + 1])] = [tuple(r) for r in records]
    return traces


def measure(runs: int, steps: int, runs_dir: Path, timeout_s: float) -> tuple[list[dict], list[dict], list[tuple]]:
    """Each run's boundary medians, per-step totals of both workers, and the slots of each of PIPELINES."""
    spec = dataclasses.replace(SHAPES["pipeline"], steps=steps)
    boundaries, totals, slots = [], [], []
    for run in range(1, runs + 1):
        out, trace_dir = runs_dir / f"run-{run}", runs_dir / f"trace-{run}"
        trace_dir.mkdir(parents=True)
        env = {"BOUNDARY_TRACE_DIR": str(trace_dir),
               "PYTHONPATH": os.pathsep.join((str(TRACER), child_env()["PYTHONPATH"]))}
        code = run_up(spec, out, device=torch.device("cpu"), timeout_s=timeout_s, extra_env=env)
        if code != 0:
            raise SystemExit(f"pipeline_boundary: `up` exited with {code} (see {out / 'up.out'})")
        traces = load_traces(trace_dir)
        analysed = min(100, steps - SKIP_STEPS - 10)
        boundaries.append({k: statistics.median(v) for k, v in
                           boundary_parts(traces[0], traces[1], steps=analysed).items()})
        totals.append({f"stage {k}": per_step(traces[k], steps=analysed) for k in (0, 1)})
        slots.append((runtime_slots(totals[-1], spec.max_inflight), plain_slots(steps), plain_slots(steps, "zmq")))
        print(f"pipeline_boundary: run {run}/{runs} done", flush=True)
    return boundaries, totals, slots


def _off_cpu_cell(totals: list[dict[str, float]], name: str) -> str:
    """A call's time off the CPU over the runs whose traces carried CPU seconds ("–": none did)."""
    values = [t[name + OFF_CPU] for t in totals if name + OFF_CPU in t]
    return format_spread(spread(values), ".2f") if values else "–"


def slots_table(slots: list[tuple[Slots, ...]], microbatches: int, stages: int) -> str:
    """One row per pipeline measured in every run (the first len(run) of PIPELINES)."""
    rows = [[name, format_spread(spread([run[side].step_ms for run in slots]), ".1f"),
             format_spread(spread([run[side].compute_ms for run in slots]), ".2f"),
             format_spread(spread([run[side].slots for run in slots]), ".2f")]
            for side, name in enumerate(PIPELINES[:min(len(run) for run in slots)])]
    return markdown_table(f"A step in slots of the slowest stage's compute per microbatch (the ideal: B + S - 1 = "
                          f"{microbatches + stages - 1}), run by run with plain pipelines",
                          ["pipeline", "step ms", "compute ms per microbatch", "slots"], rows)


def render(boundaries: list[dict], totals: list[dict], commit_note: str,
           slots: list[tuple[Slots, ...]] | None = None) -> str:
    rows = [[name, format_spread(spread([b[name] for b in boundaries]), ".2f")] for name in boundaries[0]]
    text = markdown_table(f"The last stage's wait at a step boundary, ms: median over runs [min–max] of each "
                          f"run's median; {commit_note}", ["part", "ms"], rows)
    for stage in ("stage 0", "stage 1"):
        calls = {n for t in totals for n in t[stage] if not n.endswith(OFF_CPU)}
        names = sorted(calls, key=lambda n: -totals[0][stage].get(n, 0.0))
        rows = [[n, format_spread(spread([t[stage].get(n, 0.0) for t in totals]), ".2f"),
                 _off_cpu_cell([t[stage] for t in totals], n)] for n in names]
        text += "\n" + markdown_table(f"{stage}: ms per inner step in each call, and of it off the CPU (waiting, "
                                       f"or runnable while other threads had the cores)",
                                       ["call", "ms per step", "off the CPU"], rows)
    if slots:
        spec = SHAPES["pipeline"]
        text += "\n" + slots_table(slots, spec.max_inflight, spec.stages)
    return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="inner steps of each run (at least 80)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per `up` run")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < SKIP_STEPS + 30:
        parser.error(f"need --runs >= 1 and --steps >= {SKIP_STEPS + 30}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="boundary-") as tmp:
        boundaries, totals, slots = measure(args.runs, args.steps, Path(tmp), args.timeout_s)
    emit(render(boundaries, totals, f"commit {git_commit()}, {args.runs} run(s) of {args.steps} steps", slots),
         args.out)


if __name__ == "__main__":
    main()
