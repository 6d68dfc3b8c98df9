"""`make gpu-check`: a gate on `noloco-rt up` on CUDA, and its speed beside a plain PyTorch loop
(benchmarks/README.md says what is run, checked and measured, column by column).

    python -m benchmarks.gpu_check [--presets small,125m,1b] [--steps 60] [--seq-len 1024]
        [--outer-h 10] [--peak-tflops 989] [--out benchmarks/results/gpu_check.md]

Per preset, on one GPU: `up` with 2 stages x 2 replicas and with 1 x 1, then
benchmarks/plain_loop.py eager and compiled on the same tokens per step. One table: tokens/s and
their ratio to the plain eager loop, MFU, peak memory per worker, and per outer step the
exchange's seconds, its wire bytes and the training thread's blocked share. Exit 1, one
`gpu-check: FAIL` line each, when a run exits non-zero, a worker logs too little progress, an
outer step of a multi-replica run is not matched, any event is logged at error level, or a
worker's loss does not fall. Without CUDA this says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from benchmarks.plain_loop import MODES, PlainLoopResult
from benchmarks.table import emit, markdown_table
from noloco_rt.config import Config, ConfigError, load_config, parse_assignment
from noloco_rt.config.presets import PRESETS
from noloco_rt.logs import LogRecord, read_json_lines, record_seconds
from noloco_rt.model.llama import build_stage, stage_layer_range

PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}
"""Dense bfloat16 tensor-core peaks from the vendors' data sheets (no sparsity)."""
PRESET_SETTINGS: dict[str, tuple[str, ...]] = {}
"""Settings a preset's runs need beyond the defaults: none since workers size their in-flight
count and activation checkpointing from the GPU's memory (pipeline.max_inflight = 0)."""
PRESET_NOTES: dict[str, str] = {}
DEFAULT_MODES = ("eager", "compiled")
"""The plain loops of a default check (cuda-graphs on request: --plain eager,compiled,cuda-graphs)."""
SHAPES = ((2, 2), (1, 1))
"""(stages, replicas) of the runtime's runs."""
MIN_PROGRESS_LINES = 3  # step 1 (with start-up), and two more to measure a rate between
ERROR_LEVELS = frozenset({"error", "critical", "exception"})
TRAINING_EVENTS = frozenset({"train_progress", "outer_step_done", "steps_done"})
EventsByWorker = dict[str, list[LogRecord]]


@dataclass(frozen=True)
class WorkerFigures:
    name: str
    stage: int
    tokens_per_s: float
    gpu_peak_mib: float


@dataclass(frozen=True)
class Measured:
    """One row of the table: a runtime run or a plain loop; None where it does not apply."""

    name: str
    tokens_per_s: float
    mfu: float
    peak_mib: float
    exchange_s: float | None = None
    wire_bytes: float | None = None
    blocked_share: float | None = None
    blocked_by_stage: dict[int, float] | None = None
    """The mean blocked share of each stage's workers: a later stage waits for its partners most."""


def flops_per_token(preset: str, *, stage: int, stages: int, seq_len: int, vocab_size: int) -> float:
    """Model FLOPs of one token through one stage, forward and backward."""
    shape = PRESETS[preset]
    module = build_stage(preset, vocab_size=vocab_size, stage=stage, num_stages=stages, seed=0, device="meta")
    params = sum(p.numel() for p in module.parameters())
    layers = len(stage_layer_range(shape.n_layers, stages, stage))
    return 6.0 * params + 12.0 * layers * seq_len * shape.dim


def peak_tflops(device_name: str) -> float | None:
    """The dense bfloat16 peak of a GPU known by name, or None."""
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in device_name.upper()), None)


def _named(events: list[LogRecord], name: str) -> list[LogRecord]:
    return [e for e in events if e.get("event") == name]


def read_worker_events(logs: Path) -> EventsByWorker:
    """Each worker log's JSON events, by file stem (name.incarnation)."""
    return {path.stem: read_json_lines(path)[0] for path in sorted(logs.glob("*.log"))}


