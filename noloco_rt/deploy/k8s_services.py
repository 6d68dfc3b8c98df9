"""Everything of a run besides the workers: config, storage, Redis, the coordinator, network
policy, priority class, secrets. Pure: plain dicts, no I/O."""

from __future__ import annotations

from typing import Any

from noloco_rt.deploy.k8s_pods import (
    SPOT_PRIORITY_CLASS,
    common_env,
    container_security,
    labels,
    mounts,
    pod_security,
    volumes,
)
from noloco_rt.deploy.k8s_profile import (
    APP,
    CONFIG_MOUNT,
    DATA_CLAIM,
    REDIS_SERVICE,
    STORE_CLAIM,
    WORK_MOUNT,
    Profile,
    config_toml,
)
from noloco_rt.deploy.k8s_sizing import PodSizing

# Redis reads its password from a config file written at start, so it never appears in
# redis-server's argv (`ps` on the node, /proc/<pid>/cmdline). The file is private (umask 077)
# and lives in the container's own /tmp. The arguments after the script are redis-server's.
REDIS_CONF = "/tmp/redis.conf"
REDIS_SCRIPT = (f'umask 077 && printf "requirepass %s\\n" "$REDIS_PASSWORD" > {REDIS_CONF} '
                f'&& exec redis-server {REDIS_CONF} "$@"')
REDIS_ARGS = ["--save", "", "--appendonly", "no"]
TRANSFER_POD = "noloco-transfer"


def config_map(p: Profile) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "noloco-config", "labels": labels("config")},
            "data": {"config.toml": config_toml(p)}}


def claim(p: Profile, name: str, size: str, access_mode: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": [access_mode], "resources": {"requests": {"storage": size}}}
    if p.storage_class:
        spec["storageClassName"] = p.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": labels("storage")}, "spec": spec}


def claims(p: Profile, sizing: PodSizing) -> list[dict[str, Any]]:
    """The durable store (every pod writes) and, with a dataset, the data volume (written
    once by a transfer pod, read by every pod: so ReadWriteMany as well)."""
    store = claim(p, STORE_CLAIM, p.store_size or sizing.store, p.store_access_mode)
    return [store, claim(p, DATA_CLAIM, p.data_size, "ReadWriteMany")] if p.dataset else [store]


def transfer_pod(p: Profile) -> dict[str, Any]:
    """A pod that only sleeps, mounting the store and the data volume writable, for
    `kubectl cp` both ways: the prepared data up, the consensus down (docs/deploy.md). The
    run's image: it has tar (kubectl cp needs it) and the run's uid and group."""
    writable = [{**m, "readOnly": False} for m in mounts(p) if m["name"] in ("store", "dataset")]
    claimed = [{"name": v["name"], "persistentVolumeClaim": {"claimName": v["persistentVolumeClaim"]["claimName"]}}
               for v in volumes(p) if "persistentVolumeClaim" in v]
    container = {"name": "transfer", "image": p.image, "command": ["sleep", "infinity"],
                 "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                 "volumeMounts": writable, "securityContext": container_security()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": TRANSFER_POD, "labels": labels("transfer")},
            "spec": {"securityContext": pod_security(), "containers": [container], "volumes": claimed}}


def coordinator_args(p: Profile) -> list[str]:
    return ["coordinator", "--config", f"{CONFIG_MOUNT}/config.toml", "--host", "0.0.0.0",
            "--status-port", str(p.status_port), "--out", f"{WORK_MOUNT}/out"]


def coordinator(p: Profile, sizing: PodSizing) -> list[dict[str, Any]]:
    component = labels("coordinator")
    probe_get = {"path": "/status", "port": "status"}
    requests = {"cpu": "1", "memory": p.memory_request, "ephemeral-storage": sizing.coordinator_ephemeral}
    container = {
        "name": "coordinator", "image": p.image, "args": coordinator_args(p), "env": common_env(),
        "ports": [{"name": "status", "containerPort": p.status_port}],
        "resources": {"requests": requests, "limits": {"memory": p.memory_request}},
        "readinessProbe": {"httpGet": probe_get, "periodSeconds": 10},
        "livenessProbe": {"httpGet": probe_get, "initialDelaySeconds": 30, "periodSeconds": 20,
                          "failureThreshold": 6},
        "volumeMounts": mounts(p), "securityContext": container_security(),
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "noloco-coordinator", "labels": component},
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": component},
                           "template": {"metadata": {"labels": component}, "spec": {
                               "securityContext": pod_security(), "containers": [container],
                               "volumes": volumes(p)}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "noloco-coordinator", "labels": component},
               "spec": {"selector": component, "ports": [{"name": "status", "port": p.status_port,
                                                          "targetPort": "status"}]}}
    return [deployment, service]


def redis() -> list[dict[str, Any]]:
    component = labels("redis")
    container = {
        "name": "redis", "image": "redis:7.2-alpine",
        "command": ["sh", "-c", REDIS_SCRIPT, "redis-server", *REDIS_ARGS],
        "env": common_env()[:1],
        "ports": [{"name": "redis", "containerPort": 6379}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "initialDelaySeconds": 10, "periodSeconds": 10},
        "securityContext": container_security(),
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": REDIS_SERVICE, "labels": component},
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": component},
                           "template": {"metadata": {"labels": component}, "spec": {
                               "securityContext": {"runAsNonRoot": True, "runAsUser": 999},
                               "containers": [container]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": REDIS_SERVICE, "labels": component},
               "spec": {"selector": component, "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}]}}
    return [deployment, service]


def secrets(redis_password: str, curve_public: str, curve_secret: str) -> list[dict[str, Any]]:
    """The run's two Secrets with the values given. The manifests never carry placeholders:
    without these objects (created by kubectl, docs/deploy.md, or rendered with
    --generate-secrets) pods wait in CreateContainerConfigError naming the missing Secret,
    instead of running with a password every reader of this repository knows."""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "noloco-redis", "labels": labels("secret")},
         "type": "Opaque", "stringData": {"password": redis_password}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "noloco-curve", "labels": labels("secret")},
         "type": "Opaque", "stringData": {"cluster.public": curve_public, "cluster.secret": curve_secret}},
    ]


def generated_secrets() -> list[dict[str, Any]]:
    """Fresh values: a URL-safe Redis password (it goes into redis://) and a CURVE key pair."""
    import secrets as random_source

    import zmq

    public, secret = zmq.curve_keypair()
    return secrets(random_source.token_hex(24), public.decode(), secret.decode())


def network_policy() -> dict[str, Any]:
    """Only pods of the run reach each other (ZeroMQ, Redis, metrics, /status)."""
    peer = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": APP}}}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": "noloco-run-only", "labels": labels("network-policy")},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": APP}},
                     "policyTypes": ["Ingress"], "ingress": [{"from": [peer]}]}}


def priority_class() -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": SPOT_PRIORITY_CLASS, "labels": labels("priority")},
            "value": 1000, "globalDefault": False, "preemptionPolicy": "Never",
            "description": "noloco-rt workers on spot GPU pools: elastic, so they never preempt other pods."}
