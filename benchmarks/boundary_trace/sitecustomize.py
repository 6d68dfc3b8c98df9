"""Timestamps of a worker's data-path calls, for benchmarks/pipeline_boundary.py only.

Python imports this file at start-up in every process whose PYTHONPATH lists this folder;
it does nothing unless BOUNDARY_TRACE_DIR is set. Then, just before the worker module is
first imported, it wraps the calls below so that each appends (name, start, end, took a
message, seconds on the CPU) to a list, appended to BOUNDARY_TRACE_DIR/<pid>.jsonl (a line
of argv, then a line per call) every 500 calls and at exit. time.perf_counter is
CLOCK_MONOTONIC on Linux: one clock for every process, so a message can be followed from
one worker into the next. The calling thread's CPU seconds (time.thread_time) tell a
call's own work from its time off the CPU: waiting, or runnable while other threads had
the cores.
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import sys
import time

TRACED = (  # (module, class, method, name in the trace)
    ("workers.data_path.context", "DataContext", "run_stage", "forward"),
    ("workers.data_path.roles", "SendsDownstream", "_on_gradient", "gradient"),
    ("workers.data_path.role", "Role", "_train_on", "loss_backward"),
    ("workers.data_path.role", "Role", "_reply_gradient", "reply"),
    ("workers.inner_step", "InnerStep", "_step", "inner_step"),
    ("noloco_rt.net.data_link", "DataLink", "receive", "receive"),
    ("noloco_rt.net.data_link", "DataLink", "send", "send"),
    # Not the training thread's: the link thread's turn at taking messages off the socket,
    # decoding them included; its CPU seconds are its share of the cores (and of the GIL).
    ("noloco_rt.net.data_link", "DataLink", "_receive_some", "link thread: receive and decode"),
)


def _install(trace_dir: str) -> None:
    records: list[tuple[str, float, float, bool, float]] = []
    written = {"count": 0}
    """How many records this process has written: each dump appends only the new ones (a
    dump of the whole list grew with the run and landed inside the calls around it)."""

    def forked() -> None:  # a worker forked from the preloaded server starts a trace of its own
        records.clear()
        written["count"] = 0

    os.register_at_fork(after_in_child=forked)

    def dump() -> None:
        with open(os.path.join(trace_dir, f"{os.getpid()}.jsonl"), "a") as file:
            if written["count"] == 0:
                file.write(json.dumps({"argv": sys.argv}) + "\n")
            file.writelines(json.dumps(r) + "\n" for r in records[written["count"]:])
        written["count"] = len(records)

    def wrapped(original, name):
        def call(*args, **kwargs):
            started, cpu_started = time.perf_counter(), time.thread_time()
            result = original(*args, **kwargs)
            records.append((name, started, time.perf_counter(), result is not None, time.thread_time() - cpu_started))
            if len(records) % 500 == 0:
                dump()
            return result
        return call

    class BeforeWorker(importlib.abc.MetaPathFinder):
        """Wraps the calls when workers.worker is about to be imported (every module it uses
        for them is imported first, here), then steps aside."""

        def find_spec(self, name, path=None, target=None):
            if name != "workers.worker":
                return None
            sys.meta_path.remove(self)
            import importlib
            for module_name, class_name, method, label in TRACED:
                owner = getattr(importlib.import_module(module_name), class_name)
                setattr(owner, method, wrapped(getattr(owner, method), label))
            atexit.register(dump)
            return None  # the usual finders import workers.worker, on the wrapped classes

    sys.meta_path.insert(0, BeforeWorker())


if os.environ.get("BOUNDARY_TRACE_DIR"):
    _install(os.environ["BOUNDARY_TRACE_DIR"])
