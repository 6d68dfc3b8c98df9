"""The coordinator's observation cycles (docs/architecture.md §2): evaluate, measure spread, export;
and, once the run finishes, its final model.

Two cadences. Every eval_interval_s: one random live replica per stage is pulled, the
stages are chained into a model and scored on the validation batches. Every
spread_interval_s: a random sample of at most spread_sample live replicas per stage is
pulled (rate-bounded), the replica spread per stage is estimated from it with a 95%
interval (exact for a stage pulled whole) and the per-stage mean of the sample is
written as the consensus checkpoint. A sweep so costs O(stages · spread_sample) pulls,
whatever the number of replicas. A cycle that found nothing to pull (no live worker yet)
is tried again after RETRY_UNMEASURED_S, not a whole interval. The coordinator only reads:
killing it at any moment changes nothing for the workers, and a failed pull is replaced by
another member.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from coordinator.final_states import FINISH_CHECK_S, FinalStates
from coordinator.observations import EvalResult, ObserverStatus, SpreadResult, StageSample
from coordinator.pull import PulledReplica, SnapshotPuller
from coordinator.run_page import RunPage
from noloco_rt.algo.diagnostics import perplexity
from noloco_rt.config import Config
from noloco_rt.config.redaction import redact_url
from noloco_rt.consensus.scored import consensus_of_found, write_scored_consensus
from noloco_rt.evaluation import load_validation_batches, validation_loss
from noloco_rt.logs import EventLog
from noloco_rt.membership.progress import outer_kinds_by_stage
from noloco_rt.membership.records import MemberRecord
from noloco_rt.membership.table import Membership
from noloco_rt.model.staged import staged_model
from noloco_rt.store.backend import RunStore, StoreError
from noloco_rt.store.run_mark import finished_steps, run_is_over

if TYPE_CHECKING:
    from coordinator.server import CoordinatorMetrics
    from noloco_rt.curves.scalar_log import ScalarLog

PULL_ATTEMPTS_PER_STAGE = 3
RETRY_UNMEASURED_S = 1.0
"""A cycle that measured nothing is tried again this soon (its interval, if shorter)."""
SPARE_SPREAD_PULLS_PER_STAGE = 3
"""Failed spread pulls of a stage replaced by other members before its sample shrinks."""


class StageChain:
    """One module per stage, built once; loads pulled tensors and runs them in sequence."""

    def __init__(self, cfg: Config) -> None:
        model = staged_model(cfg)  # the preset, or your own (model.factory)
        self.stages = [model.build_stage(k) for k in range(cfg.pipeline.stages)]
        self.model = nn.Sequential(*self.stages)

    @torch.no_grad()
    def load(self, tensors_by_stage: Sequence[Sequence[torch.Tensor]]) -> nn.Module:
        for stage, tensors in zip(self.stages, tensors_by_stage, strict=True):
            for param, source in zip(stage.parameters(), tensors, strict=True):
                param.copy_(source)
        return self.model


class Observer:
    def __init__(self, cfg: Config, membership: Membership, puller: SnapshotPuller, *, out_dir: Path,
                 metrics: CoordinatorMetrics, log: EventLog, rng: random.Random | None = None, scalar_log: ScalarLog | None = None,
                 page: RunPage | None = None) -> None:
        self.cfg = cfg
        self.membership = membership
        self.puller = puller
        self.out_dir = out_dir
        self.metrics = metrics
        self.log = log
        self.rng = rng or random.Random()
        self.scalar_log = scalar_log
        """A noloco_rt.curves.scalar_log.ScalarLog for --tensorboard / --wandb, or None."""
        self.page = page
        """The live page's state (coordinator/run_page.py): it draws our measurements."""
        self.chain = StageChain(cfg)
        self.val_batches = load_validation_batches(cfg)
        self.status = ObserverStatus(run_id=cfg.run.run_id, started_at=time.time())
        self.final_states = FinalStates(cfg, membership, log)
        self._lock = threading.Lock()

    def status_json(self) -> dict[str, Any]:
        with self._lock:
            return self.status.to_json()

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> bool:
        """Observe until `stop` is set or the run finishes (then its final model is made: True).
        A cycle that fails is logged and retried next time."""
        c = self.cfg.coordinator
        next_eval = time.monotonic()
        next_spread = time.monotonic() + min(c.spread_interval_s, c.eval_interval_s)
        next_finish_check = time.monotonic()
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_finish_check:
                next_finish_check = now + FINISH_CHECK_S
                if run_is_over(finished_steps(self.cfg, self.membership, self.log), self.cfg.run.steps):
                    self._guarded(self.finalise, stop)
                    return True
            if now >= next_eval:
                measured = self._guarded(self.evaluate_once, stop)
                next_eval = time.monotonic() + next_cycle_s(c.eval_interval_s, measured)
            if time.monotonic() >= next_spread:
                measured = self._guarded(self.spread_once, stop)
                next_spread = time.monotonic() + next_cycle_s(c.spread_interval_s, measured)
            stop.wait(max(0.0, min(next_eval, next_spread, next_finish_check) - time.monotonic()))
        return False

    # -- the end: the run's model from its final states -----------------------------------------

    def finalise(self, stop: threading.Event) -> dict[str, Any] | None:
        """The run reached run.steps: its model, made once from every replica's final state in
        the store (workers write it before they mark the run finished), or without a store from
        the workers' checkpoints on this machine, scored, written to OUT/consensus.safetensors
        and the store, and reported (`final` in /status, the log). Where neither holds them, the
        last measurement's consensus stays, and the status says so and names the command that
        makes the final one."""
        path = self.out_dir / "consensus.safetensors"
        found = self.final_states.wait(stop)
        if found is None and stop.is_set():  # stopped meanwhile (`up` stops it once its workers are done)
            self.log.info("final_consensus_not_made", reason="stopped before the final states were read")
            return None
        if found is None:
            last = self.status.last_spread
            final = {"source": "last spread measurement", "step": last.step if last else None,
                     "val_loss": last.consensus_val_loss if last else None,
                     "consensus": str(path) if last else None}
            self._note("the run finished; its final states are neither in a store nor in this machine's "
                       "checkpoint folder: the consensus is the last measurement's. Make the final one from the "
                       "workers' checkpoints: noloco-rt consensus CHECKPOINT_OR_FOLDER... --config RUN.toml")
            self.log.warning("final_consensus_not_made", reason="no final states in a store or here", **final)
        else:
            scored = consensus_of_found(self.cfg, found, path, source="final states", where="the final states",
                                        val_batches=self.val_batches)
            self._copy_to_store(scored.path)
            final = {"source": "final states", **scored.to_json()}
            self._note("the run finished: its final model is written")
            self.metrics.val_loss.set(scored.val_loss)
            self._curves(scored.step, {"consensus_val_loss": scored.val_loss, "consensus_val_ppl": scored.val_ppl})
            self.log.info("final_consensus", step=scored.step, val_loss=round(scored.val_loss, 4),
                          val_ppl=round(scored.val_ppl, 3), replicas=scored.replicas_per_stage,
                          consensus=str(scored.path))
        with self._lock:
            self.status.final = final
        return final

    def _guarded(self, cycle: Any, stop: threading.Event) -> bool:
        """Run one cycle; whether it measured something (a failed one did not)."""
        try:
            return cycle(stop) is not None
        except Exception as exc:  # noqa: BLE001 - an observer bug must not take the status endpoint down
            self.log.exception("observer_cycle_failed", cycle=cycle.__name__)
            self.metrics.cycle_failures.inc()
            if self.page is not None:
                self.page.add_event("cycle_failed", f"{cycle.__name__} raised {type(exc).__name__}")
            return False

    def _members_by_stage(self) -> dict[int, list[MemberRecord]]:
        members = self.membership.live_members(stage=None)
        by_stage: dict[int, list[MemberRecord]] = {k: [] for k in range(self.cfg.pipeline.stages)}
        for member in members:
            if member.stage in by_stage:
                by_stage[member.stage].append(member)
        with self._lock:
            self.status.members_per_stage = {k: len(v) for k, v in by_stage.items()}
            self.status.outer_steps_by_stage = outer_kinds_by_stage(members)
            self.status.redis_available = self.membership.redis_available
        for stage, stage_members in by_stage.items():
            self.metrics.members.labels(stage=str(stage)).set(len(stage_members))
        return by_stage

    def _pull(self, member: MemberRecord, stop: threading.Event) -> PulledReplica | None:
        pulled = self.puller.pull(member, stop)
        ok = pulled is not None
        self.metrics.pulls.labels(result="ok" if ok else "failed").inc()
        with self._lock:
            if ok:
                self.status.pulls_ok += 1
            elif not stop.is_set():
                self.status.pulls_failed += 1
        return pulled

    def _curves(self, step: int, values: dict[str, float], *, suffix: str = "") -> None:
        if self.scalar_log is not None:
            self.scalar_log.scalars(step, values, suffix=suffix)

    def _note(self, text: str) -> None:
        with self._lock:
            self.status.note = text

    # -- evaluation: one replica per stage ----------------------------------------------------

    def evaluate_once(self, stop: threading.Event) -> EvalResult | None:
        by_stage = self._members_by_stage()
        chosen: list[PulledReplica] = []
        for stage, members in by_stage.items():
            candidates = self.rng.sample(members, k=min(len(members), PULL_ATTEMPTS_PER_STAGE))
            pulled = next((p for p in (self._pull(m, stop) for m in candidates) if p is not None), None)
            if pulled is None:
                self._note(f"no replica of stage {stage} could be pulled" if members
                           else f"waiting for a live worker of stage {stage}")
                return None
            chosen.append(pulled)
        model = self.chain.load([p.slow for p in chosen])
        loss = validation_loss(model, self.cfg, val_batches=self.val_batches)
        result = EvalResult(time=time.time(), step=run_step(chosen), val_loss=loss,
                            val_ppl=perplexity(loss), replicas={p.stage: p.name or p.worker_id[:8] for p in chosen})
        with self._lock:
            self.status.last_eval = result
            self.status.evaluations += 1
            self.status.note = ""
        self.metrics.val_loss.set(loss)
        self.metrics.val_ppl.set(result.val_ppl)
        self.metrics.eval_step.set(result.step)
        self._curves(result.step, {"val_loss": loss, "val_ppl": result.val_ppl})
        if self.page is not None:
            self.page.add_point("val_loss", result.step, loss)
        self.log.info("evaluated", step=result.step, val_loss=round(loss, 4), val_ppl=round(result.val_ppl, 3),
                      replicas=result.replicas)
        return result

    # -- spread and consensus: a bounded random sample per stage ----------------------------------

    def spread_once(self, stop: threading.Event) -> SpreadResult | None:
        samples: list[StageSample] = []
        for stage, members in self._members_by_stage().items():
            sample = self._pull_sample(members, stop)
            if not sample.pulled:
                self._note(f"spread: no replica of stage {stage} could be pulled")
                return None
            samples.append(sample)
        step = run_step([p for sample in samples for p in sample.pulled])
        scored = write_scored_consensus(self.out_dir / "consensus.safetensors", self.cfg,
                                        [[p.slow for p in sample.pulled] for sample in samples], step=step,
                                        source="coordinator", val_batches=self.val_batches,
                                        live_per_stage=[sample.live for sample in samples])
        self._copy_to_store(scored.path)
        result = SpreadResult.of(scored, pulls_per_stage=[sample.pulls for sample in samples])
        with self._lock:
            self.status.last_spread = result
            self.status.spread_measurements += 1
        self._export_spread_metrics(result)
        self._curves(step, {"spread": result.spread}, suffix="all")
        if self.page is not None:
            self.page.add_point("spread", step, result.spread)
        for stage, spread in enumerate(result.spread_by_stage):
            self._curves(step, {"spread": spread}, suffix=f"stage{stage}")
        self._curves(step, {"consensus_val_loss": scored.val_loss, "consensus_val_ppl": scored.val_ppl})
        self.log.info("spread_measured", step=step, spread=result.spread, low=result.spread_low,
                      high=result.spread_high, by_stage=result.spread_by_stage,
                      low_by_stage=result.spread_low_by_stage, high_by_stage=result.spread_high_by_stage,
                      replicas=result.replicas_per_stage, live=result.live_per_stage,
                      pulls=result.pulls_per_stage, consensus_val_loss=round(scored.val_loss, 4),
                      consensus=str(scored.path))
        return result

    def _copy_to_store(self, path: Path) -> None:
        """The consensus outlives this pod too: <store>/<run_id>/consensus.safetensors."""
        if not self.cfg.store.url:
            return
        target = f"{self.cfg.run.run_id}/consensus.safetensors"
        try:
            RunStore(self.cfg.store.url).write(target, path.read_bytes())
        except (OSError, StoreError) as exc:
            self._note(f"consensus not copied to the store {redact_url(self.cfg.store.url)}: {exc}")
            return
        self.log.info("consensus_stored", store=redact_url(self.cfg.store.url), path=target)

    def _pull_sample(self, members: list[MemberRecord], stop: threading.Event) -> StageSample:
        """Up to spread_sample members drawn without replacement and pulled (all of a smaller
        stage). A failed pull is replaced by another random member, SPARE_SPREAD_PULLS_PER_STAGE
        times at most, so one dead record does not shrink the sample."""
        wanted = self.cfg.coordinator.spread_sample
        candidates = self.rng.sample(members, k=min(len(members), wanted + SPARE_SPREAD_PULLS_PER_STAGE))
        pulled: list[PulledReplica] = []
        pulls = 0
        for member in candidates:
            if len(pulled) == wanted or stop.is_set():
                break
            pulls += 1
            replica = self._pull(member, stop)
            if replica is not None:
                pulled.append(replica)
        return StageSample(pulled=pulled, live=len(members), pulls=pulls)

    def _export_spread_metrics(self, result: SpreadResult) -> None:
        labelled = [("all", result.spread, result.spread_low, result.spread_high, sum(result.replicas_per_stage))]
        labelled += [(str(stage), *values) for stage, values in enumerate(zip(
            result.spread_by_stage, result.spread_low_by_stage, result.spread_high_by_stage,
            result.replicas_per_stage, strict=True))]
        for stage, spread, low, high, sampled in labelled:
            self.metrics.spread.labels(stage=stage).set(spread)
            self.metrics.spread_low.labels(stage=stage).set(low)
            self.metrics.spread_high.labels(stage=stage).set(math.inf if high is None else high)
            self.metrics.spread_sampled.labels(stage=stage).set(sampled)
        self.metrics.consensus_writes.inc()


def next_cycle_s(interval_s: float, measured: bool) -> float:
    """When to run a cycle again: after its interval, or soon when it measured nothing (no
    live worker yet, no state to pull): started before its workers, the coordinator would
    otherwise wait a whole interval for its first figure, and a short run end unmeasured."""
    return interval_s if measured else min(interval_s, RETRY_UNMEASURED_S)


def run_step(pulled: list[PulledReplica]) -> int:
    """The run's step for what was pulled: the least inner step of stage 0, whose replicas all
    consume the same data per step (a later stage's replicas count unequal shares of it)."""
    first = [p.inner_steps for p in pulled if p.stage == 0]
    return min(first or [p.inner_steps for p in pulled])
