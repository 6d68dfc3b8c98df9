"""How often a thread of this process has slept and been woken (Linux's per-thread count)."""

from __future__ import annotations

import threading


def voluntary_switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("voluntary_ctxt_switches"))


def wakeups_while_idle(native_id: int, window_s: float = 1.0) -> int:
    """The thread's wakeups over `window_s` of this process doing nothing that concerns it."""
    before = voluntary_switches(native_id)
    threading.Event().wait(window_s)  # the window counted, not a synchronisation
    return voluntary_switches(native_id) - before
