"""How much disk and memory the pods need and how long they may take, from the run's config.

The arithmetic is pure (parameter counts and config values in, numbers out) so tests can
check it by hand; `sizing_from_config` only counts the stages' parameters (on torch's meta
device: shapes without memory) and feeds them in. docs/deploy.md ("Sizing the pods")
explains each rule. A worker's memory is the memory plan's (noloco_rt.memory.plan).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from noloco_rt.consensus.file import stage_parameter_shapes
from noloco_rt.memory.fit import choose, plan_settings
from noloco_rt.memory.plan import StageMemory, plan

# The worker's own deadlines (stage_timeouts), so probes and the worker cannot disagree on them.
from noloco_rt.transfer_time import StageTimeouts, stage_timeouts, transfer_s

if TYPE_CHECKING:
    from noloco_rt.config import Config, WorkerConfig

FP32_BYTES = 4
# A stage checkpoint holds five fp32 tensors per parameter: slow and fast weights, outer
# momentum, and Adam's two moments.
CHECKPOINT_TENSORS = 5
GIB = 1024**3
SCRATCH_BYTES = GIB  # logs, metrics and the alive file beside the checkpoints
STORE_HEADROOM = 1.25  # a filesystem is slow when full; sizes also round up to whole GiB
# Beyond waiting for Redis and downloading state: importing torch, initialising CUDA,
# building the stage and its first inner step.
STARTUP_SLACK_S = 180
ALIVE_STALE_FLOOR_S = 120  # the loop touches the file about once a second
PROBE_PERIOD_S = 10
# A worker's host memory beyond the plan's tensors: the interpreter, torch's libraries and, on
# a GPU node, the CUDA runtime's host side; and a margin for allocator fragmentation.
PROCESS_OVERHEAD_BYTES = {"gpu": 3 * GIB, "cpu": 1 * GIB}
MEMORY_HEADROOM = 1.25


def checkpoint_bytes(stage_params: int) -> int:
    return stage_params * FP32_BYTES * CHECKPOINT_TENSORS


def store_bytes(stage_params: Sequence[int], *, keep: int) -> int:
    """store.keep checkpoints per stage plus the one being written, and the consensus
    (fp32 weights of the whole model) plus its temporary copy, with headroom."""
    checkpoints = (keep + 1) * sum(checkpoint_bytes(n) for n in stage_params)
    consensus = 2 * sum(stage_params) * FP32_BYTES
    return math.ceil((checkpoints + consensus) * STORE_HEADROOM)


def worker_ephemeral_bytes(stage_params: int, *, keep: int = 1) -> int:
    """The worker.checkpoint_keep local checkpoints under paths.checkpoint_dir and the
    temporary copy of the one being written (one write at a time)."""
    return (keep + 1) * checkpoint_bytes(stage_params) + SCRATCH_BYTES


def coordinator_ephemeral_bytes(model_params: int) -> int:
    """The coordinator's consensus under --out and its temporary copy."""
    return 2 * model_params * FP32_BYTES + SCRATCH_BYTES


def startup_budget_s(stage_params: int, timeouts: StageTimeouts, *, mbit_s: float, redis_wait_s: float) -> float:
    """Worst case from container start to the first touch of the alive file: Redis comes up
    last, the worker's whole search for a donor times out (timeouts.bootstrap_s, which allows
    two pulls), then the stage's durable checkpoint is read."""
    return (redis_wait_s + timeouts.bootstrap_s + transfer_s(checkpoint_bytes(stage_params), mbit_s)
            + STARTUP_SLACK_S)


def alive_stale_s(exchange_deadline: float) -> int:
    """Age of the alive file that means a hung loop: twice the longest wait the loop makes."""
    return math.ceil(max(ALIVE_STALE_FLOOR_S, 2 * exchange_deadline))


def probe_failures(budget_s: float, period_s: int = PROBE_PERIOD_S) -> int:
    """failureThreshold that gives a probe at least `budget_s` seconds."""
    return max(1, math.ceil(budget_s / period_s))


def gib_quantity(n_bytes: int) -> str:
    """A Kubernetes quantity in whole GiB, rounded up (at least 1Gi)."""
    return f"{max(1, math.ceil(n_bytes / GIB))}Gi"


def worker_memory_bytes(stages: Sequence[StageMemory], *, gpu: bool) -> int:
    """A worker pod's memory request and limit: its host memory in the plan (on a GPU node the
    exchange's host copies and the wire copies; on the CPU everything) with headroom, plus the
    process itself, for the hungriest stage."""
    tensors = max(stage.host if gpu else stage.peak for stage in stages)
    return math.ceil(tensors * MEMORY_HEADROOM) + PROCESS_OVERHEAD_BYTES["gpu" if gpu else "cpu"]


@dataclass(frozen=True)
class PodSizing:
    store: str
    worker_memory: str
    worker_ephemeral: str
    coordinator_ephemeral: str
    startup_failures: int
    alive_stale_s: int


def sizing(stage_params: Sequence[int], worker: WorkerConfig, *, keep: int, memory: Sequence[StageMemory],
           gpu: bool) -> PodSizing:
    """Every size and threshold of the manifests, for stages of `stage_params` parameters
    run by workers configured as `worker`, whose memory plan is `memory`."""
    largest = max(stage_params)
    timeouts = stage_timeouts(largest, worker)
    budget = startup_budget_s(largest, timeouts, mbit_s=worker.min_bandwidth_mbit_s,
                              redis_wait_s=worker.redis_wait_s)
    return PodSizing(
        store=gib_quantity(store_bytes(stage_params, keep=keep)),
        worker_memory=gib_quantity(worker_memory_bytes(memory, gpu=gpu)),
        worker_ephemeral=gib_quantity(worker_ephemeral_bytes(largest, keep=worker.checkpoint_keep)),
        coordinator_ephemeral=gib_quantity(coordinator_ephemeral_bytes(sum(stage_params))),
        startup_failures=probe_failures(budget),
        alive_stale_s=alive_stale_s(timeouts.exchange_s),
    )


def stage_param_counts(cfg: Config) -> list[int]:
    """Parameters of each stage of the run's model (exact: the model's own modules)."""
    return [sum(math.prod(shape) for _, shape in stage_parameter_shapes(cfg, stage))
            for stage in range(cfg.pipeline.stages)]


def memory_plan_of(cfg: Config, *, gpu: bool) -> list[StageMemory]:
    """The run's memory plan as its workers will run it: explicit settings kept, 0 in flight
    and auto checkpointing as on a device with no budget given (4, off), the most a worker
    may pick; the host share hardly depends on them anyway."""
    device = "cuda" if gpu else "cpu"
    choice = choose(cfg, device_type=device, budget_bytes=None)
    return plan(plan_settings(cfg, device_type=device, max_inflight=choice.max_inflight,
                              activation_checkpointing=choice.activation_checkpointing))


def sizing_from_config(cfg: Config, *, gpu: bool) -> PodSizing:
    return sizing(stage_param_counts(cfg), cfg.worker, keep=cfg.store.keep, memory=memory_plan_of(cfg, gpu=gpu),
                  gpu=gpu)
