"""CLI commands of the library, loaded lazily by noloco_rt.cli."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from noloco_rt.config import Config, load_config, parse_assignment


def effective_config(config_path: str | None, assignments: Iterable[str],
                     flags: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Defaults <- file <- environment <- --set assignments <- dedicated flags (those given)."""
    layers: list[Mapping[str, Any]] = [parse_assignment(a) for a in assignments]
    if flags:
        layers.append({section: {k: v for k, v in values.items() if v is not None}
                       for section, values in flags.items()})
    return load_config(config_path, overrides=layers)
