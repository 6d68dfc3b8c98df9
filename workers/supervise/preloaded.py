"""`noloco-rt` processes forked from one that has already imported torch and the worker's
modules: the workers `up`, `launch` and `chaos` supervise (`run_supervised`, through
torch.distributed.elastic: workers/supervise/elastic.py) and the test suite's local clusters
(`ForkedProcess`). Started afresh, each would spend ~2.5 s of a core importing the same
modules (benchmarks/worker_start.py), most of what a short worker costs and the first part of
every restart.

A forked child runs the same entry point a worker process does (`noloco_rt.cli.entry_point`,
with its command line and environment), its own sockets and threads, and logs to its own
file. What differs from `python -m noloco_rt.cli`: the interpreter is not started afresh
(variables read at interpreter or library start come from the server, which is started with
the same OMP_NUM_THREADS), and the process ends with os._exit after the entry point returns.
Benchmarks, and anything testing how a process starts, start theirs with a command line.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from noloco_rt.process.lifetime import PARENT_PID_ENV, set_process_name

PRELOAD = ["torch", "noloco_rt.cli", "workers.cli", "workers.worker"]
ORPHAN_CHECK_S = 0.5
"""How often a supervised child that has returned checks that its fork server still lives."""
SERVER_THREADS = "1"
"""OMP_NUM_THREADS of the fork server: read once, when torch loads there (local clusters give each worker one)."""


def _context() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = SERVER_THREADS  # the server inherits this process's environment
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return context


def _run_entry_point(args: Sequence[str], env: Mapping[str, str], log_path: str) -> None:
    """In the forked child: become `noloco-rt ARGS` with this environment, logging to log_path."""
    os.environ.clear()
    os.environ.update(env)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    _become_noloco_rt(args)


def _become_noloco_rt(args: Sequence[str]) -> None:
    """What every forked child does once its environment and files are set: line-buffered
    output, torch's threads from its own OMP_NUM_THREADS (torch read the server's), and then
    `noloco-rt ARGS`' entry point."""
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", SERVER_THREADS)))
    sys.argv = ["noloco-rt", *args]
    from noloco_rt.cli import entry_point

    entry_point()


def run_supervised(args: Sequence[str]) -> int:
    """torch.distributed.elastic's entry point for a supervised `noloco-rt ARGS`, forked from
    the fork server; torch's wrapper has set its environment and log files. Returns 0, or
    raises SystemExit with the command's code (torch reads a return value, not exit 0)."""
    os.setsid()  # a session of its own, as a spawned child has: its group is signalled as one
    # multiprocessing hands each child the fork server's keep-alive pipe, so that it could fork
    # in turn; held here it would keep the server, and so this child, alive after a SIGKILLed
    # supervisor. Closed, the server ends with the supervisor and the parent-death signal fires.
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    # Its command line is the fork server's: `ps -e` shows this name instead (`noloco-rt s0-r1`).
    set_process_name(f"noloco-rt {args[args.index('--name') + 1] if '--name' in args[:-1] else args[0]}")
    # The fork server is our parent: it exits when the supervisor does, and its death is what
    # the parent-death signal sees.
    os.environ[PARENT_PID_ENV] = str(os.getppid())
    try:
        _become_noloco_rt(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    # torch's wrapper puts the 0 in its queue and waits until the supervisor has read it, which
    # an orphan (its supervisor, and so the fork server, gone) would wait for forever. Never
    # cut that wait short while the supervisor lives: it may be signalling the wait's condition.
    threading.Thread(target=_exit_once_orphaned, args=(os.getppid(),), daemon=True).start()
    return 0


def _exit_once_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_CHECK_S)
    os._exit(0)


def ensure_server() -> None:
    """The fork server, started (preloaded) if it is not running yet."""
    _context()


class ForkedProcess:
    """A forked `noloco-rt` child behind the part of subprocess.Popen's interface local
    clusters and their tests use (pid, poll, wait, send_signal, kill, returncode)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = list(args)
        self._process = _context().Process(target=_run_entry_point, args=(self.args, dict(env), str(log_path)),
                                           daemon=False)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def stop_server() -> list[int]:
    """Stop the fork server and the resource tracker it starts, if this process started them
    (multiprocessing has no public call for it; its own tests use these), so that neither
    outlives its user. Forked children still running are killed first: their pids are
    returned (they are the fork server's children, invisible to a check of this process's)."""
    leftover = multiprocessing.active_children()  # also forgets the children that ended
    for child in leftover:
        child.kill()
        child.join(10)
    gc.collect()  # what they were started with (torch's queues and events) unlinks its semaphores now
    multiprocessing.forkserver._forkserver._stop()
    multiprocessing.resource_tracker._resource_tracker._stop()
    return [child.pid for child in leftover]
