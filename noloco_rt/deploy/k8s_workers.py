"""One Indexed Job per stage: its replicas, how their failures count, where they may run.

Why a Job and not a Deployment: a worker whose steps are done exits 0 and must stay done (a
Deployment restarts it forever). The Job is Indexed with completions = parallelism =
replicas, so a stage scales by patching both (elastic Indexed Jobs, Kubernetes >= 1.27), and
index k always runs as worker `stage<s>-r<k>`: a replacement pod continues that data stream.
Pure: plain dicts, no I/O.
"""

from __future__ import annotations

from typing import Any

from noloco_rt.deploy.k8s_pods import (
    alive_probe,
    common_env,
    container_security,
    mounts,
    pod_security,
    spot_scheduling,
    stage_labels,
    volumes,
)
from noloco_rt.deploy.k8s_profile import (
    CONFIG_ERROR_EXIT_CODE,
    CONFIG_MOUNT,
    LEFT_EXIT_CODE,
    Profile,
)
from noloco_rt.deploy.k8s_sizing import PROBE_PERIOD_S, PodSizing

# Failures of one index (a crash, an OOM kill, a hung loop killed by its liveness probe, exit 3
# "stage progress lost: retry later") before that index is given up; the other replicas go on.
# With the Job controller's backoff (10 s doubling to 6 min) 8 retries span about 20 minutes.
BACKOFF_LIMIT_PER_INDEX = 8
LIVENESS_FAILURES = 3  # the check itself waits alive_stale_s; three misses rule out a slow probe


def worker_name(stage: int) -> str:
    """The worker's --name: the kubelet expands $(JOB_COMPLETION_INDEX), which the Job
    controller sets in every container of an Indexed Job."""
    return f"stage{stage}-r$(JOB_COMPLETION_INDEX)"


def worker_args(p: Profile, stage: int) -> list[str]:
    return ["worker", "--stage", str(stage), "--name", worker_name(stage), "--config", f"{CONFIG_MOUNT}/config.toml",
            "--bind-host", "0.0.0.0", "--metrics-port", str(p.metrics_port)]


def pod_failure_policy() -> dict[str, Any]:
    """Spot reclaims and early leaves are replaced without counting; a config error (exit 2)
    fails the whole Job at once, since every replica would fail the same way."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "Ignore", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [LEFT_EXIT_CODE]}},
        {"action": "FailJob",
         "onExitCodes": {"containerName": "worker", "operator": "In", "values": [CONFIG_ERROR_EXIT_CODE]}},
    ]}


def spread(stage: int) -> list[dict[str, Any]]:
    """Replicas of a stage across nodes and zones, as a preference (ScheduleAnyway): counting
    domains ignores free GPUs, so a hard rule would leave workers Pending on clusters with
    CPU-only nodes. What keeps a stage's progress when its nodes go anyway is the store."""
    selector = {"matchLabels": stage_labels(stage)}
    return [{"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": selector}
            for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")]


def worker_container(p: Profile, stage: int, sizing: PodSizing) -> dict[str, Any]:
    gpu: dict[str, str] = {"nvidia.com/gpu": "1"} if p.gpu else {}
    # Host memory from the memory plan (noloco_rt.memory.plan): the exchange's copies dominate.
    requests = {"cpu": p.cpu_request, "memory": sizing.worker_memory, "ephemeral-storage": sizing.worker_ephemeral, **gpu}
    return {
        "name": "worker",
        "image": p.image,
        "args": worker_args(p, stage),
        "env": [*common_env(), {"name": "LOCAL_RANK", "value": "0"}],
        "ports": [{"name": "metrics", "containerPort": p.metrics_port},
                  {"name": "data", "containerPort": p.data_port},
                  {"name": "exchange", "containerPort": p.exchange_port}],
        "resources": {"requests": requests, "limits": {"memory": sizing.worker_memory, **gpu}},
        # Startup: until the loop first touches the alive file (Redis, bootstrap, store read).
        "startupProbe": alive_probe(sizing.alive_stale_s, period_s=PROBE_PERIOD_S, failures=sizing.startup_failures),
        "readinessProbe": {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 5,
                           "failureThreshold": 3},
        "livenessProbe": alive_probe(sizing.alive_stale_s, period_s=PROBE_PERIOD_S, failures=LIVENESS_FAILURES),
        # Start the graceful leave the moment deletion begins (same as the kubelet's SIGTERM, which
        # follows and is idempotent); the worker then has worker.leave_grace_s to checkpoint and exit.
        "lifecycle": {"preStop": {"exec": {"command": [
            "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)"]}}},
        "volumeMounts": mounts(p),
        "securityContext": container_security(),
    }


def worker_job(p: Profile, stage: int, sizing: PodSizing) -> dict[str, Any]:
    labels = stage_labels(stage)
    pod_spec = spot_scheduling(p, {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": p.termination_grace_s,
        "securityContext": pod_security(), "topologySpreadConstraints": spread(stage),
        "containers": [worker_container(p, stage, sizing)], "volumes": volumes(p)})
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"noloco-worker-stage-{stage}", "labels": labels},
            "spec": {"completionMode": "Indexed", "completions": p.replicas, "parallelism": p.replicas,
                     "backoffLimitPerIndex": BACKOFF_LIMIT_PER_INDEX, "podFailurePolicy": pod_failure_policy(),
                     "template": {"metadata": {"labels": labels}, "spec": pod_spec}}}


def worker_pdb(stage: int) -> dict[str, Any]:
    """Voluntary evictions (drains, autoscaler scale-down) never take a stage's last running
    replica. minAvailable as an integer: the only form allowed for pods of a Job."""
    labels = stage_labels(stage)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": f"noloco-worker-stage-{stage}", "labels": labels},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}
