"""`noloco-rt config show` and `noloco-rt config reference`."""

from __future__ import annotations

import click

from noloco_rt.cli import config_options
from noloco_rt.commands import effective_config
from noloco_rt.config import config_to_toml

SHOW_HEADER = "# What each field means: `noloco-rt config reference` (docs/config.md)."


@click.group()
def config() -> None:
    """Inspect the configuration."""


@config.command()
@click.option("--show-secrets", is_flag=True,
              help="Print the CURVE secret key and the Redis password instead of redacting them.")
@config_options
def show(show_secrets: bool, config_path: str | None, assignments: tuple[str, ...]) -> None:
    """Print the effective config (defaults, file, NOLOCO_* variables, flags) as TOML,
    secrets redacted unless --show-secrets. What each field means: `config reference`."""
    text = config_to_toml(effective_config(config_path, assignments), redact=not show_secrets)
    click.echo(f"{SHOW_HEADER}\n{text}", nl=False)


@config.command()
def reference() -> None:
    """Print every config field with its type, default, variable and meaning, as Markdown
    (the text of docs/config.md)."""
    from noloco_rt.config.reference import render_reference

    click.echo(render_reference(), nl=False)
