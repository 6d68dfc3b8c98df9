"""`noloco-rt export CHECKPOINT --format hf OUT`: a consensus file as a Hugging Face model folder."""

from __future__ import annotations

from pathlib import Path

import click

from noloco_rt.commands._consensus import UnusableCheckpoint, checkpoint_argument

FORMATS = ("hf",)


@click.command(name="export")
@checkpoint_argument
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="hf", show_default=True,
              help="hf: a transformers LlamaForCausalLM folder.")
@click.option("--force", is_flag=True, help="Write into OUT even if it is not empty.")
def export(checkpoint: Path, out: Path, fmt: str, force: bool) -> None:
    """Write CHECKPOINT (a consensus .safetensors file) to the folder OUT as config.json,
    model.safetensors and generation_config.json (and tokenizer.json when the run's config
    names one), loadable with transformers' LlamaForCausalLM.from_pretrained(OUT)."""
    from noloco_rt.hf_export import HFExportError, check_out_dir, write_hf_folder
    from noloco_rt.hf_format import HFFormatError

    try:
        check_out_dir(out, force=force)  # before reading a possibly large checkpoint
    except HFExportError as exc:
        raise UnusableCheckpoint(str(exc)) from None
    except OSError as exc:
        raise UnusableCheckpoint(f"{out}: cannot be read ({exc})") from None
    from noloco_rt.commands._consensus import load_for_command

    cfg, model, _ = load_for_command(checkpoint, "cpu", presets_only="export")
    try:
        written = write_hf_folder(out, cfg, model, force=force)
    except (HFExportError, HFFormatError) as exc:
        raise UnusableCheckpoint(f"{checkpoint}: {exc}") from None
    except OSError as exc:  # no permission, disk full: the user's to fix, not a traceback
        raise UnusableCheckpoint(f"{out}: cannot be written ({exc})") from None
    from noloco_rt.config.prepared_manifest import run_tokenizer_path

    named = run_tokenizer_path(cfg)
    if named is not None and out / "tokenizer.json" not in written:
        click.echo(f"warning: the run's tokenizer {str(named)!r} has no tokenizer.json here; none was written",
                   err=True)
    click.echo(f"{out}: {', '.join(path.name for path in written)} ({fmt}, preset {cfg.model.preset})")
