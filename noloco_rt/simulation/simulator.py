"""In-process simulation of R replicas × S stages with random pipeline routing.

Every inner step, each stage-0 replica feeds its own data shard; each microbatch (or,
with balanced-sequence routing, each sequence) takes a path through the stages drawn
by routing.simulation, and backward retraces that exact route (autograd through the
chained modules). Balanced routing gives every replica the same share every step, so
every replica takes every inner step. Every H inner steps each stage takes the outer
step with groups drawn within the stage (ddp instead averages gradients over the stage
every step; adam takes no outer step). What a replica contributes reaches its partners
through worker.snapshot_codec, as a worker would send it. Evaluation routes r → r.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from noloco_rt.algo.diagnostics import perplexity, replica_spread
from noloco_rt.algo.optim import average_gradients
from noloco_rt.algo.replica import StageReplica
from noloco_rt.config import Config, config_to_toml
from noloco_rt.consensus.file import mean_over_replicas, save_consensus
from noloco_rt.curves.png import plot_curves
from noloco_rt.data import ShardedBatches, load_corpus, validation_batches
from noloco_rt.evaluation import load_validation_batches
from noloco_rt.model.init_weights import initial_replica
from noloco_rt.model.staged import CountedBatches, staged_model
from noloco_rt.outer.correction import correction_term
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState
from noloco_rt.outer.matching import draw_groups, step_rng
from noloco_rt.simulation.lossy_exchange import stage_round
from noloco_rt.simulation.paths import random_peers
from noloco_rt.simulation.step_routes import Hop, StepPlan, plan_step
from noloco_rt.simulation.wire import through_wire

# Methods whose replicas never take an outer step: ddp averages gradients every step
# instead; adam is plain Adam per replica (the authors' "local" baseline).
NO_OUTER_STEP = ("ddp", "adam")


@dataclass
class EvalRecord:
    step: int
    val_loss: float
    val_ppl: float
    spread: float
    spread_by_stage: list[float]
    lr: float
    train_loss: float | None
    outer_steps: int
    tokens: int
    elapsed_s: float
    routing: str
    """The simulator's routing (routing.simulation)."""
    inner_steps: list[list[int]]
    """Inner steps each replica has taken, per stage, per replica: all equal to `step`
    unless a replica skipped steps (p2c / random routing, or a non-finite gradient)."""
    exchange_raw_bytes: int = 0
    """float32 bytes of the outer-step states the replicas sent so far (what an uncompressed
    exchange carries)."""
    exchange_wire_bytes: int = 0
    """Bytes the codecs put on the wire for them."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class RouteStats:
    """Per stage, per replica: forward passes run (microbatches, or per-sequence sub-batches)
    and sequences processed, over the whole run (routing sanity)."""

    received: list[list[int]] = field(default_factory=list)
    sequences: list[list[int]] = field(default_factory=list)


class Simulation:
    def __init__(self, cfg: Config, *, corpus=None, count_bytes: bool = True) -> None:
        self.cfg = cfg
        self.outer = cfg.outer.resolved()
        self.coeffs = OuterCoefficients.from_config(self.outer)
        stages, replicas = cfg.pipeline.stages, cfg.pipeline.replicas
        self.model = staged_model(cfg)  # the preset, or your own (model.factory)
        self.shards: list[ShardedBatches] | list[CountedBatches]
        if self.model.train_batches is not None:  # your own model's data: a stream per replica
            self.shards = [CountedBatches(self.model.train_batches, seed=cfg.run.seed * 1_000_003 + r)
                           for r in range(replicas)]
            self.val_batches = load_validation_batches(cfg)
        else:
            self.corpus = corpus or load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
            self.shards = [ShardedBatches(self.corpus.train, seq_len=cfg.model.seq_len,
                                          batch_size=cfg.data.batch_size, shard=r, num_shards=replicas,
                                          seed=cfg.run.seed) for r in range(replicas)]
            self.val_batches = validation_batches(self.corpus.val, seq_len=cfg.model.seq_len,
                                                  batch_size=cfg.data.batch_size, count=cfg.run.eval_batches)
        self.replicas = [[initial_replica(cfg, s, model=self.model) for _ in range(replicas)] for s in range(stages)]
        self.group_rng = random.Random(cfg.run.seed)  # outer-step groups; routing is seeded per step
        self.route_stats = RouteStats(received=[[0] * replicas for _ in range(stages)],
                                      sequences=[[0] * replicas for _ in range(stages)])
        self.outer_steps = 0
        self.tokens = 0
        self.step = 0
        self.count_bytes = count_bytes
        self.exchange_bytes = [0, 0]
        """(float32 bytes of the whole states sent, bytes on the wire) over the run, when counted."""
        self.pending_corrections: list[tuple[int, Callable[[], None]]] = []
        """With outer.overlap: (inner step due, what applies the correction) not applied yet."""
        if cfg.worker.delta_codec and cfg.outer.overlap_correction == "deferred":
            raise ValueError("worker.delta_codec takes its local step when it sends: outer.overlap_correction "
                             "= \"deferred\" does not apply")
        if cfg.outer.overlap and cfg.outer.simulated_delay_steps >= self.outer.h:
            raise ValueError(f"outer.simulated_delay_steps ({cfg.outer.simulated_delay_steps}) must be below "
                             f"h ({self.outer.h}): a correction arrives before the next outer step")

    # -- training -----------------------------------------------------------------------

    def _forward_backward(self, hop: Hop, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        hidden = inputs
        for stage, index in enumerate(hop.path):
            if stage > 0 and self.cfg.pipeline.simulate_wire_dtype:  # the hop from the stage before
                hidden = through_wire(hidden, self.cfg.pipeline.wire_dtype, self.cfg.pipeline.gradient_wire_dtype)
            hidden = self.replicas[stage][index].module(hidden)
        loss = self.model.loss(hidden.float(), targets)
        (loss * hop.loss_weight).backward()  # retraces the forward route through exactly these replicas
        for stage, index in enumerate(hop.path):
            self.replicas[stage][index].record_microbatch()
            self.route_stats.received[stage][index] += 1
            self.route_stats.sequences[stage][index] += len(hop.rows)
        return float(loss.detach())

    def step_plan(self) -> StepPlan:
        """The routes of the coming inner step: a function of (run seed, step) alone."""
        cfg = self.cfg
        return plan_step(cfg.routing.simulation, replicas=cfg.pipeline.replicas, stages=cfg.pipeline.stages,
                         microbatches=cfg.pipeline.microbatches_per_step, batch_size=cfg.data.batch_size,
                         rng=step_rng(cfg.run.seed, self.step, "route"), sites=cfg.routing.sites,
                         far_share=cfg.routing.far_share)

    def accumulate(self, plan: StepPlan) -> float:
        """Every pass of `plan`, gradients summed into the replicas it crossed; returns the
        mean training loss over sequences."""
        per_step = self.cfg.pipeline.microbatches_per_step
        batches = [[shard.next_batch() for _ in range(per_step)] for shard in self.shards]
        loss_sum, rows_seen = 0.0, 0
        for hop in plan.hops:
            inputs, targets = batches[hop.origin][hop.microbatch]
            if len(hop.rows) < inputs.shape[0]:  # per-sequence routing: this path's sub-batch
                rows = torch.tensor(hop.rows)
                inputs, targets = inputs[rows], targets[rows]
            loss_sum += self._forward_backward(hop, inputs, targets) * len(hop.rows)
            rows_seen += len(hop.rows)
            self.tokens += inputs.numel()
        return loss_sum / rows_seen

    def train_step(self) -> float:
        """One inner step for every replica, then the outer step when one is due; returns the
        mean training loss over sequences."""
        loss = self.inner_step()
        self._apply_due_corrections()
        if self.outer.method not in NO_OUTER_STEP and self.step % self.outer.h == 0:
            self.outer_step()
        return loss

    def inner_step(self) -> float:
        """One inner step for every replica and nothing else (no outer step even when due);
        returns the mean training loss over sequences."""
        plan = self.step_plan()
        loss = self.accumulate(plan)
        self._inner_steps(plan.grads_are_means)
        self.step += 1
        return loss

    def _inner_steps(self, grads_are_means: bool) -> None:
        if self.outer.method == "ddp":  # all-reduce: every replica steps on the stage's mean gradient
            replicas = self.cfg.pipeline.replicas
            weight = 1.0 / (replicas if grads_are_means else replicas * self.cfg.pipeline.microbatches_per_step)
            for stage_replicas in self.replicas:
                average_gradients([r.parameters for r in stage_replicas], [weight] * replicas)
                for replica in stage_replicas:
                    replica.finish_inner_step(grads_are_means=True)
            return
        for stage_replicas in self.replicas:
            for replica in stage_replicas:
                if replica.has_gradients():  # p2c / random: a replica no microbatch reached does not step
                    replica.finish_inner_step(grads_are_means=grads_are_means)

    def _groups(self, count: int) -> list[list[int]]:
        """members[i] (i first) of every replica of a stage at this outer step."""
        if self.cfg.outer.pairing == "random-peer":
            return random_peers(count, self.group_rng)
        return draw_groups(count, self.outer.method, self.outer.group_size, self.group_rng)

    def outer_step(self) -> None:
        for stage, stage_replicas in enumerate(self.replicas):
            groups = self._groups(len(stage_replicas))
            # Every member contributes its state from before this round: snapshot first, then
            # update. Partners get it through the codecs, as workers send it (lossy_exchange.py).
            sent = stage_round(stage_replicas, {j for members in groups if len(members) > 1 for j in members},
                               self.cfg.worker, self.coeffs, seed=self.cfg.run.seed, stage=stage,
                               outer_step=self.outer_steps, count_bytes=self.count_bytes)
            self.exchange_bytes[0] += sent.raw_bytes
            self.exchange_bytes[1] += sent.wire_bytes
            for replica, members in zip(stage_replicas, groups, strict=True):
                partners = [sent.states[j] for j in members[1:]]
                own = sent.states[members[0]]
                if sent.local_steps_taken:  # worker.delta_codec: the correction is what is left
                    if partners:
                        self._correct_later(replica, correction_term(own, partners, self.coeffs))
                elif self.cfg.outer.overlap and self.cfg.outer.simulated_delay_steps > 0:
                    self._overlapped_outer_step(replica, own, partners)
                elif partners and sent.symmetric:  # the blocking step, own state as sent
                    replica.provisional_outer_step(self.coeffs)
                    replica.correct_outer_step(correction_term(own, partners, self.coeffs))
                else:  # the blocking step
                    replica.apply_outer_step(partners, self.coeffs)
        self.outer_steps += 1
        self._apply_due_corrections()

    def _correct_later(self, replica: StageReplica, correction: list[torch.Tensor]) -> None:
        """A correction at once (blocking), or simulated_delay_steps inner steps later (overlap)."""
        if not self.cfg.outer.overlap or self.cfg.outer.simulated_delay_steps == 0:
            replica.correct_outer_step(correction)
            return
        due = self.step + self.cfg.outer.simulated_delay_steps
        self.pending_corrections.append((due, lambda: replica.correct_outer_step(correction)))

    def _overlapped_outer_step(self, replica: StageReplica, own: PeerOuterState,
                               partners: list[PeerOuterState]) -> None:
        """The partners' states "arrive" simulated_delay_steps inner steps later: the local step
        now and its correction then (provisional), or the whole step then (deferred). `own`:
        our contribution as partners decode it (a lossy codec's error cancels in the pair)."""
        due = self.step + self.cfg.outer.simulated_delay_steps
        if self.cfg.outer.overlap_correction == "deferred":
            fast_at_step = [t.clone() for t in replica.fast]
            correction = correction_term(own, partners, self.coeffs) if partners else None
            self.pending_corrections.append(
                (due, lambda: replica.deferred_outer_step(fast_at_step, correction, self.coeffs)))
            return
        replica.provisional_outer_step(self.coeffs)
        if partners:
            correction = correction_term(own, partners, self.coeffs)
            self.pending_corrections.append((due, lambda: replica.correct_outer_step(correction)))

    def finish(self) -> None:
        """Training is over: the corrections still on their way are applied now, as a worker's
        last outer step is settled before it exits (workers/outer/step.py, finish), so that the
        final weights are the group step's, not the provisional local one's."""
        pending, self.pending_corrections = self.pending_corrections, []
        for _, apply in pending:
            apply()

    def _apply_due_corrections(self) -> None:
        """Corrections whose partners' states have arrived, at this inner-step boundary."""
        due = [p for p in self.pending_corrections if p[0] <= self.step]
        self.pending_corrections = [p for p in self.pending_corrections if p[0] > self.step]
        for _, apply in due:
            apply()

    # -- evaluation ---------------------------------------------------------------------

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean validation loss over replicas, each routed r → r → … through the stages."""
        totals = []
        for r in range(self.cfg.pipeline.replicas):
            losses = []
            for inputs, targets in self.val_batches:
                hidden = inputs
                for stage_replicas in self.replicas:
                    hidden = stage_replicas[r].module(hidden)
                losses.append(float(self.model.loss(hidden.float(), targets)))
            totals.append(sum(losses) / len(losses))
        return sum(totals) / len(totals)

    def spreads(self) -> tuple[float, list[float]]:
        by_stage = [replica_spread([r.fast for r in stage_replicas]) for stage_replicas in self.replicas]
        pooled = replica_spread([[t for stage in self.replicas for t in stage[r].fast]
                                 for r in range(self.cfg.pipeline.replicas)])
        return pooled, by_stage

    def evaluate(self, train_loss: float | None, started: float) -> EvalRecord:
        val_loss = self.validation_loss()
        pooled, by_stage = self.spreads()
        return EvalRecord(step=self.step, val_loss=val_loss, val_ppl=perplexity(val_loss), spread=pooled,
                          spread_by_stage=by_stage, lr=self.replicas[0][0].inner.current_lr(),
                          train_loss=train_loss, outer_steps=self.outer_steps, tokens=self.tokens,
                          elapsed_s=time.monotonic() - started, routing=self.cfg.routing.simulation,
                          inner_steps=self.inner_steps(), exchange_raw_bytes=self.exchange_bytes[0],
                          exchange_wire_bytes=self.exchange_bytes[1])

    def inner_steps(self) -> list[list[int]]:
        return [[r.inner.steps_taken for r in stage_replicas] for stage_replicas in self.replicas]


def run_simulation(cfg: Config, out_dir: Path, *, on_progress: Callable[[int, EvalRecord | None], None] | None = None,
                   corpus=None) -> list[EvalRecord]:
    """Train, evaluate every run.eval_every steps and at the end, and write
    out_dir/{config.toml, metrics.jsonl, curves.png}, and at the end consensus.safetensors
    (each stage's mean slow weights: what eval, sample and export read). metrics.jsonl is
    appended and flushed per evaluation, so an interrupted run keeps what it measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.toml").write_text(config_to_toml(cfg, redact=True))  # a run's files hold no secret
    sim = Simulation(cfg, corpus=corpus)
    records: list[EvalRecord] = []
    started = time.monotonic()
    train_losses: list[float] = []
    metrics_path = out_dir / "metrics.jsonl"
    with metrics_path.open("w") as metrics:
        def record(train_loss: float | None) -> EvalRecord:
            rec = sim.evaluate(train_loss, started)
            records.append(rec)
            metrics.write(rec.to_json() + "\n")
            metrics.flush()
            return rec

        try:
            initial = record(None)
            if on_progress is not None:  # the untrained baseline is a point of the curves too
                on_progress(0, initial)
            while sim.step < cfg.run.steps:
                train_losses.append(sim.train_step())
                if sim.step == cfg.run.steps:
                    sim.finish()
                rec = None
                if sim.step % cfg.run.eval_every == 0 or sim.step == cfg.run.steps:
                    rec = record(sum(train_losses) / len(train_losses))
                    train_losses.clear()
                if on_progress is not None:
                    on_progress(sim.step, rec)
            save_consensus(out_dir / "consensus.safetensors", cfg,
                           [mean_over_replicas([r.slow for r in stage]) for stage in sim.replicas],
                           metadata={"step": str(sim.step), "source": "simulate"})
        finally:
            if len(records) > 1:
                outer = cfg.outer.resolved()
                plot_curves(records_as_dicts(records), out_dir / "curves.png",
                            title=f"{cfg.outer.method}: {cfg.pipeline.stages} stages × {cfg.pipeline.replicas} replicas",
                            outer_every=0 if outer.method in NO_OUTER_STEP else outer.h)
    return records


def records_as_dicts(records: list[EvalRecord]) -> list[dict[str, Any]]:
    return [dict(r.__dict__) for r in records]
