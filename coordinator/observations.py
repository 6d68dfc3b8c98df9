"""What the coordinator measured and shows: an evaluation, a spread measurement, the sample
it was made from, and its /status record."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from coordinator.pull import PulledReplica
from noloco_rt.algo.spread_sample import finite_or_none
from noloco_rt.consensus.scored import ScoredConsensus


@dataclass
class EvalResult:
    time: float
    step: int
    """Lowest inner step among the replicas used (they are pulled at slightly different times)."""
    val_loss: float
    val_ppl: float
    replicas: dict[int, str]


@dataclass
class SpreadResult:
    time: float
    step: int
    spread: float
    """Over all stages: exact when every live replica was pulled, else an estimate."""
    spread_low: float
    spread_high: float | None
    """The 95% interval of spread; None: unbounded (fewer than 3 replicas of a larger stage)."""
    spread_by_stage: list[float]
    spread_low_by_stage: list[float]
    spread_high_by_stage: list[float | None]
    replicas_per_stage: list[int]
    """Replicas pulled and averaged per stage: the sample."""
    live_per_stage: list[int]
    """Live replicas per stage the sample was drawn from."""
    pulls_per_stage: list[int]
    """Pulls made per stage this cycle (failed ones included)."""
    consensus_val_loss: float | None
    consensus_path: str | None

    @classmethod
    def of(cls, scored: ScoredConsensus, pulls_per_stage: list[int]) -> SpreadResult:
        stages = scored.stage_estimates
        return cls(time=time.time(), step=scored.step, spread=scored.spread, spread_low=scored.estimate.low,
                   spread_high=finite_or_none(scored.estimate.high), spread_by_stage=scored.spread_by_stage,
                   spread_low_by_stage=[e.low for e in stages],
                   spread_high_by_stage=[finite_or_none(e.high) for e in stages],
                   replicas_per_stage=scored.replicas_per_stage, live_per_stage=scored.replicas_live,
                   pulls_per_stage=pulls_per_stage, consensus_val_loss=scored.val_loss,
                   consensus_path=str(scored.path))


@dataclass
class StageSample:
    """The replicas of one stage pulled for a spread measurement."""

    pulled: list[PulledReplica]
    live: int
    """Live members of the stage when the sample was drawn."""
    pulls: int
    """Pulls made, failed ones included."""


@dataclass
class ObserverStatus:
    run_id: str
    started_at: float
    members_per_stage: dict[int, int] = field(default_factory=dict)
    outer_steps_by_stage: dict[int, dict[str, int]] = field(default_factory=dict)
    """Outer steps by kind (matched, partial, local, dropped_late, failed) over the stage's live members."""
    redis_available: bool = True
    pulls_ok: int = 0
    pulls_failed: int = 0
    evaluations: int = 0
    spread_measurements: int = 0
    last_eval: EvalResult | None = None
    last_spread: SpreadResult | None = None
    final: dict[str, Any] | None = None
    """The run's model once it finished (run.steps reached): scored, where it was written and
    what it was made of; None while the run goes on."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["uptime_s"] = round(time.time() - self.started_at, 1)
        return data
