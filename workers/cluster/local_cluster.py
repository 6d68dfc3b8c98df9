"""A local cluster for tests and benchmarks: a real redis-server and real `noloco-rt worker` processes.

Workers log JSON lines to one file each; tests wait on those events with deadlines
(never fixed sleeps) and everything is torn down, SIGKILL as the last resort.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from noloco_rt.config import load_config
from noloco_rt.data import load_corpus, validation_batches
from noloco_rt.logs import read_json_lines
from noloco_rt.membership.embedded_redis import EmbeddedRedis, random_password
from noloco_rt.membership.records import WorkerState
from noloco_rt.membership.redis_access import connect
from noloco_rt.membership.table import Membership
from noloco_rt.model.llama import build_stage, lm_loss
from workers.supervise.preloaded import ForkedProcess

Event = dict[str, Any]


def read_events(log_path: Path, event: str | None = None) -> list[Event]:
    """The JSON log lines of a file (all, or those of one event); other lines are skipped."""
    records, _ = read_json_lines(log_path)
    return [r for r in records if event is None or r.get("event") == event]


ERROR_LEVELS = ("error", "critical", "exception")


def error_events(log_paths: Iterable[Path]) -> list[Event]:
    """Error-level lines of these logs: a fault-free run must have none (an error on a
    background path is a bug, even when training went on)."""
    return [e | {"log": p.name} for p in log_paths for e in read_events(p) if e.get("level") in ERROR_LEVELS]


@dataclass
class WorkerProcess:
    name: str
    stage: int
    process: subprocess.Popen | ForkedProcess
    log_path: Path

    def events(self, event: str | None = None) -> list[Event]:
        return read_events(self.log_path, event)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def latest_inner_step(self) -> int:
        steps = [e.get("inner_step", 0) for e in self.events() if "inner_step" in e]
        return max(steps, default=0)

    def outer_steps_jumped_over(self) -> int:
        """Outer steps its last summary says a pull jumped over (never taken, never logged)."""
        summaries = self.events("worker_summary")
        return summaries[-1].get("skipped_outer_steps", 0) if summaries else 0


def each_outer_step_once(steps: list[int], *, first: int, last: int, jumped_over: int) -> bool:
    """Outer steps logged in order, each once, from `first` (1, or one past the step a joiner
    bootstrapped at) to `last`, but for those a pull jumped over (a worker more than one
    step behind its partners)."""
    return (bool(steps) and steps == sorted(set(steps)) and steps[0] >= first and steps[-1] == last
            and len(steps) + jumped_over == last - first + 1)


def start_command(args: list[str], env: dict[str, str], log_path: Path, *, prefix: list[str] | None = None,
                  forked: bool | None = None) -> subprocess.Popen | ForkedProcess:
    """`noloco-rt ARGS` with this environment (the whole of it), its output to log_path:
    forked from the preloaded process (`forked`, by default LocalCluster.forked_workers)
    unless `prefix` (`ip netns exec NS`) must run first, else from its command line."""
    if (LocalCluster.forked_workers if forked is None else forked) and not prefix:
        log_path.write_text("")  # the child appends to it
        return ForkedProcess(args, env, log_path)
    with log_path.open("w") as handle:
        return subprocess.Popen([*(prefix or []), sys.executable, "-m", "noloco_rt.cli", *args], stdout=handle,
                                stderr=subprocess.STDOUT, env=env)


def run_command(args: list[str], env: dict[str, str], log_path: Path, *, timeout_s: float) -> tuple[int, str]:
    """`noloco-rt ARGS` run to its end as start_command starts it: its exit code and its output
    (stdout and stderr together). Past `timeout_s` it is killed and TimeoutExpired raised."""
    process = start_command(args, env, log_path)
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return code, log_path.read_text()


class LocalCluster:
    forked_workers = False
    """Start workers, and start_command's processes, forked from a process that has imported
    torch already (supervise/preloaded.py; the test suite sets it: ~2.5 s of a core less per worker)."""

    def __init__(self, tmp_path: Path, *, stages: int = 2, settings: dict[str, Any] | None = None,
                 redis: EmbeddedRedis | None = None, workers_redis_url: str | None = None) -> None:
        """`redis`: a started server to use (and stop at close) instead of a new one on loopback;
        `workers_redis_url`: where the workers reach it, when not where this process does (a
        server in a network namespace, reached here through its Unix socket)."""
        self.tmp_path = tmp_path
        self.stages = stages
        self.redis = redis or EmbeddedRedis(password=random_password()).start()
        self._workers_redis_url = workers_redis_url
        self.workers: list[WorkerProcess] = []
        # A checkpoint at every outer step: tests kill and resume workers within seconds. A later
        # stage finishes 1 s after its upstream stage did, not 5 (worker.upstream_gone_s: the
        # margin for an upstream worker restarting after its stage finished, which no test does).
        self.settings = {"pipeline.stages": stages, "outer.h": 5, "pipeline.max_inflight": 2,
                         "worker.checkpoint_every": 1, "worker.upstream_gone_s": 1.0,
                         "worker.heartbeat_interval_s": 0.25, "worker.deadline_floor_s": 1.0,
                         "worker.deadline_ceiling_s": 5.0, "worker.exchange_timeout_s": 3.0,
                         "worker.leave_grace_s": 10.0, "run.log_format": "json",
                         "paths.out_dir": str(tmp_path), **(settings or {})}

    @property
    def workers_redis_url(self) -> str:
        """Where workers reach Redis: given, or the server's URL (a test may replace the server)."""
        return self._workers_redis_url or self.redis.url

    def start_worker(self, stage: int, name: str, *, steps: int = 100_000, env: dict[str, str] | None = None,
                     prefix: list[str] | None = None, **settings: Any) -> WorkerProcess:
        """A worker process; `env` adds to its environment (e.g. the injected data faults);
        `prefix` goes before its command line (`ip netns exec NS`)."""
        args = ["worker", "--stage", str(stage), "--name", name, "--steps", str(steps), "--metrics-port", "0"]
        for key, value in {**self.settings, **settings}.items():
            args += ["--set", f"{key}={value}"]
        extra_env = env or {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("NOLOCO_")}
        # The URL (password included) through the environment, as `up` does: never in `ps`.
        env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    "NOLOCO_NETWORK_REDIS_URL": self.workers_redis_url, **extra_env})
        incarnation = sum(1 for w in self.workers if w.name == name)  # a restart gets its own log
        log_path = self.tmp_path / (f"{name}.log" if incarnation == 0 else f"{name}.{incarnation}.log")
        process = start_command(args, env, log_path, prefix=prefix, forked=self.forked_workers)
        worker = WorkerProcess(name, stage, process, log_path)
        self.workers.append(worker)
        return worker

    def membership(self) -> Membership:
        return Membership(connect(self.redis.url), run_id="default")

    def members(self, states: set[WorkerState] | None = None) -> list:
        return self.membership().live_members(stage=None, states=states)

    def wait_for(self, condition: Callable[[], Any], *, timeout_s: float, what: str, interval_s: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = condition()
            if result:
                return result
            for worker in self.workers:
                if worker.process.poll() not in (None, 0, -signal.SIGKILL) and worker.process.returncode != 0:
                    raise AssertionError(f"{worker.name} exited with {worker.process.returncode}:\n"
                                         f"{worker.log_text()[-3000:]}")
            time.sleep(interval_s)
        logs = "\n".join(f"--- {w.name}\n{w.log_text()[-1500:]}" for w in self.workers)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{logs}")

    def wait_event(self, worker: WorkerProcess, event: str, *, timeout_s: float,
                   where: Callable[[Event], bool] = lambda e: True) -> Event:
        return self.wait_for(lambda: next((e for e in worker.events(event) if where(e)), None),
                             timeout_s=timeout_s, what=f"{event} from {worker.name}")

    def wait_online(self, count: int, timeout_s: float = 60.0) -> None:
        self.wait_for(lambda: len(self.members({WorkerState.ONLINE})) >= count, timeout_s=timeout_s,
                      what=f"{count} ONLINE workers")

    def wait_exit(self, worker: WorkerProcess, *, timeout_s: float) -> int:
        """The exit code of a worker that stops by itself, or an AssertionError with its log."""
        try:
            return worker.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            worker.process.send_signal(signal.SIGUSR1)  # its threads' stacks (noloco_rt/process/stack_dumps.py)
            deadline = time.monotonic() + 5
            while "most recent call first" not in worker.log_text() and time.monotonic() < deadline:
                time.sleep(0.05)
            raise AssertionError(f"{worker.name} did not exit within {timeout_s} s:\n"
                                 f"{worker.log_text()[-6000:]}") from None

    def stop(self, worker: WorkerProcess, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
        return self.stop_all([worker], sig, timeout_s)[worker.name]

    def stop_all(self, workers: list[WorkerProcess], sig: int = signal.SIGTERM, timeout_s: float = 20.0
                 ) -> dict[str, int]:
        """Signal every worker at once, then wait for each: their graceful leaves overlap
        (workers of a stage leaving one by one spent a test ~2 s each). Name -> exit code."""
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.send_signal(sig)
        codes = {}
        for worker in workers:
            try:
                codes[worker.name] = worker.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(5)
                raise AssertionError(f"{worker.name} did not exit within {timeout_s} s of signal {sig}") from None
        return codes

    def error_events(self) -> list[Event]:
        """Error-level lines of every worker started (see `error_events`)."""
        return error_events(w.log_path for w in self.workers)

    def close(self) -> None:
        """Kill every worker still running, then Redis. The caller is done with the cluster and
        asserts nothing of this (a graceful leave is tested by stop() with SIGTERM): SIGTERM
        here cost each test ~2.5 s, every worker flushing its link to peers leaving too."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.kill()
        for worker in self.workers:
            try:
                worker.process.wait(10)
            except subprocess.TimeoutExpired:
                pass  # unkillable (uninterruptible I/O): nothing more a test can do about it
        self.redis.stop()


def one_sided_share(used: dict[str, list[str]]) -> float:
    """Uses of a partner's snapshot not matched by that partner using ours, over all uses."""
    uses = Counter((me, peer) for me, peers in used.items() for peer in peers)
    total = sum(uses.values())
    lopsided = sum(abs(n - uses.get((b, a), 0)) for (a, b), n in uses.items() if a < b)
    lopsided += sum(n for (a, b), n in uses.items() if a > b and (b, a) not in uses)
    return lopsided / total if total else 0.0


def tiny_val_loss(stage_weights: list[list[torch.Tensor]] | None) -> float:
    """Validation loss of the tiny two-stage model with these weights per stage (None: untrained)."""
    cfg = load_config(environ={})
    stages = [build_stage("tiny", vocab_size=256, stage=s, num_stages=2, seed=0) for s in range(2)]
    if stage_weights is not None:
        with torch.no_grad():
            for module, weights in zip(stages, stage_weights, strict=True):
                for param, value in zip(module.parameters(), weights, strict=True):
                    param.copy_(value)
    corpus = load_corpus(cfg.data)
    losses = []
    with torch.no_grad():
        for inputs, targets in validation_batches(corpus.val, seq_len=64, batch_size=8, count=4):
            losses.append(float(lm_loss(stages[1](stages[0](inputs)), targets)))
    return sum(losses) / len(losses)