def worker_figures(events_by_worker: EventsByWorker, tokens_per_step: int) -> list[WorkerFigures]:
    """One row per worker that has enough progress lines to measure."""
    rows = []
    for name, events in events_by_worker.items():
        progress = _named(events, "train_progress")
        if len(progress) < MIN_PROGRESS_LINES:
            continue
        first, last = progress[1], progress[-1]  # the first line (step 1) includes start-up
        span = record_seconds(last["timestamp"]) - record_seconds(first["timestamp"])
        if span <= 0:
            continue
        rate = (last["inner_step"] - first["inner_step"]) * tokens_per_step / span
        peak = max((e.get("gpu_peak_mib", 0.0) for e in progress), default=0.0)
        rows.append(WorkerFigures(name, int(last.get("stage", -1)), rate, peak))
    return rows


def _progress_failures(events_by_worker: EventsByWorker) -> list[str]:
    if not events_by_worker:
        return ["no worker log"]
    counts = {name: len(_named(events, "train_progress")) for name, events in events_by_worker.items()}
    return [f"too little progress on {name} ({count} train_progress lines, need {MIN_PROGRESS_LINES})"
            for name, count in counts.items() if count < MIN_PROGRESS_LINES]


def _outer_step_failures(events_by_worker: EventsByWorker) -> list[str]:
    kinds = Counter(e.get("kind", "no kind") for events in events_by_worker.values()
                    for e in _named(events, "outer_step_done"))
    if not kinds:
        return ["no outer step logged"]
    unmatched = {kind: count for kind, count in kinds.most_common() if kind != "matched"}
    if not unmatched:
        return []
    by_kind = ", ".join(f"{kind} {count}" for kind, count in unmatched.items())
    return [f"{sum(unmatched.values())} of {kinds.total()} outer steps not matched ({by_kind})"]


def _error_failures(events_by_worker: EventsByWorker) -> list[str]:
    errors = Counter(e.get("event", "?") for events in events_by_worker.values() for e in events
                     if str(e.get("level", "")).lower() in ERROR_LEVELS)
    if not errors:
        return []
    return ["error-level events: " + ", ".join(f"{event} {count}" for event, count in errors.most_common())]


def _loss_failures(events_by_worker: EventsByWorker) -> list[str]:
    failures, checked = [], 0
    for name, events in events_by_worker.items():
        losses = [e["loss"] for e in _named(events, "train_progress") if "loss" in e]
        if len(losses) < 2:
            continue  # not the last stage, or too little progress (reported apart)
        checked += 1
        if not losses[-1] < losses[0]:
            failures.append(f"loss did not fall on {name}: {losses[0]} -> {losses[-1]}")
    return failures if checked else ["no worker logged a training loss twice"]


def gate_failures(run_label: str, events_by_worker: EventsByWorker, *, replicas: int,
                  returncode: int = 0) -> list[str]:
    """What is wrong with one fault-free run, one line each; [] when it passes. A run with one
    replica per stage has no partners: its outer steps are local by design, so only runs with
    several replicas are held to matching."""
    failures = [f"exited with code {returncode}"] if returncode != 0 else []
    failures += _progress_failures(events_by_worker)
    if replicas > 1:
        failures += _outer_step_failures(events_by_worker)
    failures += _error_failures(events_by_worker) + _loss_failures(events_by_worker)
    return [f"gpu-check: FAIL {run_label}: {failure}" for failure in failures]


def _blocked_share(events: list[LogRecord]) -> float | None:
    """outer_blocked_s of the worker's summary over its training span: from its first progress
    line to its last training event (an outer step can follow the last progress line)."""
    summary, progress = _named(events, "worker_summary"), _named(events, "train_progress")
    if not summary or not progress:
        return None
    start = record_seconds(progress[0]["timestamp"])
    end = max(record_seconds(e["timestamp"]) for e in events if e.get("event") in TRAINING_EVENTS)
    return summary[-1].get("outer_blocked_s", 0.0) / (end - start) if end > start else None


