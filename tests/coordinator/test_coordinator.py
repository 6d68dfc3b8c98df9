"""The coordinator against a real cluster: it observes, exports, serves status, and is
irrelevant to training (killing and restarting it changes nothing for the workers); its
spread measurement pulls a bounded random sample of each stage, however many replicas live."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import zmq

from noloco_rt.config import load_config
from noloco_rt.consensus.file import load_consensus, mean_over_replicas, stage_parameter_shapes
from noloco_rt.membership.embedded_redis import free_port
from tests.support.command_env import command_env
from tests.support.observer_stubs import observed_stages
from tests.support.secrets import files_holding
from tests.support.waiting import wait_until
from workers.cluster.local_cluster import LocalCluster, read_events, start_command
from workers.supervise.preloaded import ForkedProcess

pytestmark = pytest.mark.timeout(240)


def start_coordinator(cluster: LocalCluster, port: int, out: Path, log_name: str, env: dict[str, str] | None = None,
                      args_after: tuple[str, ...] = (), **extra: Any) -> subprocess.Popen | ForkedProcess:
    args = ["coordinator", "--status-port", str(port), "--out", str(out), *args_after]
    settings = {**cluster.settings, "coordinator.eval_interval_s": 1.0, "coordinator.spread_interval_s": 2.0,
                "coordinator.max_pulls_per_s": 20.0, "run.eval_batches": 2, **extra}
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    environ = command_env(**{"PYTHONUNBUFFERED": "1", "NOLOCO_NETWORK_REDIS_URL": cluster.redis.url, **(env or {})})
    return start_command(args, environ, cluster.tmp_path / log_name)


def fetch(port: int, path: str) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
            return reply.read()
    except OSError:
        return None


def status(port: int, process: subprocess.Popen | ForkedProcess | None = None) -> dict | None:
    if process is not None and process.poll() is not None:
        raise AssertionError(f"the coordinator exited with {process.returncode}")
    body = fetch(port, "/status")
    return json.loads(body) if body else None


def steps(cluster: LocalCluster) -> dict[str, int]:
    return {worker.name: worker.latest_inner_step() for worker in cluster.workers}


@pytest.mark.slow
def test_coordinator_observes_exports_and_is_irrelevant_to_training(tmp_path):
    cluster = LocalCluster(tmp_path, stages=2, settings={"store.url": str(tmp_path / "store")})
    # CURVE on, its secret planted in the environment (as Redis's password is): neither may reach
    # a log, the store or the consensus.
    secret = {"NOLOCO_NETWORK_CURVE_SECRET_KEY": zmq.curve_keypair()[1].decode()}
    coordinator = None
    try:
        for name, stage in (("s0-a", 0), ("s0-b", 0), ("s1-a", 1)):
            cluster.start_worker(stage, name, env=secret)
        cluster.wait_online(3)
        port, out = free_port(), tmp_path / "coordinator"
        coordinator = start_coordinator(cluster, port, out, "coordinator.log", env=secret)
        seen = cluster.wait_for(lambda: (s := status(port, coordinator)) and s["last_eval"] and s["last_spread"] and s,
                                timeout_s=90, what="an evaluation and a spread measurement from the coordinator")
        assert seen["last_spread"]["replicas_per_stage"] == [2, 1]
        assert seen["last_spread"]["spread_by_stage"][1] == 0.0  # one replica: no spread
        assert 0.0 < seen["last_eval"]["val_loss"] < 10.0 and seen["members_per_stage"] == {"0": 2, "1": 1}
        # Outer steps by kind per stage, in the workers' words (stage 1 has one replica: local by design).
        assert set(seen["outer_steps_by_stage"]) == {"0", "1"}
        assert list(seen["outer_steps_by_stage"]["0"]) == ["matched", "partial", "local", "dropped_late", "failed"]
        cfg, model, metadata = load_consensus(out / "consensus.safetensors")
        assert cfg.pipeline.stages == 2 and metadata["replicas_per_stage"] == "2,1"
        assert sum(p.numel() for p in model.parameters()) > 0
        # The consensus outlives the coordinator's pod: copied to the durable store, checksum intact.
        assert load_consensus(tmp_path / "store" / "default" / "consensus.safetensors")[2]["replicas_per_stage"]
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

        coordinator = start_coordinator(cluster, port, out, "coordinator.1.log", env=secret)
        back = cluster.wait_for(lambda: (s := status(port, coordinator)) and s["last_eval"] and s,
                                timeout_s=60, what="the restarted coordinator's first evaluation")
        assert back["evaluations"] >= 1 and back["last_eval"]["step"] >= min(at_kill.values())
        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(20) == 0
        assert cluster.redis.password and (tmp_path / "store" / "default" / "consensus.safetensors").exists()
        planted = [*secret.values(), cluster.redis.password]
        assert files_holding(tmp_path, planted) == []  # logs, the coordinator's folder, the store
    finally:
        if coordinator is not None and coordinator.poll() is None:
            coordinator.kill()
        cluster.close()


@pytest.mark.slow
def test_when_the_run_finishes_the_coordinator_makes_its_model_from_the_final_states_and_exits(tmp_path):
    """Without it the model of a run on several machines was whatever the last spread
    measurement saw (step 71 of 100), and the coordinator never exited."""
    steps, store = 30, tmp_path / "store"
    cluster = LocalCluster(tmp_path, stages=2, settings={"store.url": str(store), "run.steps": steps})
    coordinator = None
    try:
        workers = [cluster.start_worker(stage, f"s{stage}", steps=steps) for stage in (0, 1)]
        port, out = free_port(), tmp_path / "coordinator"
        coordinator = start_coordinator(cluster, port, out, "coordinator.log", **{"run.steps": steps})
        assert all(cluster.wait_exit(worker, timeout_s=120) == 0 for worker in workers)
        assert coordinator.wait(90) == 0
        final = read_events(tmp_path / "coordinator.log", "final_consensus")
        assert len(final) == 1 and final[0]["step"] == steps, final
        _, _, metadata = load_consensus(out / "consensus.safetensors")
        assert metadata["source"] == "final states" and metadata["step"] == str(steps)
        # The same file in the store; eval scores it as the coordinator did.
        stored = store / "default" / "consensus.safetensors"
        assert stored.read_bytes() == (out / "consensus.safetensors").read_bytes()
        scored = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "eval", str(stored), "--json"],
                                capture_output=True, text=True, timeout=120)
        assert scored.returncode == 0, scored.stderr
        assert json.loads(scored.stdout)["val_loss"] == pytest.approx(final[0]["val_loss"], abs=1e-4)
        # Without a coordinator the command makes the same model from the store.
        again = tmp_path / "again.safetensors"
        made = subprocess.run([sys.executable, "-m", "noloco_rt.cli", "consensus", "--from-store", "--out", str(again),
                               "--set", f"store.url={store}", "--set", f"run.steps={steps}",
                               "--set", "pipeline.stages=2"], capture_output=True, text=True, timeout=120)
        assert made.returncode == 0, made.stderr
        ours, theirs = load_consensus(again)[1], load_consensus(stored)[1]
        assert all(torch.equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters(), strict=True))
        done = read_events(tmp_path / "coordinator.log", "coordinator_done")
        assert done and done[0]["source"] == "final states" and done[0]["consensus"] == str(out / "consensus.safetensors")
    finally:
        if coordinator is not None and coordinator.poll() is None:
            coordinator.kill()
        cluster.close()


@pytest.mark.slow
def test_a_coordinator_started_after_the_run_finished_makes_its_model_and_can_keep_serving(tmp_path):
    """No worker needed: the run-finished mark and the final states in the store are enough.
    As a Kubernetes Deployment runs it (exit_when_finished = false) it keeps serving /status."""
    from noloco_rt.membership.embedded_redis import EmbeddedRedis
    from noloco_rt.membership.redis_access import connect
    from noloco_rt.membership.table import Membership
    from noloco_rt.store.backend import RunStore
    from noloco_rt.store.stage_checkpoints import StageCheckpoints
    from tests.support.up_runs import wait_until
    from tests.support.weights import random_stages, worker_state

    store = tmp_path / "store"
    cfg = load_config(environ={}, overrides=[{"run": {"steps": 10}, "pipeline": {"stages": 2}}])
    weights = random_stages(cfg, seed=4)
    for stage in range(2):
        state = {k: v for k, v in worker_state(cfg, stage, weights[stage]).items() if k not in ("run_id", "stage")}
        StageCheckpoints(RunStore(str(store)), "default").save(stage, state, outer_step=2, inner_step=10, writer="w")
    with EmbeddedRedis() as server:
        Membership(connect(server.url), run_id="default").mark_run_finished(10)
        cluster = SimpleNamespace(redis=server, settings={"pipeline.stages": 2, "run.steps": 10,
                                                          "store.url": str(store), "run.log_format": "json"},
                                  tmp_path=tmp_path)
        port = free_port()
        serving = start_coordinator(cluster, port, tmp_path / "kept", "kept.log",
                                    **{"coordinator.exit_when_finished": "false"})
        try:
            final = wait_until(lambda: (s := status(port, serving)) and s["final"], timeout_s=60,
                               what="the final model in /status")
            assert final["source"] == "final states" and final["step"] == 10 and final["replicas_per_stage"] == [1, 1]
            assert serving.poll() is None  # still serving
            serving.send_signal(signal.SIGTERM)
            assert serving.wait(20) == 0
        finally:
            if serving.poll() is None:
                serving.kill()
        exiting = start_coordinator(cluster, free_port(), tmp_path / "exits", "exits.log")
        assert exiting.wait(60) == 0  # the default: done, so it exits
        # Without a store, the workers' checkpoints on this machine (up's, or every stage launched here).
        from noloco_rt.checkpoints.worker import save_checkpoint

        local = tmp_path / "local"
        (local / "checkpoints").mkdir(parents=True)
        for stage in range(2):
            for replica in range(2):
                save_checkpoint(local / "checkpoints" / f"s{stage}-r{replica}.pt",
                                worker_state(cfg, stage, random_stages(cfg, seed=replica)[stage]))
        cluster.settings.pop("store.url")
        # With curves on, as under `up` (the final point once named a tag that does not exist).
        curves = ("--tensorboard", str(tmp_path / "tb")) if importlib.util.find_spec("tensorboard") else ()
        here = start_coordinator(cluster, free_port(), local, "local.log", args_after=curves)
        assert here.wait(60) == 0
    assert read_events(tmp_path / "exits.log", "final_consensus")[0]["step"] == 10
    [made] = read_events(tmp_path / "local.log", "final_consensus")
    assert made["step"] == 10 and made["replicas"] == [2, 2], made
    assert read_events(tmp_path / "local.log", "observer_cycle_failed") == []
    [done] = read_events(tmp_path / "local.log", "coordinator_done")
    assert done["source"] == "final states"


@pytest.mark.slow
def test_coordinator_pulls_a_bounded_sample_of_a_larger_stage(tmp_path):
    cluster = LocalCluster(tmp_path, stages=2)
    coordinator = None
    try:
        for name, stage in (("s0-a", 0), ("s0-b", 0), ("s0-c", 0), ("s1-a", 1)):
            cluster.start_worker(stage, name)
        cluster.wait_online(4, timeout_s=120)
        port, out = free_port(), tmp_path / "coordinator"
        coordinator = start_coordinator(cluster, port, out, "coordinator.log", **{"coordinator.spread_sample": 2})
        seen = cluster.wait_for(lambda: (s := status(port, coordinator)) and s["spread_measurements"] >= 2 and s,
                                timeout_s=120, what="two spread measurements from the coordinator")
        spread = seen["last_spread"]
        # 2 of stage 0's 3 replicas pulled and averaged; stage 1's single replica, whole.
        assert spread["live_per_stage"] == [3, 1] and spread["replicas_per_stage"] == [2, 1]
        assert spread["pulls_per_stage"] == [2, 1]
        # Two replicas of three give an estimate but cannot bound it (JSON null); one of one is exact.
        # (The estimate may be 0: replicas share their slow weights until their first outer step.)
        assert spread["spread_low_by_stage"][0] == 0.0 <= spread["spread_by_stage"][0]
        assert spread["spread_high_by_stage"][0] is None and spread["spread_high"] is None
        assert spread["spread_low_by_stage"][1] == spread["spread_by_stage"][1] == spread["spread_high_by_stage"][1]
        _, _, metadata = load_consensus(out / "consensus.safetensors")
        assert metadata["replicas_sampled"] == "2,1" and metadata["replicas_live"] == "3,1"
        metrics = (fetch(port, "/metrics") or b"").decode()
        assert 'noloco_coordinator_spread_replicas_sampled{stage="0"} 2.0' in metrics
        assert 'noloco_coordinator_replica_spread_high{stage="0"} +Inf' in metrics

        coordinator.send_signal(signal.SIGTERM)
        assert coordinator.wait(20) == 0
        measured = read_events(tmp_path / "coordinator.log", "spread_measured")
        assert len(measured) >= 2 and all(e["pulls"] == [2, 1] and e["replicas"] == [2, 1] for e in measured)
    finally:
        if coordinator is not None and coordinator.poll() is None:
            coordinator.kill()
        cluster.close()


# -- the spread cycle alone: membership and pulls stand-ins that count -------------------------








def test_spread_pulls_exactly_spread_sample_of_a_larger_stage_and_all_of_a_smaller_one(tmp_path):
    observer, puller = observed_stages(tmp_path, {0: 12, 1: 2}, sample=3, seed=0)
    result = observer.spread_once(threading.Event())
    stage0 = [name for name in puller.pulled if name.startswith("s0-")]
    assert len(stage0) == len(set(stage0)) == 3  # without replacement
    assert sorted(name for name in puller.pulled if name.startswith("s1-")) == ["s1-0", "s1-1"]
    assert result.replicas_per_stage == [3, 2] and result.live_per_stage == [12, 2] and result.pulls_per_stage == [3, 2]
    assert result.spread_low_by_stage[0] < result.spread_by_stage[0] < result.spread_high_by_stage[0]
    assert result.spread_low_by_stage[1] == result.spread_by_stage[1] == result.spread_high_by_stage[1] > 0
    # The consensus is the mean of the very replicas sampled, and says how many it averaged of how many.
    _, model, metadata = load_consensus(tmp_path / "consensus.safetensors")
    assert (metadata["replicas_sampled"], metadata["replicas_live"]) == ("3,2", "12,2")
    expected = mean_over_replicas([puller.weights[name] for name in stage0])
    names = [name for name, _ in stage_parameter_shapes(observer.cfg, 0)]
    params = dict(model.named_parameters())
    assert all(torch.allclose(params[n].detach(), t) for n, t in zip(names, expected, strict=True))
    shown = json.loads(json.dumps(observer.status_json()))  # what /status serves
    assert shown["spread_measurements"] == 1 and shown["last_spread"]["spread_high"] == result.spread_high


def test_spread_samples_differ_between_draws(tmp_path):
    drawn = set()
    for seed in range(6):
        observer, puller = observed_stages(tmp_path / str(seed), {0: 12}, sample=3, seed=seed)
        observer.spread_once(threading.Event())
        drawn.add(frozenset(puller.pulled))
    assert len(drawn) > 1  # fixed seeds: not a matter of chance


def test_a_failed_spread_pull_is_replaced_by_another_member(tmp_path):
    failing = frozenset({"s0-0", "s0-1"})
    observer, puller = observed_stages(tmp_path, {0: 5}, sample=3, seed=1, failing=failing)
    result = observer.spread_once(threading.Event())
    assert result.replicas_per_stage == [3] and result.live_per_stage == [5]
    failed = len(set(puller.pulled) & failing)
    assert failed >= 1  # this seed draws a failing member before the sample is full
    assert observer.status.pulls_failed == failed and len(puller.pulled) == 3 + failed
    assert result.pulls_per_stage == [len(puller.pulled)]
    assert result.spread_low < result.spread < result.spread_high  # 3 of 5: an estimate, not exact


def test_a_cycle_that_found_no_live_worker_is_tried_again_soon_not_a_whole_interval_later(tmp_path):
    """Started before its workers (as `up` and a Job start it), the coordinator's first cycles
    find nobody: they are tried again after RETRY_UNMEASURED_S, so a short run is measured."""
    from coordinator.observer import RETRY_UNMEASURED_S

    observer, puller = observed_stages(tmp_path, {0: 2, 1: 2}, sample=2, seed=0)
    cfg = observer.cfg
    observer.cfg = dataclasses.replace(cfg, coordinator=dataclasses.replace(
        cfg.coordinator, eval_interval_s=60.0, spread_interval_s=120.0))
    members, observer.membership.members = observer.membership.members, []
    stop = threading.Event()
    thread = threading.Thread(target=observer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_until(lambda: observer.status.note.startswith("waiting for a live worker"), 10.0, "the first, empty cycle")
        assert puller.pulled == []
        observer.membership.members = members  # the workers are online now
        wait_until(lambda: observer.status.evaluations >= 1, 10 * RETRY_UNMEASURED_S,
                   "an evaluation well before the 60-s interval")
    finally:
        stop.set()
        thread.join(10.0)
    assert not thread.is_alive()
    assert {name[:2] for name in puller.pulled} == {"s0", "s1"} and observer.status.note == ""
    assert observer.status.spread_measurements == 0  # on its own schedule: first after min(60, 120) s
