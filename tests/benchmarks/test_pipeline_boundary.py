"""benchmarks/pipeline_boundary.py: its arithmetic on a made-up trace, and its tracer in a
real interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.pipeline_boundary import (
    BOUNDARY,
    OFF_CPU,
    TRACER,
    Slots,
    boundary_parts,
    load_traces,
    per_step,
    render,
    runtime_slots,
)

MS = 1e-3


def _two_steps() -> tuple[list, list]:
    """Stage 0 and the last stage around two step boundaries, times in ms: the gradient leaves
    the last stage at 10 (and 110), arrives at 11, backward 11-16, step 16.5-17.5, forward 18-21,
    sent at 21.5, taken by the waiting last stage at 22.5."""
    first, last = [], []
    for base in (0.0, 100.0):
        t = lambda ms, base=base: (base + ms) * MS  # noqa: E731 - local shorthand
        last += [("send", t(9.9), t(10), False), ("receive", t(10.2), t(22.5), True)]
        first += [("receive", t(5), t(11), True), ("gradient", t(11), t(16), False),
                  ("inner_step", t(16.5), t(17.5), False), ("forward", t(18), t(21), False),
                  ("send", t(21.2), t(21.5), False)]
    return first, last


def test_the_parts_of_the_wait_are_read_off_both_traces_and_add_up():
    first, last = _two_steps()
    parts = boundary_parts(first, last, skip=0, steps=2)
    expected = dict(zip(BOUNDARY, (1.0, 5.0, 1.0, 0.5 + 0.5, 3.0, 0.5, 1.0), strict=True))
    for name, ms in expected.items():
        assert parts[name] == pytest.approx([ms, ms]), name
    assert parts["the last stage's wait"] == pytest.approx([12.5, 12.5])
    assert sum(expected.values()) == pytest.approx(12.5)


def test_per_step_totals_split_waiting_receives_from_the_rest():
    first, _ = _two_steps()
    totals = per_step(first, skip=0, steps=1)
    assert totals["a whole inner step"] == pytest.approx(100.0)
    # Calls that start between the two steps' ends (17.5 and 117.5): the first boundary's
    # forward and send, the second's receive, backward and step.
    assert totals["forward"] == pytest.approx(3.0) and totals["send"] == pytest.approx(0.3)
    assert totals["gradient"] == pytest.approx(5.0) and totals["inner_step"] == pytest.approx(1.0)
    assert totals["receive (waiting)"] == pytest.approx(6.0)
    with pytest.raises(ValueError, match="too few"):
        per_step(first, skip=2, steps=1)


def test_calls_that_carry_their_cpu_seconds_show_their_time_off_the_cpu():
    first, _ = _two_steps()
    # The backward computed 4 of its 5 ms; the waiting receive used 0.1 of its 6.
    cpu = {"gradient": 4 * MS, "receive": 0.1 * MS}
    first = [(*r, cpu.get(r[0], r[2] - r[1])) for r in first]
    totals = per_step(first, skip=0, steps=1)
    assert totals["gradient" + OFF_CPU] == pytest.approx(1.0)
    assert totals["receive (waiting)" + OFF_CPU] == pytest.approx(5.9)
    assert totals["forward" + OFF_CPU] == pytest.approx(0.0)
    assert "a whole inner step" + OFF_CPU not in totals
    boundaries = [{name: 1.0 for name in BOUNDARY}]
    text = render(boundaries, [{"stage 0": totals, "stage 1": totals}], "a note")
    assert "| gradient | 5.00 | 1.00 |" in text.replace("  ", " ")
    assert "| a whole inner step | 100.00 | – |" in text.replace("  ", " ")


def test_a_step_counts_in_slots_of_the_slowest_stages_compute_per_microbatch():
    # 4 microbatches a step: stage 0 computes 8 ms each (forward 12 + gradient 20 a step), stage 1 10 ms
    totals = {"stage 0": {"a whole inner step": 60.0, "forward": 12.0, "gradient": 20.0, "receive (waiting)": 25.0},
              "stage 1": {"a whole inner step": 60.0, "forward": 16.0, "loss_backward": 24.0, "reply": 2.0}}
    measured = runtime_slots(totals, microbatches=4)
    assert measured == Slots(step_ms=60.0, compute_ms=10.0)  # the slowest stage's, waiting and replies left out
    assert measured.slots == pytest.approx(6.0)
    boundaries = [{name: 1.0 for name in BOUNDARY}]
    text = render(boundaries, [totals], "a note", [(measured, Slots(51.0, 10.2), Slots(54.0, 10.0))])
    assert "B + S - 1 = 5" in text
    assert "| noloco-rt 2 x 1 | 60.0 | 10.00 | 6.00 |" in text.replace("  ", " ")
    assert "| plain 2-process pipeline, right after | 51.0 | 10.20 | 5.00 |" in text.replace("  ", " ")
    assert "| the same over ZeroMQ, then | 54.0 | 10.00 | 5.40 |" in text.replace("  ", " ")


def _run_traced(trace_dir, code: str) -> None:
    """`code` in a fresh interpreter (argv: -c --stage 1) with the tracer installed, tracing into `trace_dir`."""
    env = {**os.environ, "BOUNDARY_TRACE_DIR": str(trace_dir),
           "PYTHONPATH": os.pathsep.join((str(TRACER), os.getcwd()))}
    done = subprocess.run([sys.executable, "-c", code, "--stage", "1"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_tracer_wraps_the_worker_calls_and_writes_its_trace_at_exit(tmp_path):
    _run_traced(tmp_path, "import workers.worker\n"
                          "from workers.data_path.context import DataContext\n"
                          "from noloco_rt.net.data_link import DataLink\n"
                          "assert DataContext.run_stage.__name__ == 'call' and DataLink.send.__name__ == 'call'\n")
    (trace,) = tmp_path.glob("*.jsonl")
    assert [json.loads(line) for line in trace.read_text().splitlines()] == [{"argv": ["-c", "--stage", "1"]}]
    assert load_traces(tmp_path) == {}  # a worker that traced nothing is left out


def test_a_forked_child_traces_only_its_own_calls_into_a_file_of_its_own(tmp_path):
    """As a worker forked from the preloaded server does: the parent's records stay out."""
    _run_traced(tmp_path, "import os, queue, sys, types\n"
                          "import workers.worker\n"
                          "from noloco_rt.net.data_link import DataLink\n"
                          "link = types.SimpleNamespace(_events=queue.Queue())\n"
                          "DataLink.receive(link, 0)\n"
                          "child = os.fork()\n"
                          "if child == 0:\n"
                          "    DataLink.receive(link, 0); DataLink.receive(link, 0)\n"
                          "    sys.exit(0)\n"
                          "assert os.waitpid(child, 0)[1] == 0\n")
    traces = {int(path.stem): path.read_text().splitlines() for path in tmp_path.glob("*.jsonl")}
    assert sorted(len(lines) - 1 for lines in traces.values()) == [1, 2]  # argv, then one line per call
    for lines in traces.values():
        assert [json.loads(line)[0] for line in lines[1:]] == ["receive"] * (len(lines) - 1)
