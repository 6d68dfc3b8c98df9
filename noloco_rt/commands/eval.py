"""`noloco-rt eval`: validation loss of a consensus checkpoint, beside the untrained model's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from noloco_rt.cli import OneLineError
from noloco_rt.commands._consensus import (
    checkpoint_argument,
    data_option,
    device_option,
    files_named,
    load_for_command,
    resolve_device,
    with_user_files,
)
from noloco_rt.commands.shared_options import model_name, model_value

if TYPE_CHECKING:
    from noloco_rt.config import Config


@click.command(name="eval")
@checkpoint_argument
@click.option("--batches", type=click.IntRange(min=1), default=None,
              help="Validation batches (default: run.eval_batches of the checkpoint's config).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--model", "model_factory", default=None, metavar="MODULE:FUNCTION",
              help="Your own model's code, for a CHECKPOINT of it (model.factory): a file never "
                   "chooses code to run, so you name it.")
@data_option
@device_option
def eval_command(checkpoint: Path, batches: int | None, as_json: bool, model_factory: str | None,
                 data_paths: tuple[str, ...], device: str) -> None:
    """Validation loss and perplexity of CHECKPOINT (a consensus .safetensors file) and, for
    comparison, of the untrained model of the same config and seed."""
    device = resolve_device(device)
    cfg, model, metadata = load_for_command(checkpoint, device, factory=model_value(model_factory))
    cfg, file_data = with_user_files(cfg, data=data_paths, tokenizer=None)
    if file_data.source != "stdlib" and not cfg.model.factory and not data_paths:
        raise OneLineError(f"{checkpoint} was trained on {file_data.source} ({files_named(file_data)}): a file "
                           f"never picks local files to read, so name the data: --data PATH")

    from noloco_rt.algo.diagnostics import perplexity
    from noloco_rt.evaluation import validation_loss

    val_batches = _validation_batches(cfg, batches)  # loaded once, used for both models
    trained = validation_loss(model, cfg, device=device, val_batches=val_batches)
    untrained = validation_loss(_untrained_model(cfg, device), cfg, device=device, val_batches=val_batches)
    result = {"val_loss": trained, "val_ppl": perplexity(trained), "untrained_val_loss": untrained,
              "untrained_val_ppl": perplexity(untrained), "checkpoint": str(checkpoint)}
    if as_json:
        click.echo(json.dumps(result))
        return
    step = f", step {metadata['step']}" if "step" in metadata else ""
    own_data = cfg.model.factory and cfg.model.hf_folder is None
    of_what = "" if own_data else f" of {cfg.data.batch_size}×{cfg.model.seq_len} tokens"
    every = " (all the split holds)" if batches is None and len(val_batches) < cfg.run.eval_batches else ""
    click.echo(f"{checkpoint} (run {cfg.run.run_id}{step}, {model_name(cfg)}, "
               f"{len(val_batches)} validation batches{of_what}{every})")
    click.echo(f"{'':<12}{'val_loss':>10}{'val_ppl':>12}")
    click.echo(f"{'checkpoint':<12}{trained:>10.4f}{result['val_ppl']:>12.2f}")
    click.echo(f"{'untrained':<12}{untrained:>10.4f}{result['untrained_val_ppl']:>12.2f}")


def _validation_batches(cfg: Config, batches: int | None) -> list:
    """The run's validation batches: your own model's (model.factory), else `batches` of the
    token data's validation split (no more than it holds)."""
    from noloco_rt.data import load_corpus, validation_capacity
    from noloco_rt.evaluation import load_validation_batches
    from noloco_rt.model.staged import staged_model

    if cfg.model.factory and staged_model(cfg).own_data:
        own = load_validation_batches(cfg)
        return own[:batches] if batches is not None else own
    corpus = load_corpus(cfg.data, vocab_size=cfg.model.vocab_size)
    capacity = validation_capacity(corpus.val, seq_len=cfg.model.seq_len, batch_size=cfg.data.batch_size)
    if batches is not None and batches > capacity:  # more would repeat windows and count them twice
        raise OneLineError(f"--batches {batches}: the validation split holds {capacity} distinct batches "
                           f"of {cfg.data.batch_size}×{cfg.model.seq_len} tokens")
    return load_validation_batches(cfg, batches=batches, corpus=corpus)


def _untrained_model(cfg: Config, device: str) -> Any:
    """The model of the same config and seed before any step."""
    if cfg.model.factory:
        from noloco_rt.consensus.file import whole_model

        return whole_model(cfg).to(device)
    from noloco_rt.model.llama import build_model

    return build_model(cfg.model.preset, vocab_size=cfg.model.vocab_size, seed=cfg.run.seed, device=device)
