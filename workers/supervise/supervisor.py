"""Supervise named child processes on this machine: start, restart on failure, stop gracefully.

Layout: ONE torch.distributed.elastic PContext (start_processes with a single local
rank) PER CHILD (workers/supervise/elastic.py). torchrun's LocalElasticAgent restarts its whole local worker group when
one member fails, because SPMD ranks cannot go on without each other. NoLoCo workers
are independent (no collective, no barrier), so here only the child that failed is
restarted and its healthy neighbours are never touched.

Each incarnation of a child logs to `<log_dir>/<name>.<incarnation>.log` (stderr, where
our processes write their structured log and tracebacks) and `.out` (stdout). Incarnations are numbered per name and log directory, continuing after
the highest one already there, so a restarted supervisor never overwrites old logs.

Children are told `NOLOCO_PARENT_DEATH_SIGNAL` and `NOLOCO_PARENT_PID`; a child that calls
noloco_rt.process.lifetime.set_parent_death_signal_from_env() (`noloco-rt worker` does) dies
with the supervisor even if the supervisor is SIGKILLed. Linux sends that signal when
the *thread* that forked the child exits, so call start(), poll() and run() from the
main thread. The class is not thread-safe; signal handling belongs to the command.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from noloco_rt.logs import EventLog, get_logger
from noloco_rt.process.lifetime import (
    INCARNATION_ENV,
    PARENT_DEATH_SIGNAL_ENV,
    PARENT_PID_ENV,
    SUPERVISED_ENV,
)
from workers.supervise.elastic import ElasticProcess, forks_preloaded
from workers.supervise.preloaded import stop_server

STATES = ("pending", "running", "backoff", "finished", "failed", "stopped")
EVENT_KINDS = ("started", "restarted", "exited", "gave_up")


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    """Stable across restarts; names the log files."""
    args: tuple[str, ...]
    """Full command line; args[0] is the executable."""
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Added on top of os.environ."""
    restart: bool = True
    """Restart after a non-zero exit or a death by signal (never after exit 0 or our stop())."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"process name {self.name!r}: use letters, digits, '.', '_' and '-' "
                             f"(it names log files)")
        if not self.args:
            raise ValueError(f"process {self.name!r}: args is empty; args[0] must be the executable")


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 10
    """Restarts per process (as torchrun: a process runs at most max_restarts + 1 times)."""
    backoff_initial_s: float = 1.0
    """Delay before the first restart after a failure; doubles per consecutive failure."""
    backoff_max_s: float = 30.0
    healthy_after_s: float = 60.0
    """A run that lasted this long resets the backoff (not the restart count)."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts = {self.max_restarts}: must be >= 0")
        if self.backoff_initial_s < 0:
            raise ValueError(f"backoff_initial_s = {self.backoff_initial_s}: must be >= 0")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s = {self.backoff_max_s}: must be >= backoff_initial_s "
                             f"({self.backoff_initial_s})")
        if self.healthy_after_s < 0:
            raise ValueError(f"healthy_after_s = {self.healthy_after_s}: must be >= 0")

    def delay_s(self, consecutive_failures: int) -> float:
        """Wait before restarting after the n-th failure in a row: initial * 2**(n-1), capped."""
        if consecutive_failures <= 0:
            return 0.0
        doublings = min(consecutive_failures - 1, 64)  # 2**64 * anything positive is past any cap
        return min(self.backoff_max_s, self.backoff_initial_s * 2.0**doublings)


@dataclass(frozen=True)
class SupervisorEvent:
    kind: str
    """One of EVENT_KINDS."""
    name: str
    incarnation: int
    pid: int | None = None
    returncode: int | None = None
    """For "exited": negative for a death by signal (-9: SIGKILL); None if it never started."""
    restart_in_s: float | None = None
    """For "exited": the backoff before the restart, None when no restart follows."""
    at_s: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int | None
    state: str
    """One of STATES."""
    restarts: int
    returncode: int | None
    incarnation: int
    log_path: Path | None
    """Stderr (the structured log) of the current or last incarnation; stdout is the same path with .out."""
    started_at: float | None
    """Wall-clock time (time.time()) the current incarnation started."""


@dataclass
class _Child:
    spec: ProcessSpec
    incarnation: int
    state: str = "pending"
    process: ElasticProcess | None = None
    pid: int | None = None
    runs: int = 0
    restarts: int = 0
    consecutive_failures: int = 0
    returncode: int | None = None
    started_at: float | None = None
    started_monotonic: float = 0.0
    restart_at: float = 0.0
    stopping: bool = False
    log_path: Path | None = None


