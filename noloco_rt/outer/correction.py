"""The provisional local outer step and its exact correction (docs/architecture.md §4). Pure tensor code.

At outer step k a worker does not wait for its partners: it takes the local step
(group {i}) at once and keeps training,

    δ_i ← α·δ_i + β·Δ_i ;  φ_i ← φ_i + δ_i ;  θ_i ← φ_i

and when the partners' step-k snapshots arrive it adds what the group step would have
added beyond the local one, with Δ_i, φ_i its own values at step k and G its group:

    c = β·(mean_G Δ − Δ_i) + γ·(mean_G φ − φ_i)      (γ = β: c = β·(mean_G θ − θ_i))
    δ_i += c ;  φ_i += c ;  θ_i += c

computed as a sum over the partners whose states were used, each pair weighted by the
group's size,

    c = Σ_j (1/|G|_ij)·[β·(Δ_j − Δ_i) + γ·(φ_j − φ_i)]

so that when a member of a group of three is missing (partial), the two who exchanged
still move by equal and opposite amounts. Partners use each other's states or neither
does, so the c of a step sum to zero and the replicas' mean of φ is kept; a mean over the
members that arrived would weigh the same pair 1/2 on one side and 1/3 on the other.
|G|_ij is the larger of the two sizes i and j computed: two workers whose views of the
stage differ (one still lists a member the other has dropped) may compute groups of
three and two, and the pair must still weigh alike on both sides. When every member
computed the same group, |G|_ij = |G| and c is the group step's.

Applied before any inner step this equals noloco_rt.outer.formula.group_outer_step
exactly; applied later it also carries the inner steps taken meanwhile (θ keeps its
progress since the provisional step, shifted by c).

The deferred variant (outer.overlap_correction = "deferred") takes no provisional step:
θ trains on from θ_k, φ and δ keep their step-k values, and when the partners' states
arrive (or the round is given up: c = 0) the whole step is taken at once,

    δ_i ← α·δ_i + β·Δ_i + c ;  φ_i ← φ_i + δ_i ;  θ_i ← φ_i + (θ_i − θ_k)

so φ and δ get exactly the group step and θ keeps the inner progress made since step k.
With no inner step in between it is the blocking step too; the difference is where those
inner steps ran: on the trajectory they continue, not on the local step's jump.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from noloco_rt.outer.device_check import one_device
from noloco_rt.outer.formula import (
    OuterCoefficients,
    PeerOuterState,
    TensorList,
    apply_outer_update,
    mean_of,
    outer_gradient,
    state_tensors,
)


@torch.no_grad()
def correction_term(own: PeerOuterState, peers: Sequence[PeerOuterState], coeffs: OuterCoefficients, *,
                    group_size: int | Sequence[int] | None = None) -> TensorList:
    """c for worker i from its own step-k state and the states of the partners it used.

    `own` holds θ_i (shortcut), φ_i and Δ_i, or Δ_i alone (a sparse round: as its partners
    decode it) as they were at step k, before the provisional step; every state must be of
    the same kind and on the same device (ValueError naming both devices otherwise).
    `group_size`: |G| as the group was computed, us included, one for all partners or one
    per partner (|G|_ij, pair_group_size); None: every member's state is here, len(peers) + 1.
    """
    if not peers:
        raise ValueError("a correction needs at least one partner's state")
    if group_size is None or isinstance(group_size, int):
        sizes = [len(peers) + 1 if group_size is None else group_size] * len(peers)
    else:
        sizes = list(group_size)
    if len(sizes) != len(peers):
        raise ValueError(f"{len(sizes)} group sizes for {len(peers)} partners")
    if any(size <= len(peers) for size in sizes):  # each pair's group holds us and every partner used
        raise ValueError(f"a group of {min(sizes)} cannot hold us and {len(peers)} partners")
    one_device(*(state_tensors(s) for s in (own, *peers)), what="correction_term")
    states = [own, *peers]
    if any(s.grad_only for s in states):  # a sparse round: Δ averaged alone (delta_exchange.py)
        if not all(s.grad_only for s in states):
            raise ValueError("states mix gradient-only and whole-state kinds")
        return [coeffs.beta * g for g in _summed_gaps([p.outer_grad for p in peers], own.outer_grad, sizes)]  # type: ignore[misc, arg-type]
    if all(s.slow is not None and s.outer_grad is not None for s in states):
        grad_gap = _summed_gaps([p.outer_grad for p in peers], own.outer_grad, sizes)  # type: ignore[misc, arg-type]
        slow_gap = _summed_gaps([p.slow for p in peers], own.slow, sizes)  # type: ignore[misc, arg-type]
        return [coeffs.beta * g + coeffs.gamma * s for g, s in zip(grad_gap, slow_gap, strict=True)]
    if any(s.fast is None for s in states):
        raise ValueError("states mix fast-only and slow+gradient kinds")
    if not coeffs.theta_shortcut:
        raise ValueError(f"fast-only states need gamma == beta, got gamma={coeffs.gamma}, beta={coeffs.beta}")
    return [coeffs.beta * g for g in _summed_gaps([p.fast for p in peers], own.fast, sizes)]  # type: ignore[misc, arg-type]


def pair_group_size(ours: int, theirs: int | None) -> int:
    """|G|_ij: the larger of the group sizes the two sides of a pair computed (theirs None:
    a partner that did not say, ours stands for it), so both weigh the pair alike."""
    return ours if theirs is None else max(ours, theirs)


def _summed_gaps(theirs: Sequence[TensorList], mine: TensorList, sizes: Sequence[int]) -> TensorList:
    """Σ_j (x_j − x_i)/|G|_ij, tensor by tensor: with every member in and one size, mean_G x − x_i."""
    if len(set(sizes)) == 1:  # one size: one mean, as the group step computes it
        total = mean_of(theirs)  # Σ_j x_j / n
        count = len(theirs)
        return [(count * t - count * m) / sizes[0] for t, m in zip(total, mine, strict=True)]
    gaps = [torch.zeros_like(m) for m in mine]
    for partner, size in zip(theirs, sizes, strict=True):
        for gap, t, m in zip(gaps, partner, mine, strict=True):
            gap.add_((t - m) / size)
    return gaps


@torch.no_grad()
def provisional_local_step(slow: TensorList, momentum: TensorList, fast: TensorList,
                           coeffs: OuterCoefficients) -> PeerOuterState:
    """The local step, in place; returns the state at step k (before it) that both the
    partners and the later correction need: θ alone under the shortcut, else φ and Δ."""
    before = PeerOuterState.of([f.clone() for f in fast], [s.clone() for s in slow],
                               theta_only=coeffs.theta_shortcut)
    apply_outer_update(slow, momentum, fast, [coeffs.beta * d for d in outer_gradient(fast, slow)], coeffs)
    return before


@torch.no_grad()
def deferred_outer_step(slow: TensorList, momentum: TensorList, fast: TensorList, fast_at_step: TensorList,
                        correction: TensorList | None, coeffs: OuterCoefficients) -> None:
    """Outer step k taken now, in place, from φ, δ as they still are since step k and θ_k
    (`fast_at_step`): the local step plus the correction c (None: the local step alone),
    with θ's inner progress since θ_k kept on top of the new φ. All on one device."""
    one_device(slow, momentum, fast, fast_at_step, *([correction] if correction is not None else []),
               what="deferred_outer_step")
    delta = outer_gradient(fast_at_step, slow)  # Δ_i of step k: φ has not moved since
    torch._foreach_mul_(momentum, coeffs.alpha)
    torch._foreach_add_(momentum, [coeffs.beta * d for d in delta])
    if correction is not None:
        torch._foreach_add_(momentum, list(correction))
    progress = torch._foreach_sub(fast, fast_at_step)  # the inner steps taken since step k
    torch._foreach_add_(slow, momentum)
    for f, s, p in zip(fast, slow, progress, strict=True):
        f.copy_(s).add_(p)


@torch.no_grad()
def apply_correction(slow: TensorList, momentum: TensorList, fast: TensorList, correction: TensorList) -> None:
    """δ += c; φ += c; θ += c, in place (at an inner-step boundary, nothing in flight)."""
    for tensors in (momentum, slow, fast):
        torch._foreach_add_(tensors, correction)
