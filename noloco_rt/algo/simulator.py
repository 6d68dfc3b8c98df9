"""In-process simulation of R replicas × S stages with random pipeline routing.

Every inner step, each stage-0 replica feeds its own data shard; each microbatch
hops to a replica of the next stage chosen by the routing policy, and backward
retraces that exact route (autograd through the chained modules). Every H inner
steps each stage takes the outer step with groups drawn within the stage (ddp
instead averages gradients over the stage every step). Evaluation routes r → r.
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
from noloco_rt.algo.optim import OuterCoefficients, average_gradients
from noloco_rt.algo.replica import StageReplica
from noloco_rt.algo.routing import draw_groups, route_next_hop
from noloco_rt.config import Config, config_to_toml
from noloco_rt.data import ShardedBatches, load_corpus, validation_batches
from noloco_rt.model import lm_loss


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

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class RouteStats:
    """Microbatches each replica of each stage received (routing sanity)."""

    received: list[list[int]] = field(default_factory=list)


class Simulation:
    def __init__(self, cfg: Config, *, corpus=None) -> None:
        self.cfg = cfg
        self.outer = cfg.outer.resolved()
        self.coeffs = OuterCoefficients.from_config(self.outer)
        stages, replicas = cfg.pipeline.stages, cfg.pipeline.replicas
        self.corpus = corpus or load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
        self.shards = [ShardedBatches(self.corpus.train, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size,
                                      shard=r, num_shards=replicas, seed=cfg.run.seed) for r in range(replicas)]
        self.val_batches = validation_batches(self.corpus.val, seq_len=cfg.model.seq_len,
                                              batch_size=cfg.data.batch_size, count=cfg.run.eval_batches)
        self.replicas = [[StageReplica.create(cfg, s) for _ in range(replicas)] for s in range(stages)]
        self.rng = random.Random(cfg.run.seed)
        self.route_stats = RouteStats(received=[[0] * replicas for _ in range(stages)])
        self.outer_steps = 0
        self.tokens = 0
        self.step = 0

    # -- training -----------------------------------------------------------------------

    def _route(self, origin: int, load: list[list[int]]) -> list[int]:
        """Replica index at every stage for one microbatch that starts at stage-0 replica `origin`."""
        path = [origin]
        for stage in range(1, self.cfg.pipeline.stages):
            candidates = [(j, load[stage][j]) for j in range(self.cfg.pipeline.replicas)]
            path.append(route_next_hop(candidates, self.rng, self.cfg.routing.policy))
        return path

    def _forward_backward(self, path: list[int], inputs: torch.Tensor, targets: torch.Tensor) -> float:
        hidden = inputs
        for stage, index in enumerate(path):
            hidden = self.replicas[stage][index].module(hidden)
        loss = lm_loss(hidden, targets)
        loss.backward()  # retraces the forward route through exactly these replicas
        for stage, index in enumerate(path):
            self.replicas[stage][index].record_microbatch()
            self.route_stats.received[stage][index] += 1
        return float(loss.detach())

    def train_step(self) -> float:
        """One inner step for every replica; returns the mean training loss."""
        stages, replicas = self.cfg.pipeline.stages, self.cfg.pipeline.replicas
        load = [[0] * replicas for _ in range(stages)]
        losses = []
        for origin in range(replicas):
            for _ in range(self.cfg.data.microbatches):
                inputs, targets = self.shards[origin].next_batch()
                path = self._route(origin, load)
                for stage, index in enumerate(path):
                    load[stage][index] += 1
                losses.append(self._forward_backward(path, inputs, targets))
                self.tokens += inputs.numel()
        if self.outer.method == "ddp":
            total = replicas * self.cfg.data.microbatches
            for stage_replicas in self.replicas:
                average_gradients([r.parameters for r in stage_replicas], [1.0 / total] * replicas)
                for replica in stage_replicas:
                    replica.finish_inner_step(grads_are_means=True)
        else:
            for stage_replicas in self.replicas:
                for replica in stage_replicas:
                    if replica.has_gradients():  # a replica no microbatch reached does not step
                        replica.finish_inner_step()
        self.step += 1
        if self.outer.method != "ddp" and self.step % self.outer.h == 0:
            self.outer_step()
        return sum(losses) / len(losses)

    def outer_step(self) -> None:
        theta_only = self.coeffs.theta_shortcut
        for stage_replicas in self.replicas:
            groups = draw_groups(len(stage_replicas), self.outer.method, self.outer.group_size, self.rng)
            # Every member contributes its state from before this round: snapshot first, then update.
            states = [r.outer_state(theta_only=theta_only) for r in stage_replicas]
            for replica, members in zip(stage_replicas, groups, strict=True):
                replica.apply_outer_step([states[j] for j in members[1:]], self.coeffs)
        self.outer_steps += 1

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
                losses.append(float(lm_loss(hidden, targets)))
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
                          elapsed_s=time.monotonic() - started)


def run_simulation(cfg: Config, out_dir: Path, *, on_progress: Callable[[int, EvalRecord | None], None] | None = None,
                   corpus=None) -> list[EvalRecord]:
    """Train, evaluate every run.eval_every steps and at the end, and write
    out_dir/{config.toml, metrics.jsonl, curves.png}. metrics.jsonl is appended and
    flushed per evaluation, so an interrupted run keeps what it measured."""
    from noloco_rt.plots import plot_curves

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.toml").write_text(config_to_toml(cfg))
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
            record(None)
            while sim.step < cfg.run.steps:
                train_losses.append(sim.train_step())
                rec = None
                if sim.step % cfg.run.eval_every == 0 or sim.step == cfg.run.steps:
                    rec = record(sum(train_losses) / len(train_losses))
                    train_losses.clear()
                if on_progress is not None:
                    on_progress(sim.step, rec)
        finally:
            if len(records) > 1:
                plot_curves(records_as_dicts(records), out_dir / "curves.png",
                            title=f"{cfg.outer.method}: {cfg.pipeline.stages} stages × {cfg.pipeline.replicas} replicas")
    return records


def records_as_dicts(records: list[EvalRecord]) -> list[dict[str, Any]]:
    return [dict(r.__dict__) for r in records]
