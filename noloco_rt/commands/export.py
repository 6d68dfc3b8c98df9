"""`noloco-rt export CHECKPOINT --format hf OUT`: a consensus file as a Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from noloco_rt.commands._consensus import (
    UnusableCheckpoint,
    checkpoint_argument,
    data_option,
    files_named,
    tokenizer_option,
    with_user_files,
)
from noloco_rt.commands.shared_options import model_value
from noloco_rt.config.training import is_hf_reference

if TYPE_CHECKING:
    from noloco_rt.config import Config

FORMATS = ("hf",)


@click.command(name="export")
@checkpoint_argument
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="hf", show_default=True,
              help="hf: a transformers LlamaForCausalLM folder.")
@click.option("--force", is_flag=True, help="Write into OUT even if it is not empty.")
@tokenizer_option
@data_option
@click.option("--model", "model_folder", default=None, metavar="hf:PATH",
              help="For a CHECKPOINT of a Hugging Face model (model.factory hf:PATH): the folder it was "
                   "trained from, whose architecture the export writes back.")
def export(checkpoint: Path, out: Path, fmt: str, force: bool, tokenizer: str | None,
           data_paths: tuple[str, ...], model_folder: str | None) -> None:
    """Write CHECKPOINT (a consensus .safetensors file) to the folder OUT as config.json,
    model.safetensors and generation_config.json (and tokenizer.json when you name one:
    --tokenizer, or --data of a `prepare`d directory; a file never picks local files to copy),
    loadable with transformers' LlamaForCausalLM.from_pretrained(OUT)."""
    from noloco_rt.consensus.hf_export import HFExportError, check_out_dir, write_hf_folder
    from noloco_rt.consensus.hf_format import HFFormatError

    try:
        check_out_dir(out, force=force)  # before reading a possibly large checkpoint
    except HFExportError as exc:
        raise UnusableCheckpoint(str(exc)) from None
    except OSError as exc:
        raise UnusableCheckpoint(f"{out}: cannot be read ({exc})") from None
    from noloco_rt.commands._consensus import load_for_command

    if model_folder is not None and not is_hf_reference(model_folder):
        raise click.BadParameter("export writes the built-in presets and hf:PATH models only", param_hint="--model")
    cfg, model, metadata = load_for_command(checkpoint, "cpu", presets_only=None if model_folder else "export",
                                            factory=model_value(model_folder))
    cfg, file_data = with_user_files(cfg, data=data_paths, tokenizer=tokenizer)
    from noloco_rt.consensus.standalone import (
        carried_tokenizer_file,
        embedded_eos_id,
        embedded_tokenizer,
        run_eos_id,
    )

    chosen = _named_tokenizer(cfg, tokenizer)
    with carried_tokenizer_file(metadata) as carried:
        if chosen is None and not tokenizer and not data_paths:  # the one the file carries
            chosen = carried
        eos = run_eos_id(cfg) if data_paths else embedded_eos_id(metadata)
        try:
            written = write_hf_folder(out, cfg, model, force=force, tokenizer=chosen, eos_token_id=eos)
        except (HFExportError, HFFormatError) as exc:
            raise UnusableCheckpoint(f"{checkpoint}: {exc}") from None
        except OSError as exc:  # no permission, disk full: the user's to fix, not a traceback
            raise UnusableCheckpoint(f"{out}: cannot be written ({exc})") from None
    from noloco_rt.config.prepared_manifest import run_tokenizer_path

    named = run_tokenizer_path(cfg) if cfg.data.source == "tokens" else (Path(tokenizer).expanduser() if tokenizer else None)
    if named is not None and out / "tokenizer.json" not in written:
        click.echo(f"warning: the tokenizer {str(named)!r} has no tokenizer.json here; none was written", err=True)
    elif named is None and file_data.source == "tokens" and embedded_tokenizer(metadata) is None:
        click.echo(f"note: {checkpoint} was trained on token ids ({files_named(file_data)}); a file never picks "
                   f"local files to copy: name its tokenizer (--tokenizer FILE or --data DIR) to include it",
                   err=True)
    from noloco_rt.commands.shared_options import model_name

    click.echo(f"{out}: {', '.join(path.name for path in written)} ({fmt}, {model_name(cfg)})")


def _named_tokenizer(cfg: Config, tokenizer: str | None) -> Path | None:
    """The tokenizer.json the user named: --tokenizer (a file, or a folder holding one), else
    the one of their --data directory (cfg holds only what they named)."""
    from noloco_rt.consensus.hf_export import run_tokenizer_file

    if tokenizer and cfg.data.source != "tokens":
        path = Path(tokenizer).expanduser()
        candidate = path / "tokenizer.json" if path.is_dir() else path
        return candidate if candidate.is_file() else None
    return run_tokenizer_file(cfg)
