"""Shared by the commands that read a consensus file (eval, sample)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.cli import OneLineError

if TYPE_CHECKING:
    from noloco_rt.config import Config
    from noloco_rt.config.training import DataConfig
    from noloco_rt.model.llama import PipelineStage


class UnusableCheckpoint(OneLineError):
    """A consensus file a command cannot use: one line, exit code 2."""


def checkpoint_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.argument("checkpoint", type=click.Path(dir_okay=False, path_type=Path))(func)


def data_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--data", "data_paths", multiple=True, metavar="PATH",
                        help="The run's data (files, globs or a `prepare`d directory; repeat for more) for a "
                             "CHECKPOINT trained on files or tokens: a file never picks local files to read.")(func)


def tokenizer_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--tokenizer", default=None, metavar="FILE",
                        help="The tokenizer.json the CHECKPOINT's token ids belong to (else its --data "
                             "directory's): a file never picks local files to read.")(func)


def with_user_files(cfg: Config, *, data: Sequence[str], tokenizer: str | None) -> tuple[Config, DataConfig]:
    """(the consensus' config with the local files the user named, the file's own data section)
    (pure). A file never picks local files to read or copy: its data.paths and data.tokenizer
    are dropped; with --data the user's paths take their place (the file's source, dtype and
    split kept), without it the run reads as bytes (source stdlib), so a command that needs the
    run's own data or tokenizer checks the file's section first and asks for them."""
    file_data = cfg.data
    if data:
        user = dataclasses.replace(file_data, paths=list(data), tokenizer=tokenizer or "")
    else:
        user = dataclasses.replace(file_data, source="stdlib", paths=[], tokenizer=tokenizer or "")
    return dataclasses.replace(cfg, data=user), file_data


def files_named(data: DataConfig) -> str:
    """The local files a consensus' data section names, for a message (pure)."""
    named = [*data.paths, *([data.tokenizer] if data.tokenizer else [])]
    return ", ".join(repr(p) for p in named[:4]) + (" …" if len(named) > 4 else "")


def device_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--device", default="cpu", show_default=True,
                        help="Torch device to run the model on, e.g. cuda or cuda:1.")(func)


def resolve_device(text: str) -> str:
    """The --device value checked here, so a typo is a one-line usage error, not a torch traceback."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise click.BadParameter(f"{text!r} is not a torch device", param_hint="--device") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise click.BadParameter("CUDA is not available on this machine", param_hint="--device")
        if device.index is not None and device.index >= count:
            raise click.BadParameter(f"{text!r}: this machine has {count} CUDA device(s)", param_hint="--device")
    return str(device)


def load_for_command(path: Path, device: str, *, presets_only: str | None = None,
                     factory: str | None = None) -> tuple[Config, PipelineStage, dict[str, str]]:
    """load_consensus, with its errors turned into a one-line message. `presets_only`: the
    command's name, when it works on the built-in language models only (not model.factory's);
    `factory`: the model code the user named (--model), the only code a file is built with."""
    from noloco_rt.config.training import is_hf_reference
    from noloco_rt.consensus.file import ExportError, OwnModelNotNamed, load_consensus
    from noloco_rt.model.staged import StagedModelError

    try:
        cfg, model, metadata = load_consensus(path, device=device, factory=factory or "")
    except OwnModelNotNamed as exc:
        if is_hf_reference(exc.factory):
            raise UnusableCheckpoint(f"{path} holds a Hugging Face model ({exc.factory!r}): a file never picks "
                                     f"local files to read; name its folder: --model hf:PATH") from None
        if presets_only:
            raise UnusableCheckpoint(f"{path} holds your own model ({exc.factory!r}): `noloco-rt {presets_only}` "
                                     f"works on the built-in presets only; load it in Python with "
                                     f"noloco_rt.consensus.file.load_consensus(path, factory=...)") from None
        raise UnusableCheckpoint(f"{path} holds your own model ({exc.factory!r}): a file never chooses code "
                                 f"to run; name it: --model MODULE:FUNCTION") from None
    except (ExportError, StagedModelError) as exc:
        raise UnusableCheckpoint(str(exc)) from None
    return cfg, model, metadata
