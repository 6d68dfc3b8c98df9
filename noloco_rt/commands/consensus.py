"""`noloco-rt consensus`: a run's model from its workers' checkpoints, wherever they ran.

A run on several machines leaves each worker's checkpoint on its own machine (and, with a
durable store, every replica's final state there). Gathered in one place, or read from the
store, they make the same consensus file `up` writes at the end of a run: each stage's
replicas averaged, scored on the validation data, with the replica spread.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from noloco_rt.cli import OneLineError, config_options


@click.command(name="consensus")
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--from-store", is_flag=True,
              help="Read the run's durable store (store.url) instead: each stage's checkpoints of its newest "
                   "outer step (every replica's final state, once the run finished).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=Path("consensus.safetensors"),
              show_default=True, help="The consensus file to write.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a summary.")
@config_options
def consensus(sources: tuple[Path, ...], from_store: bool, out: Path, as_json: bool, config_path: str | None,
              assignments: tuple[str, ...]) -> None:
    """Average the workers' checkpoints of a run (SOURCES: `.pt` files or folders of them,
    copied from every machine) into one consensus file, and score it. The run's config
    (--config RUN.toml, the file the workers ran with) gives the run id, the model and the
    validation data; checkpoints of another run or shape are skipped and named."""
    from noloco_rt.commands import effective_config
    from noloco_rt.consensus.file import ExportError
    from noloco_rt.consensus.scored import (
        checkpoint_files,
        consensus_of_found,
        read_checkpoint_files,
        scoring_device,
    )

    if bool(sources) == from_store:
        raise click.UsageError("give the checkpoints (files or folders) or --from-store, one of them")
    cfg = effective_config(config_path, assignments)
    try:
        if from_store:
            found, where, source = _from_store(cfg), "the store", "durable store"
        else:
            found = read_checkpoint_files(checkpoint_files(sources), cfg)
            where, source = ", ".join(map(str, sources)), "worker checkpoints"
        for path, reason in found.skipped:
            click.echo(f"skipped {path}: {reason}", err=True)
        scored = consensus_of_found(cfg, found, out, source=source, where=where, device=scoring_device())
    except ExportError as exc:
        raise OneLineError(str(exc)) from None
    result = {**scored.to_json(), "run_id": cfg.run.run_id, "run_steps": cfg.run.steps,
              "skipped": len(found.skipped)}
    if as_json:
        click.echo(json.dumps(result))
        return
    click.echo(f"{out}: run {cfg.run.run_id}, step {scored.step} of {cfg.run.steps}, replicas per stage "
               f"{scored.replicas_per_stage}, val_loss {scored.val_loss:.4f} (ppl {scored.val_ppl:.2f}), "
               f"spread {scored.spread:.3e}")
    if scored.step < cfg.run.steps:
        click.echo(f"note: stage 0's checkpoints end at step {scored.step}, before run.steps = {cfg.run.steps}: "
                   "the run had not finished when they were written", err=True)


def _from_store(cfg):
    from noloco_rt.config.redaction import redact_url
    from noloco_rt.consensus.scored import read_store_checkpoints
    from noloco_rt.store.backend import StoreError

    if not cfg.store.url:
        raise click.UsageError("--from-store needs the run's store.url (in --config or --set store.url=...)")
    try:
        return read_store_checkpoints(cfg)
    except (OSError, StoreError) as exc:
        raise OneLineError(f"store.url {redact_url(cfg.store.url)!r} cannot be read: {exc}") from None
