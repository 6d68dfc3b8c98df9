"""--init-from, shared by `up`, `worker` and `simulate`: the flag and the check at start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.commands._consensus import UnusableCheckpoint

if TYPE_CHECKING:
    from noloco_rt.config import Config


def init_from_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--init-from", "init_from", type=click.Path(path_type=Path), default=None,
                        help="Start every stage from these weights: a consensus .safetensors file or a "
                             "Hugging Face Llama folder of the same shape (model.init_from).")(func)


def init_from_value(path: Path | None) -> str | None:
    """The flag as a config value: absolute, because worker processes may run elsewhere."""
    return str(path.resolve()) if path is not None else None


def check_init_from(cfg: Config) -> None:
    """Refuse a model.init_from that cannot start this run: one line, exit 2, before anything
    starts (a worker process failing on it later would only be restarted)."""
    if not cfg.model.init_from:
        return
    from noloco_rt.init_weights import InitWeightsError, check_init_source

    try:
        check_init_source(cfg)
    except InitWeightsError as exc:
        raise UnusableCheckpoint(str(exc)) from None
