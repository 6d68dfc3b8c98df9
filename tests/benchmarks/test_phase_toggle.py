"""benchmarks/phase_toggle.py: the phases' rates and pairs (pure), and its treatments applied
to a real process's threads and taken back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.matched_runs import worker_pids
from benchmarks.phase_toggle import (
    BACKGROUND_NICE,
    Phase,
    apply,
    by_stage,
    pair_ratios,
    phase_rates,
    threads_of,
)

_THREADED = ("import threading, time\n"
             "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")


def test_each_phase_rate_comes_from_the_progress_lines_inside_it_after_it_settles():
    # 10 steps a second, except 20 a second while the treatment is on (from t = 4 to 8).
    progress, step = [], 0
    for tenth in range(120):
        t = tenth / 10
        progress.append((t, step))
        step += 2 if 4 <= t < 8 else 1
    phases = [Phase(0.0, False), Phase(4.0, True), Phase(8.0, False)]
    rates = phase_rates(progress, phases, phase_s=4.0, tokens_per_step=100)
    assert [on for on, _ in rates] == [False, True, False]
    assert [round(rate) for _, rate in rates] == [1000, 2000, 1000]
    assert pair_ratios(rates) == pytest.approx([2.0])


def test_a_phase_with_fewer_than_two_lines_after_settling_is_left_out():
    progress = [(0.1, 0), (0.2, 1), (5.0, 10), (6.0, 20)]  # nothing of the first phase after 0.5 s
    rates = phase_rates(progress, [Phase(0.0, True), Phase(4.0, False)], phase_s=4.0, tokens_per_step=1)
    assert rates == [(False, pytest.approx(10.0))]
    assert pair_ratios(rates) == []  # no on-phase with an off-phase after it


def test_each_stage_gets_its_workers_newest_incarnation(tmp_path):
    lines = ['{"name": "s0-r0", "pid": 11, "incarnation": 0, "event": "process_started"}',
             'not json',
             '{"name": "s1-r0", "pid": 12, "incarnation": 0, "event": "process_started"}',
             '{"name": "s1-r0", "pid": 13, "incarnation": 1, "event": "process_started"}',
             '{"name": "s0-r0", "pid": 11, "event": "process_exited"}']
    (tmp_path / "up.out").write_text("\n".join(lines) + "\n")
    assert by_stage(worker_pids(tmp_path / "up.out")) == {0: 11, 1: 13}


@pytest.mark.parametrize("treatment", ["pin", "nice-background"])
def test_a_treatment_reaches_every_thread_and_is_taken_back(treatment):
    child = subprocess.Popen([sys.executable, "-c", _THREADED], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        tids = threads_of(child.pid)
        background = [tid for tid in tids if tid != child.pid]
        assert background, "the child's second thread"
        cores = sorted(os.sched_getaffinity(0))
        main = os.getpriority(os.PRIO_PROCESS, child.pid)
        apply(treatment, True, {1: child.pid})
        if treatment == "pin":
            assert all(os.sched_getaffinity(tid) == {cores[1 % len(cores)]} for tid in tids)
        else:
            niceness = [os.getpriority(os.PRIO_PROCESS, tid) for tid in background]
            assert niceness == [min(19, main + BACKGROUND_NICE)] * len(background)
            assert os.getpriority(os.PRIO_PROCESS, child.pid) == main  # the main thread keeps its priority
        if treatment == "nice-background" and os.geteuid() != 0:
            with pytest.raises(PermissionError):  # lowering a nice value needs CAP_SYS_NICE: said, not ignored
                apply(treatment, False, {1: child.pid})
        else:
            apply(treatment, False, {1: child.pid})
            assert all(os.sched_getaffinity(tid) == set(cores) for tid in tids)
            assert all(os.getpriority(os.PRIO_PROCESS, tid) == main for tid in tids)
    finally:
        child.kill()
        child.wait()
    assert threads_of(child.pid) == []  # gone: applying to it again is harmless
    apply(treatment, True, {0: child.pid})
