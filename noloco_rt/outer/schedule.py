"""When a worker takes outer step k (docs/architecture.md §4, "Drift"). Pure.

Stage 0 takes it after its own inner step k·H: every stage-0 replica consumes the same
data per inner step, so their counts agree. A later stage cannot count its own steps:
routing gives its replicas unequal shares, so their counts drift apart and the seeded
pairs miss each other. Its clock is the data instead: every forward carries the stage-0
inner step it belongs to, and a later-stage worker takes outer step k after the first
inner step in which it trained on data of stage-0 step k·H or later. Replicas fed by the
same upstream then reach k together, whatever their shares.
"""

from __future__ import annotations


def outer_step_due(inner_steps: int, outer_steps: int, h: int, *, data_step: int | None = None) -> bool:
    """Whether to take an outer step now, after `inner_steps` of our own with `outer_steps`
    taken. `data_step`: the furthest stage-0 step of the data trained on (a later stage), or
    None to count our own steps (stage 0, or forwards that do not say). One step at a time:
    a worker that is behind catches up one outer step per inner step."""
    if data_step is None:
        return inner_steps % h == 0
    return data_step // h > outer_steps
