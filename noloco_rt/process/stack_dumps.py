"""Where a stuck process shows its threads: every thread's stack, on stderr (the log).

`kill -USR1 <pid>` prints them on demand, for a worker that seems hung. And a process whose
work is done arms an exit watchdog: still alive EXIT_WATCHDOG_S later (a thread that will
not stop, a socket that will not close), it prints them and exits 1 rather than hang; an
orchestrator then sees a failure it can act on, and the log shows where it stuck.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

EXIT_WATCHDOG_S = 60.0


def dump_stacks_on_sigusr1() -> None:
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def arm_exit_watchdog(seconds: float = EXIT_WATCHDOG_S) -> None:
    """From now on the process has `seconds` to exit; past that, stacks and exit code 1."""
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
