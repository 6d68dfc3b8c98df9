"""CLI commands of the library, loaded lazily by noloco_rt.cli."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import click

from noloco_rt.config import Config, load_config, parse_assignment
from noloco_rt.config.loading import foreign_env_vars
from noloco_rt.config.schema import SECTIONS


def effective_config(config_path: str | None, assignments: Iterable[str],
                     flags: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Defaults <- file <- environment <- --set assignments <- dedicated flags (those given).
    NOLOCO_* variables that name no config section get a one-line warning on stderr."""
    foreign = foreign_env_vars(os.environ)
    if foreign:
        sections = ", ".join(s.upper() for s in SECTIONS)
        click.echo(f"Warning: ignoring {', '.join(foreign)}: not NOLOCO_<SECTION>_<FIELD> with SECTION in "
                   f"{sections}", err=True)
    layers: list[Mapping[str, Any]] = [parse_assignment(a) for a in assignments]
    if flags:
        layers.append({section: {k: v for k, v in values.items() if v is not None}
                       for section, values in flags.items()})
    return load_config(config_path, overrides=layers)