def _stage_of(events: list[LogRecord]) -> int:
    return int(next((e["stage"] for e in reversed(_named(events, "train_progress")) if "stage" in e), -1))


def runtime_row(name: str, events_by_worker: EventsByWorker, *, tokens_per_step: int,
                flops_of_stage: dict[int, float], tflops: float) -> Measured:
    """A run's row: pipeline tokens/s (its stage-0 workers), summed MFU, the largest worker peak,
    and per outer step the means over its workers."""
    figures = worker_figures(events_by_worker, tokens_per_step)
    outer = [e for events in events_by_worker.values() for e in _named(events, "outer_step_done")]
    exchange_s = [e["exchange_s"] for e in outer if "exchange_s" in e]
    wire_bytes = [e["wire_bytes"] for e in outer if "wire_bytes" in e]
    shares = {worker: s for worker, events in events_by_worker.items() if (s := _blocked_share(events)) is not None}
    by_stage: dict[int, list[float]] = {}
    for worker, share in shares.items():
        by_stage.setdefault(_stage_of(events_by_worker[worker]), []).append(share)
    return Measured(name=name, tokens_per_s=sum(f.tokens_per_s for f in figures if f.stage == 0),
                    mfu=sum(f.tokens_per_s * flops_of_stage[f.stage] for f in figures) / (tflops * 1e12),
                    peak_mib=max((f.gpu_peak_mib for f in figures), default=0.0),
                    exchange_s=mean(exchange_s) if exchange_s else None,
                    wire_bytes=mean(wire_bytes) if wire_bytes else None,
                    blocked_share=mean(shares.values()) if shares else None,
                    blocked_by_stage={stage: mean(v) for stage, v in sorted(by_stage.items())} if shares else None)


def _cell(value: float | None, spec: str, scale: float = 1.0, unit: str = "") -> str:
    return "–" if value is None else f"{value * scale:{spec}}{unit}"


def _blocked_cell(row: Measured) -> str:
    """The mean blocked share, and each stage's where there are several: '2.0 % (0.4 / 3.6)'."""
    cell = _cell(row.blocked_share, ".1f", 100, " %")
    if row.blocked_by_stage and len(row.blocked_by_stage) > 1:
        cell += " (" + " / ".join(f"{share * 100:.1f}" for share in row.blocked_by_stage.values()) + ")"
    return cell


def render_table(title: str, rows_by_preset: dict[str, list[Measured]], notes: list[str]) -> str:
    """One markdown table of every preset's rows, tokens/s also as a ratio to its plain eager row."""
    header = ["preset", "run", "tokens/s", "× plain eager", "MFU", "peak MiB per worker",
              "exchange s per outer step", "wire MiB per exchange", "blocked share (by stage)"]
    table = []
    for preset, rows in rows_by_preset.items():
        eager = next((r.tokens_per_s for r in rows if r.name == "plain eager"), None)
        for row in rows:
            ratio = row.tokens_per_s / eager if eager else None
            table.append([preset, row.name, f"{row.tokens_per_s:,.0f}", _cell(ratio, ".2f", unit="×"),
                          _cell(row.mfu, ".2f", 100, " %"), f"{row.peak_mib:,.0f}", _cell(row.exchange_s, ".3f"),
                          _cell(row.wire_bytes, ".2f", 1 / 2**20), _blocked_cell(row)])
    return markdown_table(title, header, table) + "".join(f"\n{note}\n" for note in notes)


def child_env() -> dict[str, str]:
    """Children find this checkout's packages without an install (the GPU machine has no venv)."""
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}


def run_bounded(command: list[str], timeout_s: float, *, capture: bool = False) -> tuple[int, str]:
    """Run a command in its own process group (`up` starts workers); on timeout end the whole
    group and return 124. Returns the exit code and, when captured, stdout."""
    print(f"gpu-check: {' '.join(command[2:])}", flush=True)
    with subprocess.Popen(command, env=child_env(), start_new_session=True, text=True,
                          stdout=subprocess.PIPE if capture else None) as child:
        try:
            stdout, _ = child.communicate(timeout=timeout_s)
            return child.returncode, stdout or ""
        except subprocess.TimeoutExpired:
            print(f"gpu-check: timed out after {timeout_s:.0f} s; ending it (exit code 124)", flush=True)
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            return 124, ""


