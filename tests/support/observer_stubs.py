"""A coordinator's observer over stand-in members and a counting puller: no workers, no Redis."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from types import SimpleNamespace

import structlog
import torch

from coordinator.observer import Observer
from coordinator.pull import PulledReplica
from coordinator.server import CoordinatorMetrics
from noloco_rt.config import load_config
from noloco_rt.consensus.file import stage_parameter_shapes


class FixedMembership:
    redis_available = True

    def __init__(self, members: list[SimpleNamespace]) -> None:
        self.members = members

    def live_members(self, stage: int | None = None) -> list[SimpleNamespace]:
        return [m for m in self.members if stage is None or m.stage == stage]

    def run_finished_steps(self) -> int | None:
        return None  # the run goes on


class CountingPuller:
    """Serves each member's own slow weights and records every pull; `failing` names never answer."""

    def __init__(self, weights: dict[str, list[torch.Tensor]], failing: frozenset[str] = frozenset()) -> None:
        self.weights = weights
        self.failing = failing
        self.pulled: list[str] = []

    def pull(self, member: SimpleNamespace, stop: threading.Event) -> PulledReplica | None:
        self.pulled.append(member.name)
        if member.name in self.failing:
            return None
        return PulledReplica(worker_id=member.name, name=member.name, stage=member.stage,
                             slow=self.weights[member.name], inner_steps=10, outer_steps=2, checksum="-")


def observed_stages(tmp_path: Path, counts: dict[int, int], *, sample: int, seed: int,
                    failing: frozenset[str] = frozenset()) -> tuple[Observer, CountingPuller]:
    cfg = load_config(environ={}, overrides=[{"pipeline": {"stages": len(counts)}, "run": {"eval_batches": 1},
                                              "coordinator": {"spread_sample": sample}}])
    generator = torch.Generator().manual_seed(seed)
    members = [SimpleNamespace(name=f"s{stage}-{i}", stage=stage) for stage, count in counts.items()
               for i in range(count)]
    weights = {m.name: [torch.randn(shape, generator=generator) for _, shape in stage_parameter_shapes(cfg, m.stage)]
               for m in members}
    puller = CountingPuller(weights, failing)
    observer = Observer(cfg, FixedMembership(members), puller, out_dir=tmp_path, metrics=CoordinatorMetrics(),
                        log=structlog.get_logger("test"), rng=random.Random(seed))
    return observer, puller

