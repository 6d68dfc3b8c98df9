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
    for warning in secrets_on_command_line(layers):
        click.echo(f"Warning: {warning}", err=True)
    return load_config(config_path, overrides=layers)


def secrets_on_command_line(layers: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the command line gave that every user of this machine reads in `ps` (pure)."""
    from noloco_rt.membership.redis_access import url_password

    found = []
    for layer in layers:
        network = layer.get("network") or {}
        if isinstance(network.get("redis_url"), str) and url_password(network["redis_url"]) is not None:
            found.append("the Redis password on the command line shows in `ps` to every user of this machine; "
                         "give the URL as NOLOCO_NETWORK_REDIS_URL or the password in network.redis_password_file")
        if network.get("curve_secret_key"):
            found.append("the CURVE secret key on the command line shows in `ps` to every user of this machine; "
                         "use NOLOCO_NETWORK_CURVE_SECRET_KEY or network.curve_key_dir")
    return found
