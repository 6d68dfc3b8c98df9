"""The coordinator against a real cluster: it observes, exports, serves status, and is
irrelevant to training (killing and restarting it changes nothing for the workers)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from noloco_rt.export import load_consensus
from noloco_rt.membership.embedded_redis import free_port
from tests.cluster import LocalCluster

pytestmark = pytest.mark.timeout(240)


def start_coordinator(cluster: LocalCluster, port: int, out: Path, log_name: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "noloco_rt.cli", "coordinator", "--redis-url", cluster.redis.url,
            "--status-port", str(port), "--out", str(out)]
    settings = {**cluster.settings, "coordinator.eval_interval_s": 1.0, "coordinator.spread_interval_s": 2.0,
                "coordinator.max_pulls_per_s": 20.0, "run.eval_batches": 2}
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NOLOCO_")}
    env.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    with (cluster.tmp_path / log_name).open("w") as handle:
        return subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, env=env)


def fetch(port: int, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.read()
    except OSError:
        return None


def status(port: int, process: subprocess.Popen | None = None) -> dict | None:
    if process is not None and process.poll() is not None:
        raise AssertionError(f"the coordinator exited with {process.returncode}")
    body = fetch(port, "/status")
    return json.loads(body) if body else None


def steps(cluster: LocalCluster) -> dict[str, int]:
    return {worker.name: worker.latest_inner_step() for worker in cluster.workers}


def test_coordinator_observes_exports_and_is_irrelevant_to_training(tmp_path):
    cluster = LocalCluster(tmp_path, stages=2)
    coordinator = None
    try:
        for name, stage in (("s0-a", 0), ("s0-b", 0), ("s1-a", 1)):
            cluster.start_worker(stage, name)
        cluster.wait_online(3)
        port, out = free_port(), tmp_path / "coordinator"
        coordinator = start_coordinator(cluster, port, out, "coordinator.log")
        seen = cluster.wait_for(lambda: (s := status(port, coordinator)) and s["last_eval"] and s["last_spread"] and s,
                                timeout_s=90, what="an evaluation and a spread measurement from the coordinator")
        assert seen["last_spread"]["replicas_per_stage"] == [2, 1]
        assert seen["last_spread"]["spread_by_stage"][1] == 0.0  # one replica: no spread
        assert 0.0 < seen["last_eval"]["val_loss"] < 10.0 and seen["members_per_stage"] == {"0": 2, "1": 1}
        cfg, model, metadata = load_consensus(out / "consensus.safetensors")
        assert cfg.pipeline.stages == 2 and metadata["replicas_per_stage"] == "2,1"
        assert sum(p.numel() for p in model.parameters()) > 0
        assert b"noloco_coordinator_val_loss" in (fetch(port, "/metrics") or b"")

        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(10)
        at_kill = steps(cluster)
        # Without the coordinator every worker keeps training: 10 more inner steps each.
        cluster.wait_for(lambda: all(steps(cluster)[n] >= at_kill[n] + 10 for n in at_kill), timeout_s=90,
                         what="10 more inner steps on every worker while the coordinator is dead")
        assert all(w.process.poll() is None for w in cluster.workers)
        for worker in cluster.workers:
            assert all(e.get("level") != "error" for e in worker.events()), worker.log_text()[-2000:]

        coordinator = start_coordinator(cluster, port, out, "coordinator.1.log")
        back = cluster.wait_for(lambda: (s := status(port, coordinator)) and s["last_eval"] and s,
                                timeout_s=60, what="the restarted coordinator's first evaluation")
        assert back["evaluations"] >= 1 and back["last_eval"]["step"] >= min(at_kill.values())
        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(20) == 0
    finally:
        if coordinator is not None and coordinator.poll() is None:
            coordinator.kill()
        cluster.close()