def runtime_settings(preset: str, args: argparse.Namespace) -> list[str]:
    """The --set flags of the preset's runs."""
    return [f"model.seq_len={args.seq_len}", f"outer.h={args.outer_h}", *PRESET_SETTINGS.get(preset, ()),
            *args.set]


def runtime_config(settings: list[str]) -> Config:
    """The config `up` runs with under these --set flags (defaults otherwise)."""
    return load_config(environ={}, overrides=[parse_assignment(s) for s in settings])


@dataclass(frozen=True)
class PresetCheck:
    rows: list[Measured]
    failures: list[str]
    sequences_per_step: int
    """max_inflight x batch_size: of the runtime's inner step and of the plain loop's step."""


def earlier_runs(runs: Path, presets: list[str], shapes: tuple[tuple[int, int], ...]) -> list[Path]:
    """The run folders under `runs` that are not empty: a run there would resume its checkpoints."""
    folders = [runs / preset / f"{stages}x{replicas}" for preset in presets for stages, replicas in shapes]
    return [folder for folder in folders if folder.is_dir() and any(folder.iterdir())]


def check_preset(preset: str, args: argparse.Namespace, out: Path, tflops: float) -> PresetCheck:
    """The runtime's runs and the plain loops of one preset: their rows and the gate's failures."""
    settings = runtime_settings(preset, args)
    cfg = runtime_config(settings)
    sequences = cfg.pipeline.microbatches_per_step * cfg.data.batch_size  # 0 (from memory) keeps 4 wherever 4 fit
    tokens_per_step, vocab = sequences * cfg.model.seq_len, cfg.model.vocab_size
    rows, failures = [], []
    for stages, replicas in args.shapes:
        label, run_out = f"{preset} {stages}x{replicas}", out / f"{stages}x{replicas}"
        code, _ = run_bounded([sys.executable, "-m", "noloco_rt.cli", "up", "--stages", str(stages), "--replicas",
                               str(replicas), "--steps", str(args.steps), "--preset", preset, "--out", str(run_out),
                               "--no-coordinator", *(f for s in settings for f in ("--set", s))], args.timeout_s)
        events = read_worker_events(run_out / "logs")
        failures += gate_failures(label, events, replicas=replicas, returncode=code)
        flops = {s: flops_per_token(preset, stage=s, stages=stages, seq_len=args.seq_len, vocab_size=vocab)
                 for s in range(stages)}
        name = " ".join((f"noloco-rt {stages}x{replicas}", *args.set))  # the row says what it was asked
        rows.append(runtime_row(name, events, tokens_per_step=tokens_per_step,
                                flops_of_stage=flops, tflops=tflops))
    whole_model = flops_per_token(preset, stage=0, stages=1, seq_len=args.seq_len, vocab_size=vocab)
    for mode in args.plain:
        code, stdout = run_bounded([sys.executable, "-m", "benchmarks.plain_loop", "--preset", preset, "--mode", mode,
                                    "--sequences", str(sequences), "--seq-len",
                                    str(args.seq_len), "--vocab-size", str(vocab), "--steps", str(args.plain_steps)],
                                   args.timeout_s, capture=True)
        lines = stdout.strip().splitlines()
        if code != 0 or not lines:
            failures.append(f"gpu-check: FAIL {preset} plain {mode}: exited with code {code}, no result")
            continue
        result = PlainLoopResult(**json.loads(lines[-1]))
        rows.append(Measured(f"plain {mode}", result.tokens_per_s, result.tokens_per_s * whole_model / (tflops * 1e12),
                             result.peak_mib))
    return PresetCheck(rows, failures, sequences)


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """'2x2,1x1' -> ((2, 2), (1, 1)): a shorter check where GPU time is short."""
    try:
        shapes = tuple((int(a), int(b)) for a, b in (part.strip().lower().split("x") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shapes are STAGESxREPLICAS, comma-separated (2x2,1x1), not {text!r}") from None
    if not shapes or any(n < 1 for shape in shapes for n in shape):
        raise argparse.ArgumentTypeError(f"shapes need at least one stage and one replica: {text!r}")
    return shapes


def parse_modes(text: str) -> tuple[str, ...]:
    """'eager,compiled' -> ('eager', 'compiled'); 'none' -> ()."""
    modes = () if text.strip() == "none" else tuple(m.strip() for m in text.split(","))
    if unknown := [m for m in modes if m not in MODES]:
        raise argparse.ArgumentTypeError(f"plain loop modes are {', '.join(MODES)} or none, not {', '.join(unknown)}")
    return modes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="small,125m,1b")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--outer-h", type=int, default=10, help="inner steps per outer step: several per run")
    parser.add_argument("--plain-steps", type=int, default=30, help="timed steps of the plain loop")
    parser.add_argument("--peak-tflops", type=float, default=None, help="the GPU's dense bf16 peak, if not known")
    parser.add_argument("--timeout-s", type=float, default=1200.0, help="per run")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES,
                        help="the runtime's runs, STAGESxREPLICAS, comma-separated (default 2x2,1x1)")
    parser.add_argument("--plain", type=parse_modes, default=DEFAULT_MODES,
                        help=f"the plain loop's modes ({', '.join(MODES)}), comma-separated (default "
                             f"{','.join(DEFAULT_MODES)}; 'none' for none)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a setting of the runtime's runs beyond the defaults (repeatable), e.g. "
                             "model.cuda_graphs=on; its rows are named with it")
    parser.add_argument("--runs", type=Path, default=None,
                        help="keep each run's folder (logs, checkpoints) here; default: a temporary folder, deleted")
    args = parser.parse_args(argv)
    try:  # a bad --set is said now, not after the first run's minutes on the GPU
        runtime_config(args.set)
    except ConfigError as exc:
        parser.error(f"--set: {exc}")
    presets = [p.strip() for p in args.presets.split(",")]
    if args.runs is not None and (used := earlier_runs(args.runs, presets, args.shapes)):
        print(f"gpu-check: {used[0]} holds an earlier run, whose checkpoints `up` would resume (it would train "
              "nothing); give --runs an empty or new folder", file=sys.stderr)
        raise SystemExit(2)
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was run", file=sys.stderr)
        raise SystemExit(2)
    device_name = torch.cuda.get_device_name(0)
    tflops = args.peak_tflops or peak_tflops(device_name)
    if tflops is None:
        print(f"gpu-check: the bf16 peak of {device_name!r} is not known; pass --peak-tflops", file=sys.stderr)
        raise SystemExit(2)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        runs = args.runs or Path(tmp)
        checks = {preset: check_preset(preset, args, runs / preset, tflops) for preset in presets}
    title = (f"`noloco-rt up` against a plain PyTorch loop on {device_name} (dense bf16 peak {tflops:.0f} TFLOPS), "
             f"{args.steps} steps, outer.h = {args.outer_h}, seq_len {args.seq_len}; the plain loop trains the "
             "tokens of the runtime's inner step in one batch")
    notes = [f"{preset}: {check.sequences_per_step} x {args.seq_len} tokens per step, runtime and plain loop"
             + (f" ({PRESET_NOTES[preset]})" if preset in PRESET_NOTES else "") for preset, check in checks.items()]
    failures = [line for check in checks.values() for line in check.failures]
    runs = len(presets) * (len(args.shapes) + len(args.plain))
    verdict = "\n".join(failures) or f"gpu-check: PASS ({runs} runs)"
    table = render_table(title, {preset: check.rows for preset, check in checks.items()}, notes)
    emit(table + f"\n```\n{verdict}\n```\n", args.out)
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