class Supervisor:
    def __init__(self, specs: Sequence[ProcessSpec], *, log_dir: Path, policy: RestartPolicy, grace_s: float,
                 log: EventLog | None = None, preloaded: bool = False) -> None:
        """`preloaded`: fork the `noloco-rt` commands among the specs from a fork server that has
        imported torch and the worker (workers/supervise/preloaded.py), stopped with the rest."""
        names = [spec.name for spec in specs]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"process names must be unique; repeated: {', '.join(duplicates)}")
        if grace_s < 0:
            raise ValueError(f"grace_s = {grace_s}: must be >= 0")
        self.log_dir = Path(log_dir)
        self.policy = policy
        self.grace_s = grace_s
        self.log = log if log is not None else get_logger(component="supervisor")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._children = [_Child(spec, incarnation=_next_incarnation(self.log_dir, spec.name) - 1)
                          for spec in specs]
        self._started = False
        self._unreported: list[SupervisorEvent] = []  # from start(), returned by the next poll()
        self._final: dict[str, int | None] | None = None
        self.preloaded = preloaded
        self._forked = False

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start every process once (later calls do nothing)."""
        if self._started:
            return
        self._started = True
        for child in self._children:
            self._spawn(child, self._unreported)

    def poll(self) -> list[SupervisorEvent]:
        """Non-blocking: reap exits, restart those whose backoff is over, report what happened
        since the last call (the first call also reports start()'s "started" events)."""
        events, self._unreported = self._unreported, []
        for child in self._children:
            if child.state == "running" and child.process is not None:
                returncode = child.process.poll()
                if returncode is not None:
                    self._reap(child, returncode, events)
            if child.state == "backoff" and time.monotonic() >= child.restart_at:
                self._spawn(child, events)
        return events

    def respawn(self, name: str) -> None:
        """Start a new incarnation of a process that has ended on its own: finished (exit 0,
        e.g. a preempted worker that left gracefully) or failed. What a spot instance's
        replacement is: the chaos driver brings a preempted worker back with it. It counts
        as a restart; its "restarted" event comes with the next poll()."""
        child = next((c for c in self._children if c.spec.name == name), None)
        if child is None:
            raise KeyError(f"no process named {name!r}")
        if self._final is not None:
            raise RuntimeError(f"cannot respawn {name!r}: the supervisor has been stopped")
        if child.state not in ("finished", "failed"):
            raise ValueError(f"cannot respawn {name!r}: it is {child.state}, not finished or failed")
        child.consecutive_failures = 0  # a deliberate start, not a crash loop
        self._spawn(child, self._unreported)

    def statuses(self) -> list[ProcessStatus]:
        return [ProcessStatus(name=c.spec.name, pid=c.pid, state=c.state, restarts=c.restarts,
                              returncode=c.returncode, incarnation=c.incarnation, log_path=c.log_path,
                              started_at=c.started_at) for c in self._children]

    def done(self) -> bool:
        """No process is running, waiting to restart, or waiting to start."""
        return all(c.state in ("finished", "failed", "stopped") for c in self._children)

    def stop(self, *, grace_s: float | None = None) -> dict[str, int | None]:
        """SIGTERM every running child's process group at once (a graceful leave), SIGKILL
        those still alive after the grace period; return each process's last return code.
        Idempotent: a second call signals nothing and returns the same codes."""
        if self._final is not None:
            return dict(self._final)
        self._stop_children(self.grace_s if grace_s is None else grace_s)
        for child in self._children:
            if child.state in ("pending", "backoff"):
                child.state = "stopped"
        self._final = {c.spec.name: c.returncode for c in self._children}
        if self._forked:  # the fork server and its resource tracker end with their children
            for child in self._children:  # torch's queues and events go: stop_server unlinks them
                child.process = None
            stop_server()
        return dict(self._final)

    def _stop_children(self, grace_s: float) -> None:
        for child in self._children:
            returncode = child.process.poll() if child.state == "running" and child.process is not None else None
            if returncode is not None:  # exited since the last poll: no restart now
                self._reap(child, returncode, self._unreported, may_restart=False)
        running = [(c, c.process) for c in self._children if c.state == "running" and c.process is not None]
        for child, _ in running:
            child.stopping = True
        if not running:
            return
        self.log.info("supervisor_stopping", processes=[c.spec.name for c, _ in running], grace_s=grace_s)
        # terminate() waits for its process, so terminate them side by side: one grace
        # period in all, not one per process.
        with ThreadPoolExecutor(max_workers=len(running), thread_name_prefix="supervisor-stop") as pool:
            ending = [(child, pool.submit(process.terminate, grace_s)) for child, process in running]
        for child, future in ending:
            error = future.exception()
            if error is not None:
                self.log.error("process_stop_failed", name=child.spec.name, error=repr(error))
            self._record_stopped(child, None if error is not None else future.result())

    def run(self, stop_event: threading.Event, *, tick_s: float = 0.2,
            on_tick: Callable[[], None] | None = None) -> int:
        """Poll until done() or stop_event is set, then stop(). 0 if every process finished
        with 0 or was stopped by us, 1 if any gave up (or failed without restart)."""
        try:
            self.start()
            while not stop_event.is_set() and not self.done():
                self.poll()
                if on_tick is not None:
                    on_tick()
                # Not stop_event.wait(): a signal handler that sets the event while this thread
                # sits inside Event.wait() can deadlock on the event's lock. Sleep is interrupted
                # by signals and the event is checked every tick.
                time.sleep(tick_s)
        finally:
            self.stop()
        return 1 if any(c.state == "failed" for c in self._children) else 0

    # -- internals ---------------------------------------------------------------------
    def _reap(self, child: _Child, returncode: int, events: list[SupervisorEvent], *,
              may_restart: bool = True) -> None:
        if child.stopping:  # signalled by a stop() that was interrupted (a second Ctrl-C)
            self._record_stopped(child, returncode)
        else:
            self._on_exit(child, returncode, events, may_restart=may_restart)

    def _record_stopped(self, child: _Child, returncode: int | None) -> None:
        child.process, child.state, child.returncode = None, "stopped", returncode
        killed = returncode == -signal.SIGKILL
        (self.log.warning if killed else self.log.info)(
            "process_stopped", name=child.spec.name, pid=child.pid, incarnation=child.incarnation,
            returncode=returncode, killed_after_grace=killed)

    def _spawn(self, child: _Child, events: list[SupervisorEvent]) -> None:
        child.incarnation += 1
        restart = child.runs > 0
        log_path = self.log_dir / f"{child.spec.name}.{child.incarnation}.log"
        env = {**child.spec.env, SUPERVISED_ENV: "1", INCARNATION_ENV: str(child.incarnation),
               PARENT_PID_ENV: str(os.getpid()), PARENT_DEATH_SIGNAL_ENV: str(int(signal.SIGTERM))}
        try:
            process = ElasticProcess.start(child.spec.name, child.spec.args, env, stdout=log_path.with_suffix(".out"),
                                           stderr=log_path, preloaded=self.preloaded)
            self._forked |= self.preloaded and forks_preloaded(child.spec.args)
        except OSError as exc:  # executable missing or not runnable: a failed run like any other
            self.log.error("process_spawn_failed", name=child.spec.name, incarnation=child.incarnation,
                           error=str(exc))
            child.runs += 1
            child.restarts += int(restart)
            child.pid, child.started_monotonic = None, time.monotonic()
            self._on_exit(child, None, events)
            return
        if process is None:
            # A signal for our owner arrived during the spawn and was handed on to its
            # handler; spawn again at the next poll unless the owner stops us first.
            child.incarnation -= 1
            child.state, child.restart_at = "backoff", 0.0
            return
        child.runs += 1
        child.restarts += int(restart)
        child.process, child.pid, child.log_path = process, process.pid, log_path
        child.state, child.returncode = "running", None
        child.started_at, child.started_monotonic = time.time(), time.monotonic()
        kind = "restarted" if restart else "started"
        self.log.info(f"process_{kind}", name=child.spec.name, pid=child.pid, incarnation=child.incarnation,
                      restarts=child.restarts, log=str(log_path))
        events.append(SupervisorEvent(kind, child.spec.name, child.incarnation, pid=child.pid))

    def _on_exit(self, child: _Child, returncode: int | None, events: list[SupervisorEvent], *,
                 may_restart: bool = True) -> None:
        child.process, child.returncode = None, returncode
        name, incarnation, pid = child.spec.name, child.incarnation, child.pid
        if returncode == 0:
            child.state = "finished"
            self.log.info("process_exited", name=name, pid=pid, incarnation=incarnation, returncode=0)
            events.append(SupervisorEvent("exited", name, incarnation, pid=pid, returncode=0))
            return
        if time.monotonic() - child.started_monotonic >= self.policy.healthy_after_s:
            child.consecutive_failures = 0  # it ran well for a while: start the backoff afresh
        child.consecutive_failures += 1
        can_restart = may_restart and child.spec.restart and child.restarts < self.policy.max_restarts
        delay_s = self.policy.delay_s(child.consecutive_failures) if can_restart else None
        self.log.warning("process_exited", name=name, pid=pid, incarnation=incarnation, returncode=returncode,
                         restart_in_s=delay_s, restarts=child.restarts)
        events.append(SupervisorEvent("exited", name, incarnation, pid=pid, returncode=returncode,
                                      restart_in_s=delay_s))
        if delay_s is not None:
            child.state, child.restart_at = "backoff", time.monotonic() + delay_s
            return
        child.state = "failed"
        if child.spec.restart and may_restart:
            self.log.error("process_gave_up", name=name, incarnation=incarnation, restarts=child.restarts,
                           max_restarts=self.policy.max_restarts, returncode=returncode)
            events.append(SupervisorEvent("gave_up", name, incarnation, pid=pid, returncode=returncode))


def _next_incarnation(log_dir: Path, name: str) -> int:
    """The first incarnation number whose log files are free in log_dir."""
    pattern = re.compile(re.escape(name) + r"\.(\d+)\.(?:log|out)")
    used = [int(m.group(1)) for p in log_dir.iterdir() if (m := pattern.fullmatch(p.name))]
    return max(used, default=-1) + 1
