"""README's "Several machines", followed as written, on two machines made here (network
namespaces): Redis with a password beside a coordinator, one key pair copied to both, one
run.toml with a store every machine writes, `launch` per machine with its bind and advertised
addresses and port bases. The run must end with its model: the coordinator's consensus of the
final states, scored as `eval` scores it, equal to what `noloco-rt consensus` makes from the
store and from the checkpoints gathered from both machines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from noloco_rt.consensus.file import load_consensus
from noloco_rt.membership.embedded_redis import EmbeddedRedis, random_password
from tests.support.command_env import command_env
from workers.cluster.chaos_faults import Partitions
from workers.cluster.local_cluster import read_events
from workers.faults import netns

pytestmark = pytest.mark.timeout(400)

STEPS = 20
RUN_TOML = f"""
[run]
run_id = "bare"
steps = {STEPS}
eval_batches = 2

[model]
preset = "tiny"

[pipeline]
stages = 2
replicas = 2
max_inflight = 2

[outer]
h = 5

[worker]
heartbeat_interval_s = 0.5
exchange_timeout_s = 4.0
upstream_gone_s = 2.0

[coordinator]
eval_interval_s = 2.0
spread_interval_s = 4.0
max_pulls_per_s = 20.0
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "noloco_rt.cli", *args]


def _weights(path: Path) -> list[torch.Tensor]:
    return [p.detach() for p in load_consensus(path)[1].parameters()]


@pytest.mark.slow
def test_the_readme_steps_on_two_machines_end_with_the_runs_model(tmp_path):
    if (why_not := Partitions.unavailable()) is not None:
        pytest.skip(reason=f"{why_not}: two machines are two network namespaces, which need root and iproute2")
    netns.create(2)
    redis, processes = None, []
    try:
        password = random_password()
        redis = EmbeddedRedis(host=netns.SERVICE_IP, port=6379, prefix=netns.hub_prefix(), password=password).start()
        keys = tmp_path / "keys"
        assert subprocess.run(_cli("keys", "generate", "--out", str(keys)), capture_output=True, timeout=60).returncode == 0
        config = tmp_path / "run.toml"
        store = tmp_path / "store"  # a folder both machines write (NFS, say)
        config.write_text(RUN_TOML + f'\n[store]\nurl = "{store}"\n')
        env = command_env(NOLOCO_NETWORK_CURVE_KEY_DIR=str(keys),
                          NOLOCO_NETWORK_REDIS_URL=f"redis://:{password}@{netns.SERVICE_IP}:6379/0")
        machines = [tmp_path / f"machine-{k}" for k in (0, 1)]
        for stage, machine in enumerate(machines):
            machine.mkdir()
            args = [*netns.exec_prefix(stage), *_cli(
                "launch", "--stage", str(stage), "--nproc", "2", "--config", str(config), "--bind-host", "0.0.0.0",
                "--advertise-host", netns.worker_ip(stage), "--data-port-base", "6000", "--exchange-port-base", "6100")]
            with (machine / "launch.out").open("w") as out:
                processes.append(subprocess.Popen(args, cwd=machine, env=env, stdout=out, stderr=subprocess.STDOUT))
        with (tmp_path / "coordinator.log").open("w") as out:  # beside Redis
            coordinator = subprocess.Popen([*netns.hub_prefix(), *_cli(
                "coordinator", "--config", str(config), "--out", str(tmp_path / "consensus"))],
                cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
        processes.append(coordinator)
        for process, machine in zip(processes[:2], machines, strict=True):
            assert process.wait(300) == 0, (machine / "launch.out").read_text()[-3000:]
        assert coordinator.wait(120) == 0, (tmp_path / "coordinator.log").read_text()[-3000:]

        [final] = read_events(tmp_path / "coordinator.log", "final_consensus")
        assert final["step"] == STEPS and final["replicas"] == [2, 2], final
        model = tmp_path / "consensus" / "consensus.safetensors"
        scored = subprocess.run(_cli("eval", str(model), "--json"), capture_output=True, text=True, timeout=120)
        assert scored.returncode == 0, scored.stderr
        assert json.loads(scored.stdout)["val_loss"] == pytest.approx(final["val_loss"], abs=1e-4)
        # Without a coordinator: the same model from the store, and from the checkpoints gathered
        # from both machines (launch wrote them under runs/latest where it ran).
        for sources in (["--from-store"], [str(m / "runs" / "latest" / "checkpoints") for m in machines]):
            again = tmp_path / "again.safetensors"
            made = subprocess.run(_cli("consensus", *sources, "--config", str(config), "--out", str(again)),
                                  capture_output=True, text=True, timeout=120)
            assert made.returncode == 0, made.stderr
            assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(_weights(again), _weights(model), strict=True)), \
                sources
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait(10)
        if redis is not None:
            redis.stop()
        netns.cleanup()
