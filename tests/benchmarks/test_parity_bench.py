"""The parity benchmark's own parts: its table (ratios seed by seed), its cache of finished
runs, and the fault injector against real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from benchmarks.matched_runs import worker_pids
from benchmarks.parity import cached, rows
from benchmarks.parity_faults import InjectedFaults, inject


def _run(loss: float, trained: int, **extra) -> dict:
    return {"val_loss": loss, "spread": 1e-3, "trained": trained, "wall_s": 10.0, **extra}


def test_rows_compare_each_seed_with_the_simulation_of_the_same_seed():
    delays = {"rounds": 10, "at_most_one": 9, "max": 3}
    results = {
        "simulator": {0: _run(2.0, 400), 1: _run(4.0, 400)},
        "fault-free": {0: _run(2.2, 380, skipped=5, pulled=2, delays=delays),
                       1: _run(4.0, 400, skipped=0, pulled=0, delays=delays)},
        "faults": {0: _run(2.0, 300, skipped=1, pulled=1, delays=delays, faults={"sigkill": 2, "sigstop": 1})},
    }
    table = {row[0]: row for row in rows(results)}
    assert table["simulator"][3] == "1.0000 [1.0000–1.0000]"
    assert table["fault-free"][3] == "1.0500 [1.0000–1.1000]"  # 2.2 / 2.0 and 4.0 / 4.0, not 6.2 / 6.0
    assert table["fault-free"][5] == "0.975 [0.950–1.000]"
    assert table["fault-free"][8] == "90 % ≤ 1, max 3"
    assert table["faults"][9] == 3 and table["fault-free"][9] == "-"


def test_a_finished_run_is_read_back_not_run_again(tmp_path):
    calls = []

    def run(folder):
        calls.append(folder)
        return {"val_loss": 1.5}

    assert cached(tmp_path / "a", run) == {"val_loss": 1.5}
    assert cached(tmp_path / "a", run) == {"val_loss": 1.5}
    assert len(calls) == 1


def test_worker_pids_take_the_newest_incarnation_and_only_workers(tmp_path):
    log = tmp_path / "up.log"
    lines = [{"event": "process_started", "name": "s0-r0", "pid": 11}, {"event": "process_started", "name": "coordinator",
             "pid": 12}, "not json", {"event": "process_started", "name": "s0-r0", "pid": 13}]
    log.write_text("\n".join(json.dumps(line) if isinstance(line, dict) else line for line in lines))
    assert worker_pids(log) == {"s0-r0": 13}
    assert worker_pids(tmp_path / "missing.log") == {}


def test_injector_stops_then_kills_real_processes_until_told_to_stop(tmp_path):
    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        (tmp_path / "up.log").write_text("\n".join(json.dumps({"event": "process_started", "name": f"s0-r{i}",
                                                                "pid": p.pid}) for i, p in enumerate(workers)))
        done, faults = threading.Event(), InjectedFaults()
        thread = threading.Thread(target=inject, args=(tmp_path / "up.log",),
                                  kwargs={"seed": 0, "every_s": 0.05, "hold_s": 0.05, "done": done, "faults": faults})
        thread.start()
        deadline = time.monotonic() + 20
        while faults.by_kind["sigkill"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert faults.by_kind["sigkill"] >= 1 and faults.by_kind["sigstop"] >= 1
        assert any(p.poll() == -9 for p in workers)  # SIGKILLed
    finally:
        for p in workers:
            p.kill()
            p.wait()


def test_report_only_reads_what_finished_and_skips_the_rest(tmp_path):
    from benchmarks.parity import finished_runs

    for label, seed in (("simulator", 0), ("simulator", 1), ("faults", 0)):
        folder = tmp_path / "runs" / label / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(_run(2.0, 400)))
    (tmp_path / "runs" / "fault-free" / "seed0").mkdir(parents=True)  # started, never finished
    found = finished_runs(tmp_path, ["simulator", "fault-free", "faults"], [0, 1, 2])
    assert {label: sorted(runs) for label, runs in found.items()} == {"simulator": [0, 1], "faults": [0]}


def test_runs_kept_only_in_parity_json_are_restored_and_tabled(tmp_path, capsys):
    from benchmarks.parity import main

    results = {"simulator": {"0": _run(2.0, 400), "1": _run(2.2, 400)}, "fault-free": {"0": _run(2.1, 396)}}
    (tmp_path / "parity.json").write_text(json.dumps({"args": {}, "results": results}))
    main(["--out", str(tmp_path), "--seeds", "0,1", "--scenarios", "fault-free", "--report-only"])
    out = capsys.readouterr().out
    assert "3 finished runs restored" in out
    assert json.loads((tmp_path / "runs" / "simulator" / "seed1" / "result.json").read_text())["val_loss"] == 2.2
    assert "| fault-free | 1 | 2.1000 [2.1000–2.1000] | 1.0500 [1.0500–1.0500] |" in (tmp_path / "parity.md").read_text()
    main(["--out", str(tmp_path), "--seeds", "0,1", "--scenarios", "fault-free", "--report-only"])
    assert "restored" not in capsys.readouterr().out  # nothing missing the second time
