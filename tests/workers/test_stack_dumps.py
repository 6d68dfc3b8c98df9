"""A stuck process shows where (noloco_rt/process/stack_dumps.py): SIGUSR1 prints every thread's
stack, and a process past its work that will not exit prints them and exits 1. Real child
processes; every wait has a deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

CHILD_WAITING = """
import threading
from noloco_rt.process.stack_dumps import dump_stacks_on_sigusr1

def parked_in_a_helper_thread(stop):
    stop.wait(60)

dump_stacks_on_sigusr1()
stop = threading.Event()
threading.Thread(target=parked_in_a_helper_thread, args=(stop,), daemon=True).start()
print("ready", flush=True)
stop.wait(60)
"""

CHILD_THAT_WILL_NOT_EXIT = """
import threading
from noloco_rt.process.stack_dumps import arm_exit_watchdog

def a_thread_that_will_not_stop():
    threading.Event().wait(60)

threading.Thread(target=a_thread_that_will_not_stop).start()  # not a daemon: exit joins it
arm_exit_watchdog(0.5)
"""


def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on():
    child = subprocess.Popen([sys.executable, "-c", CHILD_WAITING], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGUSR1)
        seen = ""
        deadline = time.monotonic() + 20
        while "parked_in_a_helper_thread" not in seen and time.monotonic() < deadline:
            seen += child.stderr.readline()
        assert "most recent call first" in seen and "parked_in_a_helper_thread" in seen, seen
        assert child.poll() is None  # a dump, not a death
    finally:
        child.kill()
        child.wait(10)


def test_a_process_that_will_not_exit_prints_its_stacks_and_exits_1():
    done = subprocess.run([sys.executable, "-c", CHILD_THAT_WILL_NOT_EXIT], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 1, done
    assert "a_thread_that_will_not_stop" in done.stderr and "Timeout" in done.stderr, done.stderr
