"""benchmarks/thread_load.py: /proc's per-thread counts read from a real process, and the
window's loads (pure)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.thread_load import (
    MAIN,
    ThreadCounts,
    background,
    parse_thread,
    read_threads,
    steps_per_s,
    thread_loads,
)

_ECHOES_ON_A_THREAD = ("import sys, threading\n"
                       "def echo():\n"
                       "    for line in sys.stdin: print(line, end='', flush=True)\n"
                       "t = threading.Thread(target=echo, name='echo'); t.start()\n"
                       "print('ready', flush=True)\n"
                       "t.join()\n")


def test_a_name_with_spaces_and_parentheses_is_read_whole():
    stat = "42 (a (b) c) S " + " ".join(["0"] * 10) + " 250 150 " + " ".join(["0"] * 30)
    status = "Name:\tx\nvoluntary_ctxt_switches:\t7\nnonvoluntary_ctxt_switches:\t3\n"
    counts = parse_thread(stat, status)
    assert counts.name == "a (b) c"
    assert (counts.wakeups, counts.preemptions) == (7, 3)
    assert counts.cpu_s > 0


def _wait_asleep(pid: int, tid: int, deadline_s: float = 10.0) -> None:
    """Until the thread is blocked (state S in its stat), so that the next line must wake it."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "S":
                return
        time.sleep(0.001)  # a poll with a deadline: the kernel offers no wait for another's sleep
    raise AssertionError(f"thread {tid} never went to sleep")


def test_a_real_threads_wakeups_are_counted():
    child = subprocess.Popen([sys.executable, "-c", _ECHOES_ON_A_THREAD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        before = read_threads(child.pid)
        assert child.pid in before and len(before) == 2  # the main thread and the echo
        echo = next(tid for tid in before if tid != child.pid)
        for index in range(30):  # each line wakes the echo thread, asleep in its read
            _wait_asleep(child.pid, echo)
            child.stdin.write(f"{index}\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == str(index)
        after = read_threads(child.pid)
        assert after[echo].wakeups - before[echo].wakeups >= 30
        assert after[child.pid].wakeups - before[child.pid].wakeups <= 2  # the main thread slept in join
    finally:
        child.stdin.close()
        child.wait(10)
    assert read_threads(child.pid) == {}  # gone: nothing to read


def _counts(name: str, cpu_s: float, wakeups: int, preemptions: int) -> ThreadCounts:
    return ThreadCounts(name, cpu_s, wakeups, preemptions)


def test_a_window_sums_threads_of_one_name_and_leaves_out_those_started_inside_it():
    before = {"s0-r0": {10: _counts("noloco-rt s0-r0", 1.0, 5, 5), 11: _counts("ZMQbg/IO/0", 0.1, 0, 0),
                        12: _counts("ZMQbg/IO/0", 0.1, 0, 0), 13: _counts("heartbeat", 0.0, 0, 0)}}
    after = {"s0-r0": {10: _counts("noloco-rt s0-r0", 8.0, 25, 45), 11: _counts("ZMQbg/IO/0", 0.3, 30, 4),
                       12: _counts("ZMQbg/IO/0", 0.2, 10, 2), 13: _counts("heartbeat", 0.01, 2, 0),
                       14: _counts("outer-encode", 5.0, 999, 999)}}
    loads = thread_loads(before, after, {"s0-r0": 10}, seconds=10.0, steps=20.0)
    assert [load.thread for load in loads] == [MAIN, "ZMQbg/IO/0", "heartbeat"]  # main first, then by CPU
    main, zmq_io, heartbeat = loads
    assert main.cpu_share == pytest.approx(0.7) and main.wakeups_per_step == pytest.approx(1.0)
    assert main.preemptions_per_step == pytest.approx(2.0)
    assert zmq_io.cpu_share == pytest.approx(0.03) and zmq_io.wakeups_per_step == pytest.approx(2.0)
    assert heartbeat.wakeups_per_step == pytest.approx(0.1)
    together = background(loads)["s0-r0"]
    assert together.wakeups_per_step == pytest.approx(2.1)
    assert together.cpu_share == pytest.approx(0.031)
    with pytest.raises(ValueError, match="empty window"):
        thread_loads(before, after, {"s0-r0": 10}, seconds=10.0, steps=0.0)


def test_steps_a_second_come_from_the_progress_lines_inside_the_window():
    progress = [(0.0, 0), (1.0, 10), (2.0, 30), (3.0, 50), (9.0, 500)]
    assert steps_per_s(progress, 0.5, 3.5) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="fewer than two"):
        steps_per_s(progress, 3.5, 8.0)
