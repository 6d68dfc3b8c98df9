"""Thread names the kernel shows (`top -H`, `perf`, /proc/PID/task/TID/comm).

Python 3.11 keeps a thread's name to itself, so each of a worker's threads reads as the
process title there; a profile or a per-thread CPU count cannot then say which thread is
the data link and which the heartbeat. Linux only: elsewhere nothing is named.
"""

from __future__ import annotations

import threading

KERNEL_NAME_LIMIT = 15
"""Bytes of a kernel thread name (TASK_COMM_LEN 16, with its terminating zero)."""


def name_kernel_threads() -> int:
    """Give each live Python thread but the main one (it carries the process title) its
    Python name, cut to the kernel's limit; how many were named."""
    named = 0
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.native_id is None:
            continue
        try:
            with open(f"/proc/self/task/{thread.native_id}/comm", "w") as comm:
                comm.write(thread.name.encode()[:KERNEL_NAME_LIMIT].decode(errors="ignore"))
        except OSError:  # not Linux, or the thread ended meanwhile
            continue
        named += 1
    return named
