"""`noloco-rt chaos` end to end: real Redis, real workers, real signals; then every invariant.

A short version of `make chaos`: 2 stages × 2 replicas, a fault every 2 s (each kind at
least once), a fault-free baseline first, CURVE on and Redis behind a password (planted: neither
may reach a file or a printed line). The driver's own waits are bounded (--timeout).
80 steps: with the overlapped outer step a stage-0 worker whose partner is held up trains
on alone, and a run of 40 could end before the last kinds' turn (a Redis restart's
recovery room puts the first worker fault at 14 s); a fast run that gets to 80 first trains
on until every kind has fired.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import zmq

from tests.support.command_env import settings_free_env
from tests.support.secrets import PASSWORD, files_holding
from workers.cluster.chaos_faults import FullDisk, Partitions
from workers.cluster.chaos_schedule import ALL_KINDS, FAULT_KINDS

pytestmark = pytest.mark.timeout(400)


@pytest.mark.slow
def test_short_chaos_run_keeps_every_invariant(tmp_path):
    out = tmp_path / "chaos"
    # Secrets planted the ways a user gives them (environment, a file); none may reach a file
    # the run writes or a line it prints.
    secret = zmq.curve_keypair()[1].decode()
    password_file = tmp_path / "redis-password"
    password_file.write_text(f"{PASSWORD}\n")
    env = settings_free_env(NOLOCO_NETWORK_CURVE_SECRET_KEY=secret, NOLOCO_NETWORK_REDIS_PASSWORD_FILE=str(password_file))
    # Every kind where partitions (network namespaces) and a full disk (a tmpfs) can be made.
    why_not = Partitions.unavailable() or FullDisk.unavailable()
    kinds = FAULT_KINDS if why_not else ALL_KINDS
    if why_not:
        print(f"only {', '.join(kinds)}: {why_not}")
    result = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "chaos", "--steps", "80", "--every", "2",
                             "--seed", "1", "--replicas", "2", "--baseline", "--out", str(out), "--timeout", "150",
                             "--net-loss", "0.02", "--net-delay-ms", "1", "--kinds", ",".join(kinds),
                             # Short windows: four kinds of the whole cluster must each fit alone.
                             "--hold", "2", "--recover", "5"],
                            env=env, capture_output=True, text=True, timeout=380)
    report = json.loads((out / "chaos.json").read_text())
    # The invariant table (stdout) first: the workers' log lines on stderr would bury it.
    tail = result.stdout[-4000:] + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, tail
    assert report["failed"] == [], tail
    faulty = report["faulty"]
    for kind in kinds:
        injected = sum(f["kind"] == kind for f in faulty["injected"])
        assert injected >= 1, f"no {kind} injected: {faulty['not_injected']}, skipped {faulty['skipped']}"
        assert faulty["observed"][kind] == injected, (kind, faulty["observed"], faulty["injected"])
    checks = report["invariants"]
    assert all(check["ok"] for check in checks.values()), checks
    assert faulty["largest_progress_gap_s"] <= report["stall_bound_s"]
    assert faulty["unexpected_exits"] == [] and faulty["not_rejoined"] == []
    assert faulty["not_injected"] == {}
    accounting = faulty["accounting"]
    assert accounting["mismatches"] == [] and accounting["sent"] == accounting["trained"] + accounting["dropped"]
    assert faulty["checkpoint_loads"] > 0 and faulty["checkpoint_failures"] == []
    # Data-path messages were lost and delayed on purpose; the accounting above still held.
    assert faulty["network_faults"]["lost"] > 0 and faulty["network_faults"]["delayed"] > 0
    assert checks["final_loss"]["ratio"] <= 1.10
    assert all(steps >= 80 for steps in faulty["reached"].values())
    assert "all invariants hold" in result.stdout
    assert files_holding(out, [secret, PASSWORD]) == []
    assert not any(s in result.stdout + result.stderr for s in (secret, PASSWORD))
