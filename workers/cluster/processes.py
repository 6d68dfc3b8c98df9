"""The processes of a one-machine cluster (`noloco-rt up`, `noloco-rt chaos`): names,
command lines and environments of the supervised `noloco-rt` children."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url
from workers.supervise.launch import STOP_MARGIN_S
from workers.supervise.supervisor import ProcessSpec


def names_by_stage(cfg: Config) -> dict[str, int]:
    """Worker name -> stage: s<k>-r<j> for S stages × R replicas."""
    return {f"s{k}-r{j}": k for k in range(cfg.pipeline.stages) for j in range(cfg.pipeline.replicas)}


def supervisor_grace_s(cfg: Config) -> float:
    """How long the supervisor waits for a child told to leave before it kills it."""
    return cfg.worker.leave_grace_s + STOP_MARGIN_S


def run_command(config_file: Path, *args: str) -> tuple[str, ...]:
    """`noloco-rt ARGS` reading the run's config.toml, logging JSON lines (what the logs hold)."""
    return (sys.executable, "-m", "noloco_rt.cli", *args, "--config", str(config_file),
            "--set", "run.log_format=json")


def threads_per_worker(cores: int, workers: int) -> int:
    """Each worker's share of this machine's cores for torch's CPU work (pure): S × R
    processes share them. On a GPU machine the share matters: the outer exchange's host
    arithmetic (decoding a partner's state, the correction) runs on it."""
    return max(1, cores // max(1, workers))


def child_env(cfg: Config, redis_url: str, *, workers: int = 0) -> dict[str, str]:
    # The Redis URL goes through the environment, like `launch` does: a password in it
    # never shows in `ps`. `workers`: how many share this machine (0: one thread each).
    threads = threads_per_worker(os.cpu_count() or 1, workers) if workers else 1
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1", "NOLOCO_NETWORK_REDIS_URL": redis_url}
    if cfg.network.curve_secret_key:  # kept out of config.toml and the command line
        env["NOLOCO_NETWORK_CURVE_SECRET_KEY"] = cfg.network.curve_secret_key
    if redact_url(cfg.store.url) != cfg.store.url:  # a password in it: config.toml holds it redacted
        env["NOLOCO_STORE_URL"] = cfg.store.url
    return env


def worker_process_specs(cfg: Config, config_file: Path, names: dict[str, int], redis_url: str,
                         extra_env: dict[str, str] | None = None,
                         hosts: dict[str, tuple[list[str], str]] | None = None) -> list[ProcessSpec]:
    """One supervised `noloco-rt worker` per name (name -> stage). `hosts`: name -> (command
    prefix, address), for workers each in its own network namespace (`ip netns exec NS`)."""
    # LOCAL_WORLD_SIZE: every worker of this machine, so a worker's memory budget is its share of a GPU.
    env = {**child_env(cfg, redis_url, workers=len(names)), "LOCAL_WORLD_SIZE": str(len(names)), **(extra_env or {})}
    specs = []
    for index, (name, stage) in enumerate(names.items()):
        prefix, address = (hosts or {}).get(name, ([], ""))
        # A namespace of our own: nobody else reaches it, so no CURVE keys are needed there.
        where = {"NOLOCO_NETWORK_BIND_HOST": address, "NOLOCO_NETWORK_ADVERTISE_HOST": address,
                 "NOLOCO_NETWORK_TRUSTED_NETWORK": "true"} if address else {}
        specs.append(ProcessSpec(name=name, env={**env, "LOCAL_RANK": str(index % cfg.pipeline.replicas), **where},
                                 args=(*prefix, *run_command(config_file, "worker", "--stage", str(stage), "--name",
                                                             name, "--metrics-port", "0"))))
    return specs
