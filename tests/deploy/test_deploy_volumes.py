"""The run's volumes as the render options shape them, and the transfer pod that fills and
empties them (docs/deploy.md, "From image to model")."""

from __future__ import annotations

import tomllib
from typing import Any

import kubernetes_validate
import pytest

from noloco_rt.deploy import k8s_profile, k8s_render

KUBE_VERSION = "1.30.0"


def _validate_all(docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_render_options_reach_the_volumes() -> None:
    docs = k8s_render.render("spot-gpu", storage_class="standard-rwx", store_size="2Ti", data_size="500Gi",
                             vocab_size=32000)
    _validate_all(docs)
    claims = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    assert {c["storageClassName"] for c in claims.values()} == {"standard-rwx"}
    assert claims[k8s_profile.STORE_CLAIM]["resources"]["requests"]["storage"] == "2Ti"
    assert claims[k8s_profile.DATA_CLAIM]["resources"]["requests"]["storage"] == "500Gi"
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert tomllib.loads(cm["data"]["config.toml"])["model"]["vocab_size"] == 32000
    assert all("storageClassName" not in d["spec"] for d in k8s_render.render("base")
               if d["kind"] == "PersistentVolumeClaim")  # default: the cluster's default class


def test_the_transfer_pod_mounts_the_runs_volumes_writable(capsys) -> None:
    from noloco_rt.cli import main

    for overlay in ("spot-gpu", "cpu-dev"):
        (pod,) = k8s_render.render_transfer_pod(overlay, image="example/noloco:1")
        _validate_all([pod])
        claims = {d["metadata"]["name"] for d in k8s_render.render(overlay) if d["kind"] == "PersistentVolumeClaim"}
        volumes = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]}
        (c,) = pod["spec"]["containers"]
        assert set(volumes.values()) == claims and c["image"] == "example/noloco:1"
        assert all(not m["readOnly"] for m in c["volumeMounts"]) and c["command"] == ["sleep", "infinity"]
    with pytest.raises(SystemExit) as exited:
        main(["k8s", "render", "--transfer-pod", "--generate-secrets"])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and err.count("\n") == 1 and "--transfer-pod" in err
