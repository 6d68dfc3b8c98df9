"""The training state of one replica of one stage: what a worker holds.

Fast weights θ are the module's parameters; slow weights φ and outer momentum δ
live beside them; the inner optimizer's state stays local. The simulator and the
distributed worker both drive a StageReplica.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from noloco_rt.algo.optim import InnerOptimizer
from noloco_rt.config import Config
from noloco_rt.model.llama import PipelineStage, build_stage
from noloco_rt.outer.correction import apply_correction, deferred_outer_step, provisional_local_step
from noloco_rt.outer.delta_exchange import ErrorFeedback, delta_local_step
from noloco_rt.outer.formula import OuterCoefficients, PeerOuterState, group_outer_step


class StageReplica:
    def __init__(self, module: PipelineStage, inner: InnerOptimizer) -> None:
        self.module = module
        self.inner = inner
        self.fast: list[torch.Tensor] = [p.data for p in module.parameters()]
        self.slow: list[torch.Tensor] = [t.detach().clone() for t in self.fast]  # φ = θ at start
        self.momentum: list[torch.Tensor] = [torch.zeros_like(t) for t in self.fast]  # δ = 0
        self.pending_microbatches = 0
        self.outer_steps = 0
        self.error_feedback = ErrorFeedback()
        """With worker.delta_codec: what this replica has not sent yet of its outer gradients."""

    @classmethod
    def create(cls, cfg: Config, stage: int, *, device: torch.device | str = "cpu") -> StageReplica:
        """A replica initialised from the run seed: identical for every replica of a stage.
        A run with model.init_from starts from noloco_rt.model.init_weights.initial_replica (it
        reads files, and this package does no I/O); asking here for it is a bug."""
        if cfg.model.init_from:
            raise ValueError("model.init_from is set: build the replica with noloco_rt.model.init_weights.initial_replica")
        module = build_stage(cfg.model.preset, vocab_size=cfg.model.vocab_size, stage=stage,
                             num_stages=cfg.pipeline.stages, seed=cfg.run.seed, device=device)
        return cls.of_module(module, cfg)

    @classmethod
    def of_module(cls, module: PipelineStage, cfg: Config) -> StageReplica:
        """A replica around `module` as it is now (φ = θ, δ = 0), with the run's inner optimizer.
        Activation checkpointing follows model.activation_checkpointing; "auto" is off here (a
        worker resolves it for its device first: noloco_rt.memory.fit)."""
        module.activation_checkpointing = cfg.model.activation_checkpointing == "on"
        return cls(module, InnerOptimizer(module.parameters(), cfg.optim, total_steps=cfg.run.steps))

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return self.inner.params

    def record_microbatch(self) -> None:
        """One more microbatch's gradients have been accumulated for the next inner step."""
        self.pending_microbatches += 1

    @torch.no_grad()
    def load_weights(self, *, slow: Sequence[torch.Tensor], fast: Sequence[torch.Tensor],
                     momentum: Sequence[torch.Tensor]) -> None:
        """Copy φ, θ and δ in place (from a checkpoint or a donor), onto this replica's device."""
        for targets, sources in ((self.slow, slow), (self.fast, fast), (self.momentum, momentum)):
            for target, source in zip(targets, sources, strict=True):
                target.copy_(source.to(target.device))

    def has_gradients(self) -> bool:
        return self.pending_microbatches > 0

    @torch.no_grad()
    def finish_inner_step(self, *, grads_are_means: bool = False) -> float:
        """One inner step with the mean of the gradients summed over the microbatches seen since
        the last step (unless already averaged); returns the mean gradient's norm."""
        divisor = 1.0 if grads_are_means else float(max(1, self.pending_microbatches))
        self.pending_microbatches = 0
        return self.inner.step(grad_divisor=divisor)

    def outer_state(self, *, theta_only: bool) -> PeerOuterState:
        """A detached copy of what this replica contributes to a group's outer step."""
        fast = [t.clone() for t in self.fast]
        slow = [t.clone() for t in self.slow]
        return PeerOuterState.of(fast, slow, theta_only=theta_only)

    def apply_outer_step(self, peers: Sequence[PeerOuterState], coeffs: OuterCoefficients) -> None:
        group_outer_step(self.slow, self.momentum, self.fast, peers, coeffs)
        self.outer_steps += 1

    def provisional_outer_step(self, coeffs: OuterCoefficients) -> PeerOuterState:
        """The outer step with a group of one, at once; returns our state before it (what the
        correction needs when the partners' states arrive)."""
        self.outer_steps += 1
        return provisional_local_step(self.slow, self.momentum, self.fast, coeffs)

    def delta_outer_step(self, coeffs: OuterCoefficients, *, delta_codec: str, whole: bool, theta_only: bool,
                         error_feedback: bool = True) -> PeerOuterState:
        """The provisional local step of a round of worker.delta_codec (noloco_rt.outer.delta_exchange);
        returns the contribution partners get."""
        self.outer_steps += 1
        return delta_local_step(self.slow, self.momentum, self.fast, coeffs,
                                self.error_feedback if error_feedback else None, delta_codec=delta_codec,
                                whole=whole, theta_only=theta_only)

    def deferred_outer_step(self, fast_at_step: Sequence[torch.Tensor], correction: Sequence[torch.Tensor] | None,
                            coeffs: OuterCoefficients) -> None:
        """Outer step k, taken late (outer.overlap_correction = "deferred"): the group step of
        φ and δ (c None: the local step) with θ's inner progress since θ_k (`fast_at_step`) kept."""
        self.outer_steps += 1
        deferred_outer_step(self.slow, self.momentum, self.fast, list(fast_at_step),
                            list(correction) if correction is not None else None, coeffs)

    def correct_outer_step(self, correction: Sequence[torch.Tensor]) -> None:
        """Add the exact correction of the provisional step (at an inner-step boundary)."""
        apply_correction(self.slow, self.momentum, self.fast, list(correction))
