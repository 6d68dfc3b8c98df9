"""Does the runtime train as well as the algorithm? `noloco-rt up` against `noloco-rt
simulate` on the same config, seeds and token count, scored the same way.

    python -m benchmarks.parity --seeds 0,1,2 --steps 1000 --out benchmarks/results/parity

Per seed: one simulation, then `up` runs of the same config in three scenarios:
- fault-free;
- half-speed: one worker (s0-r0) stopped half of every second from outside (SIGSTOP);
- faults: every --every seconds a SIGKILL (the supervisor restarts the worker) or a
  SIGSTOP of --hold seconds, alternately, on a random worker (benchmarks/parity_faults.py).

Equal tokens: every stage-0 replica feeds B = pipeline.max_inflight microbatches per inner
step, in the runtime and the simulation alike (one setting). Both consensus files
(the replicas' average) are scored by `noloco-rt eval` on the same validation tokens; the
spread is each run's final one over all replicas. Runtime columns say where it departs from
the lockstep algorithm: microbatches trained against the simulation's, inner steps skipped
by pulls, and how late corrections landed. Each run's folder keeps a result.json, and a
rerun reuses it: hours of runs survive an interruption, and --report-only tables what
has finished so far.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.matched_runs import RunFigures, run_up
from benchmarks.parity_faults import InjectedFaults, inject
from benchmarks.seed_stats import seed_range
from benchmarks.table import emit, markdown_table

SCENARIOS = ("fault-free", "half-speed", "faults")
HALF_SPEED_DUTY = 0.5
RESULT = "result.json"


def parse_list(text: str, kind: type = int) -> list:
    return [kind(part.strip()) for part in text.split(",") if part.strip()]


def shared_settings(args: argparse.Namespace) -> list[str]:
    """What both sides run with, beyond shape, steps and seed."""
    return [f"outer.h={args.h}", f"pipeline.max_inflight={args.inflight}", *args.settings]


def score(consensus: Path) -> float:
    """Validation loss of a consensus file, the same command for both sides."""
    reply = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "eval", "--json", str(consensus)],
                           check=True, capture_output=True, text=True)
    return float(json.loads(reply.stdout)["val_loss"])


def run_simulator(args: argparse.Namespace, seed: int, folder: Path) -> dict[str, Any]:
    settings = shared_settings(args)
    command = [sys.executable, "-m", "noloco_rt.cli", "simulate", "--stages", str(args.stages),
               "--replicas", str(args.replicas), "--steps", str(args.steps), "--seed", str(seed),
               "--eval-every", str(args.steps), "--out", str(folder),
               *(arg for value in settings for arg in ("--set", value))]
    started = time.monotonic()
    with (folder.parent / f"{folder.name}.log").open("w") as log:
        subprocess.run(command, check=True, stdout=log, stderr=subprocess.STDOUT,
                       env={**os.environ, "OMP_NUM_THREADS": str(os.cpu_count() or 1)})
    final = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    return {"val_loss": score(folder / "consensus.safetensors"), "spread": final["spread"],
            "trained": args.steps * args.replicas * args.inflight, "wall_s": time.monotonic() - started}


def run_runtime(args: argparse.Namespace, scenario: str, seed: int, folder: Path) -> dict[str, Any]:
    faults = InjectedFaults()
    disturb = (functools.partial(_faults_until_done, seed=seed, every_s=args.every, hold_s=args.hold, faults=faults)
               if scenario == "faults" else None)
    figures = run_up(args.stages, args.replicas, args.steps, args.h, seed=seed, tmp=folder,
                     duty=HALF_SPEED_DUTY if scenario == "half-speed" else 0.0, disturb=disturb,
                     settings=[f"pipeline.max_inflight={args.inflight}", *args.settings])
    out = folder / f"{args.stages}x{args.replicas}-{seed}"
    final = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "final"]
    if not final:
        raise SystemExit(f"{out}: up wrote no final record (no consensus); see {out / 'up.log'}")
    return {"val_loss": score(out / "consensus.safetensors"), "spread": final[-1]["spread"],
            "trained": sum(n for name, n in figures.trained.items() if name.startswith("s0-")),
            "skipped": figures.skipped, "pulled": figures.pulled, "delays": _delay_summary(figures),
            "faults": dict(faults.by_kind), "faults_missed": faults.missed, "wall_s": figures.wall_s}


def _faults_until_done(out: Path, done: Any, **kwargs: Any) -> None:
    inject(out / "up.log", done=done, **kwargs)


def _delay_summary(figures: RunFigures) -> dict[str, Any]:
    delays = figures.delays
    return {"rounds": len(delays), "at_most_one": sum(1 for d in delays if d <= 1), "max": max(delays, default=0)}


def cached(folder: Path, run: Any) -> dict[str, Any]:
    """The run's result.json if an earlier invocation finished it, else run it and keep one."""
    path = folder / RESULT
    if path.exists():
        return json.loads(path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    result = run(folder)
    path.write_text(json.dumps(result, indent=2))
    return result


def restore_from_report(out: Path) -> int:
    """Write back OUT/runs/LABEL/seedN/result.json for each run OUT/parity.json holds and
    OUT/runs lacks: parity.json is what is kept (runs/ folders are not committed), so a later
    invocation, on another machine too, tables or extends what earlier ones finished.
    Returns how many were restored."""
    report = out / "parity.json"
    if not report.is_file():
        return 0
    restored = 0
    for label, by_seed in json.loads(report.read_text()).get("results", {}).items():
        for seed, result in by_seed.items():
            path = out / "runs" / label / f"seed{int(seed)}" / RESULT
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result, indent=2))
                restored += 1
    return restored


