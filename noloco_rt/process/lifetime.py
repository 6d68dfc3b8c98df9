"""Process lifetime on Linux: a child never outlives the process that started it.

Linux's parent-death signal (prctl PR_SET_PDEATHSIG) is delivered to a process when
the *thread* that forked it exits, so a parent must start children from a thread that
lives as long as it does (the main thread). Elsewhere (macOS, musl without prctl)
these helpers do nothing and say so by returning False.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Mapping

# Set by a supervisor for the process it starts; they are not configuration, so the
# NOLOCO_<SECTION>_<FIELD> loader skips them.
SUPERVISED_ENV = "NOLOCO_SUPERVISED"
INCARNATION_ENV = "NOLOCO_INCARNATION"
PARENT_PID_ENV = "NOLOCO_PARENT_PID"
PARENT_DEATH_SIGNAL_ENV = "NOLOCO_PARENT_DEATH_SIGNAL"
PROCESS_ENV_VARS = frozenset({SUPERVISED_ENV, INCARNATION_ENV, PARENT_PID_ENV, PARENT_DEATH_SIGNAL_ENV})

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None  # not Linux/glibc: no parent-death signal


# Looked up at import, in the parent: a preexec_fn (between fork and exec in a child of a
# multi-threaded parent) must not import or dlopen, since another thread may have held the
# import lock at fork.
_PRCTL = _load_prctl()


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` to this process when its parent (thread) exits.
    Safe in a preexec_fn. False where unsupported."""
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_PDEATHSIG, int(signum)) == 0


def set_process_name(name: str) -> bool:
    """This process's name as `ps -e`, `top` and /proc/<pid>/comm show it (15 bytes, the rest
    cut): what a forked child has in place of its own command line. False where unsupported."""
    if _PRCTL is None:
        return False
    return _PRCTL(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15])) == 0


def set_parent_death_signal_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Honour NOLOCO_PARENT_DEATH_SIGNAL (a signal number) set by our supervisor.

    The parent may already have died between our fork and this call, in which case the
    kernel will never send the signal: if NOLOCO_PARENT_PID no longer is our parent, we
    send it to ourselves. Returns True if the signal was armed; False if not asked or
    unsupported. Raises ValueError on a malformed variable (it names the variable)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(PARENT_DEATH_SIGNAL_ENV, "").strip()
    if not raw:
        return False
    signum = _positive_int(PARENT_DEATH_SIGNAL_ENV, raw)
    armed = set_parent_death_signal(signum)
    parent = environ.get(PARENT_PID_ENV, "").strip()
    if armed and parent and os.getppid() != _positive_int(PARENT_PID_ENV, parent):
        os.kill(os.getpid(), signum)  # orphaned before prctl took effect: act as if it fired
    return armed


def _positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: expected a positive integer")
    return value


def set_event_from_signal_handler(event: threading.Event) -> None:
    """event.set() for a signal handler. Calling it directly can deadlock: the handler runs
    on the main thread between bytecodes, possibly while that thread holds the event's
    lock inside event.wait(); a short-lived thread takes the lock once it is free."""
    threading.Thread(target=event.set, name="signal-set", daemon=True).start()
