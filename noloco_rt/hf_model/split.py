"""Which decoder layers each stage holds: contiguous runs balanced by parameter count. Pure."""

from __future__ import annotations


def split_layers(layer_params: list[int], *, first_extra: int, last_extra: int, stages: int) -> list[range]:
    """Contiguous, non-empty runs of layers, one per stage, that minimise the largest stage's
    parameters (stage 0 also holds `first_extra`, the embedding; the last stage `last_extra`,
    the final norm and head). Ties go to the split that puts more layers early."""
    layers = len(layer_params)
    if stages < 1 or layers < stages:
        raise ValueError(f"{layers} layers cannot fill {stages} stages (each stage needs at least one)")
    prefix = [0]
    for count in layer_params:
        prefix.append(prefix[-1] + count)

    def cost(start: int, end: int, stage: int) -> int:
        extra = (first_extra if stage == 0 else 0) + (last_extra if stage == stages - 1 else 0)
        return prefix[end] - prefix[start] + extra

    # best[s][e]: the smallest largest-stage size placing layers [0, e) on stages [0, s].
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(stages)]
    cut = [[0] * (layers + 1) for _ in range(stages)]
    for end in range(1, layers + 1):
        best[0][end] = cost(0, end, 0)
    for stage in range(1, stages):
        for end in range(stage + 1, layers + 1):
            for start in range(end - 1, stage - 1, -1):
                value = max(best[stage - 1][start], cost(start, end, stage))
                if value < best[stage][end]:
                    best[stage][end], cut[stage][end] = value, start
    runs, end = [], layers
    for stage in range(stages - 1, -1, -1):
        start = cut[stage][end] if stage > 0 else 0
        runs.append(range(start, end))
        end = start
    return runs[::-1]
