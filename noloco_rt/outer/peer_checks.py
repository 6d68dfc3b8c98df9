"""Plausibility checks on a peer's outer-step contribution (pure, no I/O).

Validation of the wire and the codec proves a snapshot is well formed and finite; it
cannot prove it is sane. A peer whose weights went wrong (a fault, a bug, a poisoned
host) may serve finite tensors of the right shapes that are absurdly far from ours,
and one outer step with them would wreck the receiver. Honest replicas of a stage
start identical and are pulled together every outer step, so they stay close.

The measure is a distance relative to our own weight scale, per stage (all tensors
of the stage in one L2 norm; a per-tensor ratio would explode on tensors whose own
norm is near zero, such as freshly initialised biases):

    fast:       ‖θ_peer − θ_own‖ / (‖θ_own‖ + ε)
    slow+grad:  ‖φ_peer − φ_own‖ / (‖φ_own‖ + ε)  and  ‖Δ_peer − Δ_own‖ / (‖φ_own‖ + ε)
    grad alone: ‖Δ_peer − Δ_own‖ / (‖φ_own‖ + ε)   (a sparse round: Δ as sent)

The outer gradient is compared against the weight scale, not against ‖Δ_own‖: outer
gradients of replicas that saw different data may point different ways, and what
matters is how far applying the peer's Δ could move our weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from noloco_rt.outer.device_check import one_device
from noloco_rt.outer.formula import PeerOuterState, state_tensors

EPSILON = 1e-12


def _norm(tensors: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


def distance_ratio(peer: Sequence[torch.Tensor], own: Sequence[torch.Tensor], scale: Sequence[torch.Tensor],
                   *, eps: float = EPSILON) -> float:
    """‖peer − own‖ / (‖scale‖ + ε) over all tensors together; inf if non-finite or shapes differ."""
    if len(peer) != len(own) or any(p.shape != o.shape for p, o in zip(peer, own, strict=True)):
        return math.inf
    distance = _norm([p.float() - o.float() for p, o in zip(peer, own, strict=True)])
    ratio = distance / (_norm(scale) + eps)
    return ratio if math.isfinite(ratio) else math.inf


@dataclass(frozen=True)
class PeerCheck:
    ratios: dict[str, float]
    """Distance ratio per compared part ("fast", or "slow" and "outer_grad")."""
    max_ratio: float

    @property
    def ok(self) -> bool:
        return all(r <= self.max_ratio for r in self.ratios.values())

    @property
    def worst(self) -> float:
        return max(self.ratios.values(), default=0.0)


def check_peer_distance(peer: PeerOuterState, own: PeerOuterState, *, max_ratio: float,
                        scale: Sequence[torch.Tensor] | None = None) -> PeerCheck:
    """Compare a peer's contribution with ours; ok when every ratio is <= max_ratio.

    A peer sending another kind of state than ours (fast vs slow+grad vs grad alone) is
    treated as infinitely far: honest members of one round all send the same kind. Δ alone
    (a sparse round) is compared against `scale`, our φ (required then). All tensors must
    be on one device (ValueError naming both otherwise)."""
    one_device(state_tensors(peer), state_tensors(own), list(scale or []), what="check_peer_distance")
    if own.grad_only:
        if scale is None:
            raise ValueError("a gradient-only contribution is checked against our slow weights: pass scale")
        ratio = distance_ratio(peer.outer_grad, own.outer_grad, scale) if peer.grad_only else math.inf  # type: ignore[arg-type]
        return PeerCheck({"outer_grad": ratio}, max_ratio)
    if own.fast is not None:
        ratios = {"fast": distance_ratio(peer.fast, own.fast, own.fast) if peer.fast is not None else math.inf}
        return PeerCheck(ratios, max_ratio)
    assert own.slow is not None and own.outer_grad is not None  # PeerOuterState guarantees one form
    if peer.slow is None or peer.outer_grad is None or peer.grad_only:
        return PeerCheck({"slow": math.inf, "outer_grad": math.inf}, max_ratio)
    return PeerCheck({"slow": distance_ratio(peer.slow, own.slow, own.slow),
                      "outer_grad": distance_ratio(peer.outer_grad, own.outer_grad, own.slow)}, max_ratio)
