"""`noloco-rt prepare`: text files, globs or JSONL -> token shards for data.source = "tokens"."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click


def _plain_progress():
    """Lines for logs: one per input (or phase) and one per tenth of the bytes, with the time
    left at this pass's rate."""
    seen: dict = {"tenth": -1, "where": "", "start": None}

    def report(done: int, total: int, what: str) -> None:
        where = what.split(",")[0]  # the input or phase, without its changing rate
        tenth = done * 10 // total if total else 0
        if seen["start"] is None or done < seen["start"][1]:  # a new pass (the BPE's, then encoding)
            seen["start"] = (time.monotonic(), done)
        if where != seen["where"] or tenth != seen["tenth"]:
            seen.update(tenth=tenth, where=where)
            share = f"{done * 100 // total}% " if total else ""
            click.echo(f"prepare: {share}{what}{_time_left(seen['start'], done, total)}", err=True)

    return report


def _time_left(start: tuple[float, int], done: int, total: int) -> str:
    elapsed, gained = time.monotonic() - start[0], done - start[1]
    if not total or gained <= 0 or elapsed <= 0 or done >= total:
        return ""
    return f" ({(total - done) * elapsed / gained:,.0f} s left)"


def _run(options) -> dict | None:
    from noloco_rt.prepare.pipeline import run_prepare

    if not sys.stderr.isatty():
        return run_prepare(options, _plain_progress())
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]prepare"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  TextColumn("{task.fields[what]}"), transient=False) as bar:
        task = bar.add_task("prepare", total=None, what="")

        def report(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total or None, what=what)

        return run_prepare(options, report)


@click.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the shards, tokenizer.json and prepared.json.")
@click.option("--tokenizer", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A Hugging Face tokenizer.json to encode with.")
@click.option("--train-bpe", type=int, default=None, metavar="VOCAB",
              help="Train a byte-level BPE of VOCAB tokens on the training documents instead: at least "
                   "257 (the 256 bytes and the end-of-document token), the rest merges.")
@click.option("--text-field", "--jsonl-field", "jsonl_field", default="text", show_default=True,
              help="Field holding the text in *.jsonl inputs, column in Parquet and Arrow ones.")
@click.option("--val-percent", type=click.FloatRange(min=0, max=100, min_open=True, max_open=True), default=5.0,
              show_default=True, help="Share of documents held out for validation (by a hash, deterministic).")
@click.option("--shard-tokens", type=click.IntRange(min=1), default=1 << 26, show_default=True,
              help="Tokens per shard file.")
@click.option("--eos-token", default=None, help="End-of-document token (default: <|endoftext|>, </s>, ... "
              "whichever the tokenizer has).")
@click.option("--force", is_flag=True, help="Discard what OUT holds from an earlier prepare and start over.")
@click.option("--kill-after-shards", type=int, default=None, hidden=True,
              help="Test hook: SIGKILL the process once this many shards are recorded.")
def prepare(inputs: tuple[str, ...], out: Path, tokenizer: Path | None, train_bpe: int | None,
            jsonl_field: str, val_percent: float, shard_tokens: int, eos_token: str | None, force: bool,
            kill_after_shards: int | None) -> None:
    """Tokenize INPUTS (text files, globs, *.jsonl, *.parquet, *.arrow, `datasets.save_to_disk`
    folders) into train/val shards in OUT.

    Rerunning the same command after an interruption continues where it stopped.
    Train on the result with data.source = "tokens" and data.paths = ["OUT"].
    """
    from noloco_rt.prepare.pipeline import PrepareOptions

    options = PrepareOptions(inputs=list(inputs), out=out, tokenizer=tokenizer, train_bpe=train_bpe,
                             jsonl_field=jsonl_field, val_percent=val_percent, shard_tokens=shard_tokens,
                             eos_token=eos_token, force=force, kill_after_shards=kill_after_shards)
    manifest = _run(options)
    if manifest is None:
        click.echo(f"{out} already holds this data; nothing to do (--force redoes it)")
        return
    tokens, docs = manifest["tokens"], manifest["documents"]
    click.echo(f"{out}: {tokens['train']} train / {tokens['val']} val tokens ({docs['train']} / "
               f"{docs['val']} documents), vocab {manifest['vocab_size']}, {manifest['token_dtype']}")
    if not tokens["val"] or not tokens["train"]:
        click.echo("warning: one split is empty (too few documents); training will hold out the tail "
                   "of the train stream instead", err=True)
    elif (warning := small_validation_warning(tokens["val"])) is not None:
        click.echo(warning, err=True)


def small_validation_warning(val_tokens: int) -> str | None:
    """A warning when the validation split holds fewer distinct batches, at the default batch
    and sequence length, than an evaluation takes by default (evaluations then use fewer)."""
    from noloco_rt.config.training import DataConfig, ModelConfig, RunConfig

    batch, seq, wanted = DataConfig().batch_size, ModelConfig().seq_len, RunConfig().eval_batches
    held = ((val_tokens - 1) // seq) // batch
    if held >= wanted:
        return None
    return (f"warning: the validation split holds {val_tokens:,} tokens, {held} distinct batches of {batch}×{seq} "
            f"(the defaults) where an evaluation takes {wanted} (run.eval_batches): evaluations will use "
            f"{max(held, 1)}; raise --val-percent for a steadier score")
