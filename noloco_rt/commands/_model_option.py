"""--model, shared by `up` and `worker`: your own model (model.factory), and its check at start."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.cli import OneLineError
from noloco_rt.config.training import HF_PREFIX, is_hf_reference

if TYPE_CHECKING:
    from noloco_rt.config import Config


class UnusableModel(OneLineError):
    """model.factory cannot be loaded or returned no usable StagedModel: one line, exit 2."""


def model_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--model", "model_factory", default=None, metavar="MODULE:FUNCTION|hf:PATH",
                        help="Train your own model: package.module:function or path/to/file.py:function, "
                             "returning a noloco_rt.staged_model.StagedModel, or hf:PATH, a transformers "
                             "causal-LM folder (model.factory; docs/own-model.md).")(func)


def model_value(reference: str | None) -> str | None:
    """The flag as a config value: a file path made absolute, because worker processes may
    run elsewhere; a dotted module name as given."""
    if reference is None:
        return None
    if is_hf_reference(reference):
        return f"{HF_PREFIX}{Path(reference[len(HF_PREFIX):]).expanduser().resolve()}"
    module, sep, function = reference.rpartition(":")
    if sep and (module.endswith(".py") or "/" in module):
        return f"{Path(module).resolve()}:{function}"
    return reference


def model_name(cfg: Config) -> str:
    """The run's model in a few words: the preset's name, or model.factory's function."""
    if cfg.model.hf_folder is not None:
        return f"Hugging Face model {Path(cfg.model.hf_folder).name}"
    return f"own model {cfg.model.factory.rpartition(':')[2]}" if cfg.model.factory else f"preset {cfg.model.preset}"


def check_model(cfg: Config) -> None:
    """Load model.factory's StagedModel once before anything starts, so that a wrong name or
    a bad return fails here in one line, not in every worker (each would only be restarted)."""
    if not cfg.model.factory:
        return
    from noloco_rt.staged_model import StagedModelError, staged_model

    try:
        staged_model(cfg)
    except StagedModelError as exc:
        raise UnusableModel(str(exc)) from None
