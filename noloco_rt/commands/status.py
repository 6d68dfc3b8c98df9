"""`noloco-rt status`: the membership table, per stage."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from noloco_rt.cli import config_options

if TYPE_CHECKING:  # the command imports these when it runs, so that `--help` stays fast
    from noloco_rt.commands.status_rows import RunSummary
    from noloco_rt.membership.table import Membership


@click.command()
@click.option("--redis-url", default=None, help="Membership table (default: network.redis_url).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per worker and line (for scripts).")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@config_options
def status(redis_url: str | None, as_json: bool, watch: bool, interval: float, config_path: str | None,
           assignments: tuple[str, ...]) -> None:
    """Live workers per stage: state, addresses, progress (step, loss, tokens/s), queue depth, heartbeat age.

    On a terminal a table; piped or redirected a plain full-width table (grep-able);
    with --json one object per worker and line."""
    from noloco_rt.commands import effective_config

    cfg = effective_config(config_path, assignments, {"network": {"redis_url": redis_url}})
    if not cfg.network.redis_url:
        raise click.UsageError("--redis-url (or network.redis_url) is required")

    from noloco_rt.cli import OneLineError
    from noloco_rt.commands.status_rows import json_lines, plain_table, runs_listing
    from noloco_rt.config.redaction import redact_url
    from noloco_rt.membership.redis_access import check_access, connect_network
    from noloco_rt.membership.table import Membership

    client = connect_network(cfg.network)
    if not check_access(client, cfg.network.redis_url):  # a refused password raises: exit 2, one line
        raise OneLineError(f"Redis at {redact_url(cfg.network.redis_url)} is unreachable")
    membership = Membership(client, run_id=cfg.run.run_id)

    def members() -> list:
        records = membership.live_members(stage=None, states=None)
        if not membership.redis_available:
            raise OneLineError(f"Redis at {redact_url(cfg.network.redis_url)} is unreachable")
        return records

    def title(records: list) -> str:
        return _title(_summary(membership, records), records)

    if _summary(membership, members()).empty and (runs := _other_runs(membership)):
        if as_json:
            click.echo("".join(json_lines([], time.time(), run) for run in runs), nl=False)
        else:
            click.echo(runs_listing(cfg.run.run_id, runs), nl=False)
        return

    if as_json or not sys.stdout.isatty():
        def render_text() -> str:
            records = members()
            if as_json:
                return json_lines(records, time.time(), _summary(membership, records))
            return plain_table(title(records), records, time.time())
        _print_repeatedly(render_text, watch, interval)
        return
    _rich_status(members, title, watch, interval)


def _summary(table: Membership, records: list) -> RunSummary:
    """The run `table` reads, with its listed `records`."""
    from noloco_rt.commands.status_rows import RunSummary

    return RunSummary(run_id=table.run_id, workers=len(records), stages=len(table.stages()),
                      finished_steps=table.run_finished_steps(), marks=table.high_water.by_stage())


def _title(run: RunSummary, records: list) -> str:
    from noloco_rt.commands.status_rows import outer_steps_line, progress_line

    marks, outer = progress_line(run.marks), outer_steps_line(records)
    return (f"run {run.run_id}: {len(records)} workers" + (f" ({marks})" if marks else "")
            + (f"; finished ({run.finished_steps} steps)" if run.finished_steps is not None else "")
            + (f"\n{outer}" if outer else ""))


def _other_runs(membership: Membership) -> list[RunSummary]:
    """When our run is not in this Redis at all: the runs that are (a run id not passed)."""
    from noloco_rt.membership.table import Membership

    found = []
    for run_id in membership.run_ids() or []:
        table = Membership(membership.client, run_id=run_id)
        found.append(_summary(table, table.live_members(stage=None, states=None)))
    return found


def _print_repeatedly(render, watch: bool, interval: float) -> None:
    # A log or a pipe: a new table (or batch of JSON lines) every interval, flushed at once.
    while True:
        click.echo(render(), nl=False)
        sys.stdout.flush()
        if not watch:
            return
        time.sleep(interval)


def _rich_status(members, title, watch: bool, interval: float) -> None:
    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from noloco_rt.commands.status_rows import COLUMNS, sorted_members, text_row

    def render() -> Table:
        records = members()
        table = Table(title=title(records))
        for header, _ in COLUMNS:
            table.add_column(header)
        now = time.time()
        for record in sorted_members(records):
            table.add_row(*text_row(record, now))
        return table

    console = Console()
    if not watch:
        console.print(render())
        return
    with Live(render(), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(render())
