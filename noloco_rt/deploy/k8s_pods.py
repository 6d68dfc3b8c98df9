"""Pieces every pod of the run shares: labels, environment, volumes, security, spot
scheduling, the alive-file probe. Pure: plain dicts, no I/O."""

from __future__ import annotations

from typing import Any

from noloco_rt.deploy.k8s_profile import (
    ALIVE_FILE,
    APP,
    CONFIG_MOUNT,
    CURVE_MOUNT,
    DATA_CLAIM,
    DATASET_MOUNT,
    REDIS_SERVICE,
    STORE_CLAIM,
    STORE_MOUNT,
    WORK_MOUNT,
    Profile,
)

SPOT_PRIORITY_CLASS = "noloco-spot"
SPOT_NODE_SELECTOR = {"cloud.google.com/gke-spot": "true"}
SPOT_TOLERATIONS = [
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]
# The probe's check, in the image's Python (no shell tools assumed): exit 0 while the file
# was touched within argv[2] seconds, 1 when it is older, missing or unreadable.
ALIVE_CHECK = "import os, sys, time; sys.exit(time.time() - os.stat(sys.argv[1]).st_mtime > float(sys.argv[2]))"


def labels(component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component, **extra}


def stage_labels(stage: int) -> dict[str, str]:
    return labels("worker", **{"noloco-rt/stage": str(stage)})


def common_env() -> list[dict[str, Any]]:
    # Kubernetes expands $(REDIS_PASSWORD) because it is defined earlier in the same list; the
    # password reaches the process through its environment, never its command line.
    return [
        {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "noloco-redis", "key": "password"}}},
        {"name": "NOLOCO_NETWORK_REDIS_URL", "value": f"redis://:$(REDIS_PASSWORD)@{REDIS_SERVICE}:6379/0"},
        {"name": "NOLOCO_NETWORK_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def volumes(p: Profile) -> list[dict[str, Any]]:
    dataset = ([{"name": "dataset", "persistentVolumeClaim": {"claimName": DATA_CLAIM, "readOnly": True}}]
               if p.dataset else [])
    return [
        {"name": "config", "configMap": {"name": "noloco-config"}},
        {"name": "curve", "secret": {"secretName": "noloco-curve", "defaultMode": 0o400}},
        {"name": "work", "emptyDir": {}},
        {"name": "store", "persistentVolumeClaim": {"claimName": STORE_CLAIM}},
        *dataset,
    ]


def mounts(p: Profile) -> list[dict[str, Any]]:
    dataset = [{"name": "dataset", "mountPath": DATASET_MOUNT, "readOnly": True}] if p.dataset else []
    return [
        {"name": "config", "mountPath": f"{CONFIG_MOUNT}/config.toml", "subPath": "config.toml", "readOnly": True},
        {"name": "curve", "mountPath": CURVE_MOUNT, "readOnly": True},
        {"name": "work", "mountPath": WORK_MOUNT},
        {"name": "store", "mountPath": STORE_MOUNT},
        *dataset,
    ]


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security() -> dict[str, Any]:
    # fsGroup: files on the PVCs belong to the run's group, so every pod may read and write them.
    return {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}


def spot_scheduling(p: Profile, pod_spec: dict[str, Any]) -> dict[str, Any]:
    if p.spot:
        pod_spec.update({"nodeSelector": dict(SPOT_NODE_SELECTOR), "tolerations": [dict(t) for t in SPOT_TOLERATIONS],
                         "priorityClassName": SPOT_PRIORITY_CLASS})
    return pod_spec


def alive_command(stale_s: int) -> list[str]:
    return ["python", "-c", ALIVE_CHECK, ALIVE_FILE, str(stale_s)]


def alive_probe(stale_s: int, *, period_s: int, failures: int) -> dict[str, Any]:
    """An exec probe that fails while the training loop has not touched worker.alive_file for
    `stale_s` seconds (timeoutSeconds: a Python start on a busy node can take a second)."""
    return {"exec": {"command": alive_command(stale_s)}, "periodSeconds": period_s, "timeoutSeconds": 5,
            "failureThreshold": failures}
