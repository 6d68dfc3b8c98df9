"""The sparse outer exchange (docs/architecture.md §4, "Fewer bytes"). Pure tensor code.

With worker.delta_codec set, every replica keeps an error-feedback buffer e_i (what it has
not sent yet) and its outer step k works with Δ̃_i = Δ_i + e_i instead of Δ_i:

- k a multiple of worker.theta_every: the whole state. The local step uses Δ̃_i, the
  contribution is θ̃_i = φ_i + Δ̃_i (or φ_i and Δ̃_i) through worker.snapshot_codec, the
  correction is NoLoCo's, which pulls the replicas' φ together (γ); e_i ← 0.
- any other k: Δ alone. x̂_i = what the sparse codec keeps of Δ̃_i (round to nearest:
  deterministic, computed where the weights are). The local step uses x̂_i, not Δ_i, so φ_i
  moves only by what was sent; e_i ← Δ̃_i − x̂_i is sent in later rounds. The group
  averages the x̂ alone: c_i = (1/|G|)·Σ_j β·(x̂_j − x̂_i).

In both, a replica uses its own contribution as its partners decode it, so the c of a pair
are equal and opposite and the replicas' mean of φ is kept exactly. Keeping the unsent
part out of φ is what SparseLoCo does with its all-reduce; applying it locally instead lets
the replicas drift apart between whole-state rounds (measured: 40x the spread, +10 % ppl).
Partners agree on k (matched groups), so they agree on what is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from noloco_rt.config.choices import DELTA_CODECS
from noloco_rt.outer.codecs.sparse import sparse_round_trip
from noloco_rt.outer.formula import (
    OuterCoefficients,
    PeerOuterState,
    apply_outer_update,
    outer_gradient,
)

BITS = {"topk2-zstd": 2, "topk4-zstd": 4}
assert set(BITS) == set(DELTA_CODECS)


def sends_whole_state(outer_step: int, *, delta_codec: str, theta_every: int) -> bool:
    """Whether outer step `outer_step` exchanges the whole state (else Δ alone, sparse)."""
    return not delta_codec or outer_step % theta_every == 0


@torch.no_grad()
def delta_as_sent(tensors: Sequence[torch.Tensor], delta_codec: str) -> list[torch.Tensor]:
    """What partners decode of each tensor under `delta_codec`, computed where the tensors are."""
    bits = BITS[delta_codec]
    return [sparse_round_trip(t.reshape(-1), bits).reshape(t.shape) for t in tensors]


class ErrorFeedback:
    """What this replica has not sent yet of its outer gradients (one tensor per parameter,
    where the weights are; None when nothing is pending)."""

    def __init__(self) -> None:
        self.residual: list[torch.Tensor] | None = None

    @torch.no_grad()
    def with_unsent(self, delta: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Δ̃ = Δ + e (a new list; Δ is not changed)."""
        if self.residual is None:
            return [d.clone() for d in delta]
        if len(self.residual) != len(delta) or any(r.shape != d.shape for r, d in zip(self.residual, delta, strict=True)):
            raise ValueError("error feedback holds tensors of other shapes than this Δ")
        return [d + r for d, r in zip(delta, self.residual, strict=True)]

    def state_dict(self) -> list[torch.Tensor] | None:
        return None if self.residual is None else list(self.residual)

    def load_state_dict(self, residual: Sequence[torch.Tensor] | None, like: Sequence[torch.Tensor]) -> None:
        """Restore from a checkpoint onto the device and dtype of `like` (the replica's weights)."""
        if residual is not None and [tuple(r.shape) for r in residual] != [tuple(t.shape) for t in like]:
            raise ValueError("a checkpoint's error feedback does not fit this stage's tensors")
        self.residual = None if residual is None else [r.to(t.device, t.dtype) for r, t in zip(residual, like, strict=True)]


@torch.no_grad()
def delta_local_step(slow: list[torch.Tensor], momentum: list[torch.Tensor], fast: list[torch.Tensor],
                     coeffs: OuterCoefficients, feedback: ErrorFeedback | None, *, delta_codec: str,
                     whole: bool, theta_only: bool) -> PeerOuterState:
    """The provisional local step of outer step k with worker.delta_codec, in place, and the
    contribution partners get (before any lossy snapshot codec): θ̃ (or φ and Δ̃) when
    `whole`, else x̂ alone. `feedback` None: no error feedback (an ablation)."""
    delta = feedback.with_unsent(outer_gradient(fast, slow)) if feedback is not None else outer_gradient(fast, slow)
    if whole:
        applied = delta
        contribution = PeerOuterState(fast=[s + d for s, d in zip(slow, delta, strict=True)]) if theta_only else \
            PeerOuterState(slow=[s.clone() for s in slow], outer_grad=[d.clone() for d in delta])
        if feedback is not None:
            feedback.residual = None
    else:
        applied = delta_as_sent(delta, delta_codec)
        contribution = PeerOuterState(outer_grad=applied)
        if feedback is not None:
            feedback.residual = [d - a for d, a in zip(delta, applied, strict=True)]
    apply_outer_update(slow, momentum, fast, [coeffs.beta * a for a in applied], coeffs)
    return contribution
