"""Simulator runs for benchmarks: a job is a config (file + `--set` assignments) and a seed;
running it gives the simulator's evaluation records. Each job runs in its own Python
process, at most N at a time, one line printed per finished job so that hours-long
benchmarks show progress.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noloco_rt.config import Config, ConfigError, load_config, parse_assignment
from noloco_rt.simulation.simulator import records_as_dicts, run_simulation

RESULT_FILE = "result.json"


@dataclass(frozen=True)
class SimJob:
    """One simulation: `group` (a recipe) and `label` (a method or variant) name it in tables."""

    group: str
    label: str
    seed: int
    config_path: str | None
    assignments: tuple[str, ...]
    """SECTION.FIELD=VALUE, applied in order over the file; run.seed comes last."""
    threads: int = 1

    @property
    def run_dir_name(self) -> str:
        return f"{self.group}/{self.label}/seed{self.seed}"


def job_config(job: SimJob) -> Config:
    """The validated config of a job; raises ConfigError on a bad file or assignment."""
    layers = [parse_assignment(text) for text in job.assignments]
    layers.append({"run": {"seed": str(job.seed)}})
    return load_config(job.config_path, environ={}, overrides=layers)


def check_jobs(jobs: Sequence[SimJob]) -> None:
    """Build every job's config before anything runs, so that a typo fails in a second, not
    after an hour; the error names the group and label it came from."""
    for job in jobs:
        try:
            job_config(job)
        except ConfigError as exc:
            raise ValueError(f"{job.group}/{job.label}: {exc}") from None


def run_job(job: SimJob, out_root: Path) -> dict[str, Any]:
    """Run one simulation into out_root/group/label/seedN; return its records and timing."""
    import torch

    torch.set_num_threads(job.threads)
    cfg = job_config(job)
    started = time.monotonic()
    records = run_simulation(cfg, out_root / job.run_dir_name)
    return {"group": job.group, "label": job.label, "seed": job.seed, "wall_s": time.monotonic() - started,
            "job": dataclasses.asdict(job), "outer": dict(cfg.outer.resolved().__dict__),
            "records": records_as_dicts(records)}


def finished_result(job: SimJob, out_root: Path) -> dict[str, Any] | None:
    """The result an earlier invocation wrote for this very job (same config file, assignments,
    seed and threads), so a benchmark of hours stopped half-way resumes where it was; None
    when there is none, it is unreadable, or it was run with anything different. The code is
    not compared: delete OUT to rerun after changing what a simulation computes."""
    path = out_root / job.run_dir_name / RESULT_FILE
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(result, dict) or result.get("job") != json.loads(json.dumps(dataclasses.asdict(job))):
        return None
    return result


def progress_line(result: dict[str, Any], done: int, total: int) -> str:
    final = result["records"][-1]
    return (f"  [{done}/{total}] {result['group']} {result['label']} seed {result['seed']}: "
            f"val ppl {final['val_ppl']:.3f}  spread {final['spread']:.3e}  ({result['wall_s']:.0f} s)")


def _child_env(threads: int) -> dict[str, str]:
    repo_root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "OMP_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))}


class _Progress:
    """Results by job, and the progress line printed as each arrives (from any lane thread)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.results: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()

    def finished(self, job: SimJob, result: dict[str, Any], *, kept: bool = False) -> None:
        with self.lock:
            self.results[job.run_dir_name] = result
            line = progress_line(result, len(self.results), self.total)
            print(line + ("  (kept from an earlier run)" if kept else ""), flush=True)


def _run_lane(lane: int, pending: queue.SimpleQueue[SimJob], out_root: Path, progress: _Progress,
              stop: threading.Event, threads: int) -> None:
    """One child interpreter that runs jobs one after another (torch is imported once per
    lane, not per job): a job's JSON line in, a line back when its result file is written."""
    log_path = out_root / f"lane{lane}.stderr.log"
    cmd = [sys.executable, "-m", "benchmarks.sim_runs", str(out_root)]
    with log_path.open("w") as log, subprocess.Popen(cmd, env=_child_env(threads), stdin=subprocess.PIPE,
                                                     stdout=subprocess.PIPE, stderr=log, text=True) as child:
        assert child.stdin is not None and child.stdout is not None  # both are PIPE
        try:
            while not stop.is_set():
                try:
                    job = pending.get_nowait()
                except queue.Empty:
                    break
                child.stdin.write(json.dumps(dataclasses.asdict(job)) + "\n")
                child.stdin.flush()
                if not child.stdout.readline():
                    raise RuntimeError(f"{job.run_dir_name}: the simulation process died; "
                                       f"its stderr ends:\n{log_path.read_text()[-2000:]}")
                progress.finished(job, json.loads((out_root / job.run_dir_name / RESULT_FILE).read_text()))
        except BaseException:
            stop.set()  # a failed run stops the benchmark: the other lanes take no new job
            raise
        finally:
            child.stdin.close()  # end of input: the child returns, and Popen's exit waits for it


def run_jobs(jobs: Sequence[SimJob], out_root: Path, *, parallel: int) -> list[dict[str, Any]]:
    """Run every job, at most `parallel` at a time in child processes; results come back in
    the order of `jobs`. A job whose result an earlier call wrote under out_root is not run
    again (finished_result). Nothing outlives the call."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    out_root.mkdir(parents=True, exist_ok=True)
    pending: queue.SimpleQueue[SimJob] = queue.SimpleQueue()
    progress, stop = _Progress(len(jobs)), threading.Event()
    to_run = 0
    for job in jobs:
        earlier = finished_result(job, out_root)
        if earlier is not None:
            progress.finished(job, earlier, kept=True)
        else:
            pending.put(job)
            to_run += 1
    lanes = min(parallel, to_run)
    threads = max((job.threads for job in jobs), default=1)
    if lanes:  # none when every job was kept from an earlier run
        with ThreadPoolExecutor(max_workers=lanes) as pool:
            futures = [pool.submit(_run_lane, lane, pending, out_root, progress, stop, threads)
                       for lane in range(lanes)]
            for future in futures:
                future.result()
    return [progress.results[job.run_dir_name] for job in jobs]


def _child_main(out_root: Path) -> None:
    """Lane child: run each job named on stdin, answer one line on the real stdout when done."""
    reply, sys.stdout = sys.stdout, sys.stderr  # anything else printed goes to the log
    for line in sys.stdin:
        fields = json.loads(line)
        job = SimJob(**{**fields, "assignments": tuple(fields["assignments"])})
        result = run_job(job, out_root)
        (out_root / job.run_dir_name / RESULT_FILE).write_text(json.dumps(result))
        reply.write("done\n")
        reply.flush()


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]))
