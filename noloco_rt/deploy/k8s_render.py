"""Kubernetes manifests for a run of S stages × R replicas, as plain dicts (pure, no I/O).

The same objects as `kubectl kustomize k8s/overlays/<name>` (tests/test_deploy.py compares them
where kubectl exists); this renderer needs only PyYAML, so `noloco-rt k8s render` works without
kubectl and CI validates the manifests without it. The worker's command line, the ports of the
probes and the termination grace all derive from one `Profile`, so they cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

APP = "noloco-rt"
REDIS_SERVICE = "noloco-redis"
CONFIG_MOUNT = "/etc/noloco"
CURVE_MOUNT = "/etc/noloco/curve"
DATA_MOUNT = "/var/lib/noloco"
# Seconds the pod gets beyond worker.leave_grace_s: the preStop hook, the final checkpoint write
# racing the grace timer, and process exit. The kubelet SIGKILLs at terminationGracePeriodSeconds.
GRACE_MARGIN_S = 15


@dataclass(frozen=True)
class Profile:
    """Everything that differs between overlays; `render` turns it into manifests."""

    name: str
    stages: int = 2
    replicas: int = 2
    image: str = "noloco-rt:0.1.0-cuda"
    gpu: bool = True
    model_preset: str = "125m"
    spot: bool = False
    run_steps: int = 100_000
    metrics_port: int = 9100
    data_port: int = 5555
    exchange_port: int = 5556
    status_port: int = 8780
    leave_grace_s: int = 20
    cpu_request: str = "4"
    memory_request: str = "16Gi"

    @property
    def termination_grace_s(self) -> int:
        return self.leave_grace_s + GRACE_MARGIN_S


PROFILES: dict[str, Profile] = {
    "base": Profile("base"),
    "spot-gpu": Profile("spot-gpu", stages=4, replicas=4, model_preset="1b", spot=True),
    "cpu-dev": Profile("cpu-dev", image="noloco-rt:0.1.0-cpu", gpu=False, model_preset="tiny",
                       run_steps=2000, cpu_request="1", memory_request="2Gi"),
}
SPOT_PRIORITY_CLASS = "noloco-spot"
SPOT_NODE_SELECTOR = {"cloud.google.com/gke-spot": "true"}
SPOT_TOLERATIONS = [
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
]


def profile_for(overlay: str = "base", *, stages: int | None = None, replicas: int | None = None,
                image: str | None = None) -> Profile:
    if overlay not in PROFILES:
        raise ValueError(f"unknown overlay {overlay!r}: one of {', '.join(PROFILES)}")
    profile = PROFILES[overlay]
    changes = {k: v for k, v in {"stages": stages, "replicas": replicas, "image": image}.items() if v is not None}
    if changes.get("stages", 1) < 1 or changes.get("replicas", 1) < 1:
        raise ValueError("stages and replicas must be at least 1")
    return replace(profile, **changes)


def config_toml(p: Profile) -> str:
    """The run's config (read by every process through --config); ports here are the probes' ports."""
    return "\n".join([
        "[run]", 'run_id = "k8s"', f"steps = {p.run_steps}", 'log_format = "json"', "",
        "[model]", f'preset = "{p.model_preset}"', "",
        "[pipeline]", f"stages = {p.stages}", f"replicas = {p.replicas}", "",
        "[network]", 'bind_host = "0.0.0.0"', f"data_port = {p.data_port}",
        f"exchange_port = {p.exchange_port}", f"metrics_port = {p.metrics_port}",
        f'curve_key_dir = "{CURVE_MOUNT}"', "",
        "[worker]", f"leave_grace_s = {float(p.leave_grace_s)}", "",
        "[coordinator]", f"status_port = {p.status_port}", "",
        "[paths]", f'out_dir = "{DATA_MOUNT}"', "",
    ])


def _labels(component: str, **extra: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": APP, "app.kubernetes.io/component": component, **extra}


def _common_env() -> list[dict[str, Any]]:
    # Kubernetes expands $(REDIS_PASSWORD) because it is defined earlier in the same list; the
    # password reaches the process through its environment, never its command line.
    return [
        {"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "noloco-redis", "key": "password"}}},
        {"name": "NOLOCO_NETWORK_REDIS_URL", "value": f"redis://:$(REDIS_PASSWORD)@{REDIS_SERVICE}:6379/0"},
        {"name": "NOLOCO_NETWORK_ADVERTISE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def _volumes() -> list[dict[str, Any]]:
    return [
        {"name": "config", "configMap": {"name": "noloco-config"}},
        {"name": "curve", "secret": {"secretName": "noloco-curve", "defaultMode": 0o400}},
        {"name": "data", "emptyDir": {}},
    ]


def _mounts() -> list[dict[str, Any]]:
    return [
        {"name": "config", "mountPath": f"{CONFIG_MOUNT}/config.toml", "subPath": "config.toml", "readOnly": True},
        {"name": "curve", "mountPath": CURVE_MOUNT, "readOnly": True},
        {"name": "data", "mountPath": DATA_MOUNT},
    ]


def _security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}


def _spot(p: Profile, pod_spec: dict[str, Any]) -> dict[str, Any]:
    if p.spot:
        pod_spec.update({"nodeSelector": dict(SPOT_NODE_SELECTOR), "tolerations": [dict(t) for t in SPOT_TOLERATIONS],
                         "priorityClassName": SPOT_PRIORITY_CLASS})
    return pod_spec


def worker_args(p: Profile, stage: int) -> list[str]:
    return ["worker", "--stage", str(stage), "--config", f"{CONFIG_MOUNT}/config.toml",
            "--bind-host", "0.0.0.0", "--metrics-port", str(p.metrics_port)]


def coordinator_args(p: Profile) -> list[str]:
    return ["coordinator", "--config", f"{CONFIG_MOUNT}/config.toml", "--host", "0.0.0.0",
            "--status-port", str(p.status_port), "--out", f"{DATA_MOUNT}/out"]


def worker_deployment(p: Profile, stage: int) -> dict[str, Any]:
    labels = _labels("worker", **{"noloco-rt/stage": str(stage)})
    probe_get = {"path": "/metrics", "port": "metrics"}
    limits: dict[str, str] = {"nvidia.com/gpu": "1"} if p.gpu else {}
    container = {
        "name": "worker",
        "image": p.image,
        "args": worker_args(p, stage),
        "env": [*_common_env(), {"name": "LOCAL_RANK", "value": "0"}],
        "ports": [{"name": "metrics", "containerPort": p.metrics_port},
                  {"name": "data", "containerPort": p.data_port},
                  {"name": "exchange", "containerPort": p.exchange_port}],
        "resources": {"requests": {"cpu": p.cpu_request, "memory": p.memory_request, **limits},
                      "limits": {"memory": p.memory_request, **limits}},
        "readinessProbe": {"httpGet": probe_get, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {"httpGet": probe_get, "initialDelaySeconds": 30, "periodSeconds": 10,
                          "failureThreshold": 6},
        # Start the graceful leave the moment deletion begins (same as the kubelet's SIGTERM, which
        # follows and is idempotent); the worker then has worker.leave_grace_s to checkpoint and exit.
        "lifecycle": {"preStop": {"exec": {"command": [
            "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)"]}}},
        "volumeMounts": _mounts(),
        "securityContext": _security(),
    }
    pod_spec = _spot(p, {"terminationGracePeriodSeconds": p.termination_grace_s, "securityContext": _pod_security(),
                         "containers": [container], "volumes": _volumes()})
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"noloco-worker-stage-{stage}", "labels": labels},
            "spec": {"replicas": p.replicas, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec}}}


def worker_pdb(stage: int) -> dict[str, Any]:
    labels = _labels("worker", **{"noloco-rt/stage": str(stage)})
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"noloco-worker-stage-{stage}", "labels": labels},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}}}


def coordinator(p: Profile) -> list[dict[str, Any]]:
    labels = _labels("coordinator")
    probe_get = {"path": "/status", "port": "status"}
    container = {
        "name": "coordinator", "image": p.image, "args": coordinator_args(p), "env": _common_env(),
        "ports": [{"name": "status", "containerPort": p.status_port}],
        "resources": {"requests": {"cpu": "1", "memory": p.memory_request}, "limits": {"memory": p.memory_request}},
        "readinessProbe": {"httpGet": probe_get, "periodSeconds": 10},
        "livenessProbe": {"httpGet": probe_get, "initialDelaySeconds": 30, "periodSeconds": 20,
                          "failureThreshold": 6},
        "volumeMounts": _mounts(), "securityContext": _security(),
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "noloco-coordinator", "labels": labels},
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels}, "spec": {
                               "securityContext": _pod_security(), "containers": [container],
                               "volumes": _volumes()}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "noloco-coordinator", "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "status", "port": p.status_port,
                                                       "targetPort": "status"}]}}
    return [deployment, service]


def redis() -> list[dict[str, Any]]:
    labels = _labels("redis")
    container = {
        "name": "redis", "image": "redis:7.2-alpine",
        "args": ["redis-server", "--requirepass", "$(REDIS_PASSWORD)", "--save", "", "--appendonly", "no"],
        "env": _common_env()[:1],
        "ports": [{"name": "redis", "containerPort": 6379}],
        "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        "readinessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "initialDelaySeconds": 10, "periodSeconds": 10},
        "securityContext": _security(),
    }
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": REDIS_SERVICE, "labels": labels},
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels}, "spec": {
                               "securityContext": {"runAsNonRoot": True, "runAsUser": 999},
                               "containers": [container]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": REDIS_SERVICE, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "redis", "port": 6379, "targetPort": "redis"}]}}
    return [deployment, service]


def secrets(redis_password: str, curve_public: str, curve_secret: str) -> list[dict[str, Any]]:
    """The run's two Secrets with the values given. The manifests never carry placeholders:
    without these objects (created by kubectl, docs/deploy.md, or rendered with
    --generate-secrets) pods wait in CreateContainerConfigError naming the missing Secret,
    instead of running with a password every reader of this repository knows."""
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "noloco-redis", "labels": _labels("secret")},
         "type": "Opaque", "stringData": {"password": redis_password}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "noloco-curve", "labels": _labels("secret")},
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
            "metadata": {"name": "noloco-run-only", "labels": _labels("network-policy")},
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": APP}},
                     "policyTypes": ["Ingress"], "ingress": [{"from": [peer]}]}}


def priority_class() -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": SPOT_PRIORITY_CLASS, "labels": _labels("priority")},
            "value": 1000, "globalDefault": False, "preemptionPolicy": "Never",
            "description": "noloco-rt workers on spot GPU pools: elastic, so they never preempt other pods."}


def config_map(p: Profile) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "noloco-config", "labels": _labels("config")},
            "data": {"config.toml": config_toml(p)}}


def render(overlay: str = "base", *, stages: int | None = None, replicas: int | None = None,
           image: str | None = None, generate_secrets: bool = False) -> list[dict[str, Any]]:
    """Every object of the run, in apply order (config and secrets first). Raises ConfigError
    for an image that is no image reference or a config the pods' loader would refuse."""
    from noloco_rt.deploy.render_checks import check_image_reference, check_rendered_config

    p = profile_for(overlay, stages=stages, replicas=replicas, image=image)
    check_image_reference(p.image)
    check_rendered_config(config_toml(p))
    docs: list[dict[str, Any]] = [config_map(p), *(generated_secrets() if generate_secrets else []),
                                  network_policy()]
    if p.spot:
        docs.append(priority_class())
    docs += redis() + coordinator(p)
    for stage in range(p.stages):
        docs += [worker_deployment(p, stage), worker_pdb(stage)]
    return docs


def to_yaml(docs: list[dict[str, Any]]) -> str:
    import yaml

    class _Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # shared label dicts: write them out, no &id001
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:  # the TOML stays readable
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    _Dumper.add_representer(str, _str)
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False) for d in docs)
