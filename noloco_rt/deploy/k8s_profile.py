"""What differs between the Kubernetes overlays (a `Profile`), and the run's config.toml it implies.

Pure: no I/O. Paths and exit codes the manifests and the config must agree on live here once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

APP = "noloco-rt"
REDIS_SERVICE = "noloco-redis"
CONFIG_MOUNT = "/etc/noloco"
CURVE_MOUNT = "/etc/noloco/curve"
WORK_MOUNT = "/var/lib/noloco"  # an emptyDir: the worker's local checkpoint, logs
STORE_MOUNT = "/store"  # the durable store PVC (store.url): stage checkpoints, the consensus
DATASET_MOUNT = "/data"  # the data PVC, read-only for the run
PREPARED_PATH = f"{DATASET_MOUNT}/prepared"  # where `noloco-rt prepare`'s output goes on it
STORE_CLAIM = "noloco-store"
DATA_CLAIM = "noloco-data"
ALIVE_FILE = "/tmp/noloco-alive"  # touched by the training loop; the probes read its age
RUN_ID = "k8s"
# Exit status of a worker that left on SIGTERM before its steps were done: EX_TEMPFAIL of
# sysexits.h ("try again later"). The Job replaces such a pod without counting a failure.
LEFT_EXIT_CODE = 75
CONFIG_ERROR_EXIT_CODE = 2  # bad config or flags (noloco_rt.cli): retrying cannot help
# How long a pod waits for Redis at start (worker.redis_wait_s): Redis may be scheduled and
# pulled after the workers, and an unreachable Redis ends in exit 2, which fails the Job.
REDIS_WAIT_S = 300
# How often a later stage reports waiting for an upstream stage that vanished unfinished
# (worker.upstream_lost_s; it waits however long): a reclaimed stage's replacements need new
# nodes, an image pull and a store read (the 1b startup probe allows about 30 min).
UPSTREAM_LOST_S = 3600


@dataclass(frozen=True)
class Profile:
    """Everything that differs between overlays; `render` turns it into manifests."""

    name: str
    stages: int = 2
    replicas: int = 2
    image: str = "noloco-rt:0.1.0-cuda"
    gpu: bool = True
    model_preset: str = "125m"
    vocab_size: int = 256
    spot: bool = False
    run_steps: int = 100_000
    run_id: str = RUN_ID
    """run.run_id: a new run on the same store needs a new one (a finished run's mark makes
    every worker of that id exit 0 at once)."""
    metrics_port: int = 9100
    data_port: int = 5555
    exchange_port: int = 5556
    status_port: int = 8780
    leave_grace_s: int = 20
    min_bandwidth_mbit_s: float = 200.0
    """worker.min_bandwidth_mbit_s: the slowest link between workers; the workers' deadlines and
    the probes' thresholds follow it."""
    # Seconds the pod gets beyond leave_grace_s: the preStop hook, the final checkpoint write
    # racing the grace timer, process exit. The kubelet SIGKILLs at terminationGracePeriodSeconds.
    grace_margin_s: int = 15
    cpu_request: str = "4"
    memory_request: str = "16Gi"
    dataset: bool = True
    """A data PVC holding `noloco-rt prepare` output (data.source = tokens); False: the
    image's own Python standard library text (no PVC, nothing to upload)."""
    store_access_mode: str = "ReadWriteMany"
    storage_class: str = ""
    """The PVCs' storageClassName; empty: the cluster's default class."""
    store_size: str = ""
    """The store PVC's size; empty: derived from the preset (noloco_rt.deploy.k8s_sizing)."""
    data_size: str = "100Gi"

    @property
    def termination_grace_s(self) -> int:
        return self.leave_grace_s + self.grace_margin_s


# GKE gives non-system pods of a reclaimed spot node 15 s of graceful shutdown, and a larger
# terminationGracePeriodSeconds has no effect there (docs/deploy.md, "Spot timing"): leave
# within 10 s and be gone within 15.
SPOT_NOTICE_S = 15
PROFILES: dict[str, Profile] = {
    "base": Profile("base"),
    "spot-gpu": Profile("spot-gpu", stages=4, replicas=4, model_preset="1b", spot=True,
                        leave_grace_s=10, grace_margin_s=SPOT_NOTICE_S - 10),
    # kind/minikube: one node, so ReadWriteOnce suffices (kind's local-path class offers no
    # ReadWriteMany), and the image's own text as data (nothing to prepare or upload).
    "cpu-dev": Profile("cpu-dev", image="noloco-rt:0.1.0-cpu", gpu=False, model_preset="tiny",
                       run_steps=2000, cpu_request="1", memory_request="2Gi", dataset=False,
                       store_access_mode="ReadWriteOnce"),
}


def profile_for(overlay: str = "base", **changes: Any) -> Profile:
    """The overlay's profile with the given fields replaced (None: keep the overlay's)."""
    if overlay not in PROFILES:
        raise ValueError(f"unknown overlay {overlay!r}: one of {', '.join(PROFILES)}")
    given = {key: value for key, value in changes.items() if value is not None}
    if given.get("stages", 1) < 1 or given.get("replicas", 1) < 1:
        raise ValueError("stages and replicas must be at least 1")
    return replace(PROFILES[overlay], **given)


def config_toml(p: Profile) -> str:
    """The run's config (read by every process through --config); ports here are the probes' ports."""
    data = (["[data]", 'source = "tokens"', f'paths = ["{PREPARED_PATH}"]', ""] if p.dataset else [])
    return "\n".join([
        "[run]", f'run_id = "{p.run_id}"', f"steps = {p.run_steps}", 'log_format = "json"', "",
        "[model]", f'preset = "{p.model_preset}"', f"vocab_size = {p.vocab_size}", "",
        "[pipeline]", f"stages = {p.stages}", f"replicas = {p.replicas}", "",
        *data,
        "[network]", 'bind_host = "0.0.0.0"', f"data_port = {p.data_port}",
        f"exchange_port = {p.exchange_port}", f"metrics_port = {p.metrics_port}",
        f'curve_key_dir = "{CURVE_MOUNT}"', "",
        "[worker]", f"leave_grace_s = {float(p.leave_grace_s)}", f"min_bandwidth_mbit_s = {float(p.min_bandwidth_mbit_s)}",
        f"left_exit_code = {LEFT_EXIT_CODE}",
        f'alive_file = "{ALIVE_FILE}"', f"redis_wait_s = {float(REDIS_WAIT_S)}",
        f"upstream_lost_s = {float(UPSTREAM_LOST_S)}", "",
        "[coordinator]", f"status_port = {p.status_port}", "exit_when_finished = false", "",
        "[store]", f'url = "{STORE_MOUNT}"', "",
        "[paths]", f'out_dir = "{WORK_MOUNT}"', "",
    ])
