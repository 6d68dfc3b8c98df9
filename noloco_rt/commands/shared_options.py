"""The flags and start-up checks that several commands share, and the processes they start
(`up`, `worker`, `simulate`, `plan`, `eval`, `sample`, `export`, the coordinator):

- `--model` (model.factory: your own model or hf:PATH) and its check at start;
- `--init-from` (model.init_from) and its check at start;
- the durable store (store.url) checked before a process registers anywhere.

Each check fails in one line with exit 2 before anything starts: a worker process failing
on the same thing later would only be restarted.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.cli import OneLineError
from noloco_rt.commands._consensus import UnusableCheckpoint
from noloco_rt.config.redaction import redact_url
from noloco_rt.config.training import HF_PREFIX, is_hf_reference

if TYPE_CHECKING:
    from noloco_rt.config import Config

__all__ = ["UnusableModel", "check_init_from", "check_model", "check_store", "init_from_option", "init_from_value",
           "model_name", "model_option", "model_value"]


class UnusableModel(OneLineError):
    """model.factory cannot be loaded or returned no usable StagedModel: one line, exit 2."""


# -- --model --------------------------------------------------------------------------------

def model_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--model", "model_factory", default=None, metavar="MODULE:FUNCTION|hf:PATH",
                        help="Train your own model: package.module:function or path/to/file.py:function, "
                             "returning a noloco_rt.model.staged.StagedModel, or hf:PATH, a transformers "
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
    a bad return fails here in one line, not in every worker."""
    if not cfg.model.factory:
        return
    from noloco_rt.model.staged import StagedModelError, staged_model

    try:
        staged_model(cfg)
    except StagedModelError as exc:
        raise UnusableModel(str(exc)) from None


# -- --init-from ----------------------------------------------------------------------------

def init_from_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--init-from", "init_from", type=click.Path(path_type=Path), default=None,
                        help="Start every stage from these weights: a consensus .safetensors file or a "
                             "Hugging Face Llama folder of the same shape (model.init_from).")(func)


def init_from_value(path: Path | None) -> str | None:
    """The flag as a config value: absolute, because worker processes may run elsewhere."""
    return str(path.resolve()) if path is not None else None


def check_init_from(cfg: Config) -> None:
    """Refuse a model.init_from that cannot start this run."""
    if not cfg.model.init_from:
        return
    from noloco_rt.model.init_weights import InitWeightsError, check_init_source

    try:
        check_init_source(cfg)
    except InitWeightsError as exc:
        raise UnusableCheckpoint(str(exc)) from None


# -- store.url ------------------------------------------------------------------------------

def check_store(cfg: Config) -> None:
    """Refuse a store that cannot be opened or listed (unknown scheme, missing fsspec
    package, unreadable folder)."""
    if not cfg.store.url:
        return
    from noloco_rt.store.backend import RunStore, StoreError

    try:
        RunStore(cfg.store.url).list(cfg.run.run_id)
    except (OSError, StoreError) as exc:
        raise OneLineError(f"store.url {redact_url(cfg.store.url)!r} is not usable: {exc}") from None