def finished_runs(out: Path, labels: list[str], seeds: list[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """--report-only: the result.json of every run already finished, nothing run."""
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for label in labels:
        found = {seed: json.loads(path.read_text()) for seed in seeds
                 if (path := out / "runs" / label / f"seed{seed}" / RESULT).exists()}
        if found:
            results[label] = found
    return results


def run_all(args: argparse.Namespace) -> dict[str, dict[int, dict[str, Any]]]:
    """Scenario by scenario, every seed of one before the next: an interrupted benchmark
    leaves whole rows (the simulator and fault-free first)."""
    results: dict[str, dict[int, dict[str, Any]]] = {}
    for label in ("simulator", *args.scenarios):
        results[label] = {}
        for seed in args.seeds:
            run = (functools.partial(run_simulator, args, seed) if label == "simulator"
                   else functools.partial(run_runtime, args, label, seed))
            results[label][seed] = cached(args.out / "runs" / label / f"seed{seed}", run)
            _progress(label, seed, results[label][seed])
    return results


def _progress(label: str, seed: int, result: dict[str, Any]) -> None:
    print(f"  {label} seed {seed}: val loss {result['val_loss']:.4f}  spread {result['spread']:.3e}  "
          f"({result['wall_s']:.0f} s)", flush=True)


def _cell(values: list[float], fmt: str) -> str:
    r = seed_range(values)
    return f"{r.mean:{fmt}} [{r.lo:{fmt}}–{r.hi:{fmt}}]" if r.count else "-"


def rows(results: dict[str, dict[int, dict[str, Any]]]) -> list[list[object]]:
    sim = results["simulator"]
    table = []
    for label, by_seed in results.items():
        seeds = sorted(by_seed)
        runs = [by_seed[s] for s in seeds]
        ratio = [by_seed[s]["val_loss"] / sim[s]["val_loss"] for s in seeds if s in sim]
        tokens = [by_seed[s]["trained"] / sim[s]["trained"] for s in seeds if s in sim]
        delays = [r["delays"] for r in runs if "delays" in r]
        late = (f"{100 * sum(d['at_most_one'] for d in delays) / max(1, sum(d['rounds'] for d in delays)):.0f} % ≤ 1, "
                f"max {max(d['max'] for d in delays)}") if delays else "-"
        faults = sum((sum(r.get("faults", {}).values()) for r in runs), 0)
        table.append([label, len(seeds), _cell([r["val_loss"] for r in runs], ".4f"), _cell(ratio, ".4f"),
                      _cell([r["spread"] for r in runs], ".2e"), _cell(tokens, ".3f"),
                      _cell([r["skipped"] for r in runs if "skipped" in r], ".0f"),
                      _cell([r["pulled"] for r in runs if "pulled" in r], ".0f"), late,
                      faults if label == "faults" else "-", f"{sum(r['wall_s'] for r in runs) / len(runs):.0f}"])
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=parse_list, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=1000, help="run.steps of both sides")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--h", type=int, default=10, help="outer.h (make up's)")
    parser.add_argument("--inflight", type=int, default=4,
                        help="microbatches per inner step of both sides (pipeline.max_inflight)")
    parser.add_argument("--scenarios", type=lambda t: parse_list(t, str), default=list(SCENARIOS))
    parser.add_argument("--every", type=float, default=40.0, help="seconds between faults (faults scenario)")
    parser.add_argument("--hold", type=float, default=3.0, help="SIGSTOP length, seconds (faults scenario)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="passed on to both sides (repeatable)")
    parser.add_argument("--out", type=Path, required=True, help="runs go to OUT/runs, the table to OUT/parity.md")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: the table of the runs already finished under OUT/runs")
    args = parser.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}")
    restored = restore_from_report(args.out)
    if restored:
        print(f"{restored} finished runs restored from {args.out / 'parity.json'}", flush=True)
    results = (finished_runs(args.out, ["simulator", *args.scenarios], args.seeds) if args.report_only
               else run_all(args))
    if "simulator" not in results:
        parser.error(f"no finished simulation under {args.out / 'runs'}: every ratio is against it")
    (args.out / "parity.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                      "results": results}, indent=2))
    title = (f"Runtime against simulator: tiny {args.stages} × {args.replicas}, {args.steps} inner steps, "
             f"h = {args.h}, {args.inflight} microbatches per inner step, seeds {args.seeds}")
    emit(markdown_table(title, ["run", "seeds", "consensus val loss", "loss / simulator's", "final spread",
                                "microbatches / simulator's", "inner steps skipped (all workers)", "pulls",
                                "correction delay (inner steps)", "faults", "wall s (mean)"], rows(results)),
         args.out / "parity.md")


if __name__ == "__main__":
    main()
