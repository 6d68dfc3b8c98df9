"""When a worker takes outer step k (docs/architecture.md §4, "Drift"). Pure.

Every worker follows a clock and takes outer step k once the clock reaches k·H.

Stage 0's clock is its own inner steps: every stage-0 replica consumes the same data per
inner step. A later stage cannot count its own steps: routing gives its replicas unequal
shares, so their counts drift apart and the seeded pairs miss each other. Its clock is
the data instead: every forward carries the stage-0 step it belongs to, and a later-stage
worker takes outer step k after the first inner step in which it trained on data of
stage-0 step k·H or later. Replicas fed by the same upstream then reach k together,
whatever their shares.

A partner's push pulls a worker along: one whose partner's push for a later outer step
arrived before its clock got there takes that step at its next inner-step boundary, and
its clock jumps to the step's start (a stage-0 worker skips the inner steps between; a
worker more than one step behind, such as a slow joiner, skips the outer steps between,
whose partners have moved on).
A slower worker (a straggler, or one that fell behind) then keeps its stage's outer clock
and its partners never wait for it; it trains fewer inner steps per outer step instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def outer_step_due(clock_steps: int, outer_steps: int, h: int) -> bool:
    """Whether to take an outer step now, with `outer_steps` taken and our clock at
    `clock_steps`. One step at a time: a worker that is behind catches up one outer step per
    inner step."""
    return clock_steps // h > outer_steps


def pull_target(pushed: Mapping[int, set[str]], partners_at: Callable[[int], list[str]],
                next_step: int) -> int | None:
    """The earliest outer step, from `next_step` on, for which one of our partners of that
    step has pushed its state (`pushed`: outer step -> senders), or None. Pushes from
    anyone else do not move our clock."""
    for step in sorted(s for s in pushed if s >= next_step):
        if any(sender in pushed[step] for sender in partners_at(step)):
            return step
    return None
