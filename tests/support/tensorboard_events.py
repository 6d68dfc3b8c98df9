"""What a run wrote for TensorBoard, read back."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


HAVE_WANDB = importlib.util.find_spec("wandb") is not None


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag under `logdir` (one event-file folder) as (step, value) in file order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})  # 0: keep every point
    events.Reload()
    return {name: [(e.step, e.value) for e in events.Scalars(name)] for name in events.Tags()["scalars"]}

