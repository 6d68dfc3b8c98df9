"""One child process in its own torch.distributed.elastic PContext (a single local rank).

The glue between workers.supervise.supervisor and torch: flat per-incarnation log files instead of
DefaultLogsSpecs' run/attempt/rank folders, the owner's signal handlers kept across
PContext.start(), return codes, and the log files torch leaves open.

A `noloco-rt` command of this interpreter (`python -m noloco_rt.cli ...`) is forked from the
preloaded fork server (workers/supervise/preloaded.py) when asked: torch's function entry
point, started the "forkserver" way, instead of a binary; it skips ~2.5 s of a core of
imports at every start and restart. Anything else (`ip netns exec ...`, another program) is
started as a binary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from torch.distributed.elastic.multiprocessing import (
    LogsDest,
    LogsSpecs,
    PContext,
    SignalException,
    start_processes,
)
from torch.distributed.elastic.multiprocessing.api import MultiprocessContext

from workers.supervise.preloaded import ensure_server, run_supervised

FORKED_POLL_S = 0.02
"""How often a stopping forked child is polled (each poll reads its return value if it is in)."""

# Signals PContext.start() takes over on the main thread (its handlers raise SignalException).
_TORCH_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


class FlatLogs(LogsSpecs):
    """One rank, stdout and stderr to files the caller names."""

    def __init__(self, stdout: Path, stderr: Path) -> None:
        super().__init__(log_dir=str(stdout.parent))
        self.stdout, self.stderr = stdout, stderr

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        # No error file: ProcessFailure only reads one that torch's @record wrote.
        return LogsDest(stdouts={0: str(self.stdout)}, stderrs={0: str(self.stderr)}, error_files={0: os.devnull})

    @property
    def root_log_dir(self) -> str:
        return str(self.stdout.parent)


class ElasticProcess:
    def __init__(self, context: PContext) -> None:
        self._context = context
        self.pid: int = context.pids()[0]
        self.forked = isinstance(context, MultiprocessContext)
        """Forked from the preloaded fork server, not started as a command."""

    @classmethod
    def start(cls, name: str, args: Sequence[str], env: Mapping[str, str], *, stdout: Path,
              stderr: Path, preloaded: bool = False) -> ElasticProcess | None:
        """Start args[0] with args[1:] and env on top of os.environ, in its own session (so
        its process group can be signalled as one); `preloaded`: fork a `noloco-rt` command
        from the fork server instead (`forks_preloaded`). Raises OSError if it cannot be run.

        None when a signal meant for our owner arrived during the start: PContext.start()
        had replaced the owner's handlers and torch has closed what it began. The owner's
        handlers are restored and the signal re-raised to them, so a spawn never swallows
        a SIGTERM the launch command waits for."""
        names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", ",".join(_TORCH_SIGNALS)).split(",")
        signums = {getattr(signal, n.strip()) for n in (*names, *_TORCH_SIGNALS) if hasattr(signal, n.strip())}
        on_main = threading.current_thread() is threading.main_thread()  # torch only touches the main thread's
        saved = {s: signal.getsignal(s) for s in signums} if on_main else {}
        context: PContext | None = None
        pending: signal.Signals | None = None
        logs = FlatLogs(stdout, stderr)
        try:
            if preloaded and forks_preloaded(args):
                ensure_server()
                context = start_processes(name=name, entrypoint=run_supervised, args={0: (tuple(args[3:]),)},
                                          envs={0: dict(env)}, logs_specs=logs, start_method="forkserver")
            else:
                context = start_processes(name=name, entrypoint=args[0], args={0: tuple(args[1:])},
                                          envs={0: dict(env)}, logs_specs=logs)
        except SignalException as exc:
            pending = exc.sigval
        for _ in range(len(signums) + 1):  # bounded: each retry means yet another signal arrived
            try:
                for signum, handler in saved.items():
                    if handler is not None:
                        signal.signal(signum, handler)
                break
            except SignalException as exc:
                pending = exc.sigval
        if pending is not None:
            signal.raise_signal(pending)  # now reaches the owner's handler (or the default action)
        return None if context is None else cls(context)

    def poll(self) -> int | None:
        """None while it runs; then its return code (negative: killed by that signal)."""
        result = self._context.wait(0)
        if result is None:
            return None
        self.release()
        failure = result.failures.get(0)
        # ProcessFailure.exitcode is Popen's returncode: already negative for a signal (-9: SIGKILL).
        return 0 if failure is None else int(failure.exitcode)

    def terminate(self, grace_s: float, *, reap_timeout_s: float = 5.0) -> int | None:
        """SIGTERM its process group, SIGKILL after grace_s; blocks until then. Returns the
        code (None: not even SIGKILL ended it within reap_timeout_s, e.g. stuck in the kernel)."""
        if self.forked:
            return self._terminate_forked(grace_s, reap_timeout_s)
        # torch annotates timeout as int; a float works (it is only added to time.monotonic()).
        self._context.close(death_sig=signal.SIGTERM, timeout=grace_s)  # type: ignore[arg-type]
        self.release()
        handler = getattr(self._context, "subprocess_handlers", {}).get(0)
        if handler is None:
            return None
        try:
            return handler.proc.wait(reap_timeout_s)  # close() may stop waiting before the reap
        except subprocess.TimeoutExpired:
            return None

    def _terminate_forked(self, grace_s: float, reap_timeout_s: float) -> int | None:
        """A forked child that returns waits until torch has read its return value, which only
        a poll does (close() would leave it waiting out the grace): SIGTERM, poll until grace_s,
        then SIGKILL."""
        try:
            os.killpg(self.pid, signal.SIGTERM)
        except ProcessLookupError:  # just forked: not yet the leader of its own session
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if (code := self.poll()) is not None:
                return code
            time.sleep(FORKED_POLL_S)
        self._context.close(death_sig=signal.SIGKILL, timeout=reap_timeout_s)  # type: ignore[arg-type]
        forked = getattr(getattr(self._context, "_pc", None), "processes", [])  # torch's ProcessContext
        return forked[0].exitcode if forked else None

    def release(self) -> None:
        # SubprocessHandler closes its stdout/stderr files only when it signals the process,
        # so a child that exited on its own would keep them open until garbage collection.
        for handler in getattr(self._context, "subprocess_handlers", {}).values():
            for stream in (getattr(handler, "_stdout", None), getattr(handler, "_stderr", None)):
                if stream is not None and not stream.closed:
                    stream.close()


def forks_preloaded(args: Sequence[str]) -> bool:
    """Whether a command line is `noloco-rt` run by this interpreter (what the fork server holds)."""
    return tuple(args[:3]) == (sys.executable, "-m", "noloco_rt.cli")


_TORCH_ELASTIC_LOGGERS = "torch.distributed.elastic"


def quiet_torch_elastic_logs() -> None:
    """Silence torch.distributed.elastic's own lines; the supervisor logs the same events."""
    # torch sets a level on each of its module loggers, so the parent's level is not enough.
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(_TORCH_ELASTIC_LOGGERS):
            logging.getLogger(name).setLevel(logging.CRITICAL)
