"""`noloco-rt status`: the membership table, per stage."""

from __future__ import annotations

import time

import click

from noloco_rt.cli import config_options


@click.command()
@click.option("--redis-url", default=None, help="Membership table (default: network.redis_url).")
@click.option("--watch", is_flag=True, help="Refresh every --interval seconds until Ctrl-C.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@config_options
def status(redis_url: str | None, watch: bool, interval: float, config_path: str | None,
           assignments: tuple[str, ...]) -> None:
    """Live workers per stage: state, addresses, progress (step, loss, tokens/s), queue depth, heartbeat age."""
    from noloco_rt.commands import effective_config

    cfg = effective_config(config_path, assignments, {"network": {"redis_url": redis_url}})
    if not cfg.network.redis_url:
        raise click.UsageError("--redis-url (or network.redis_url) is required")

    from rich.console import Console
    from rich.live import Live
    from rich.table import Table

    from noloco_rt.membership.redis_access import check_access, connect, redact_url
    from noloco_rt.membership.table import Membership

    client = connect(cfg.network.redis_url)
    if not check_access(client, cfg.network.redis_url):  # a refused password raises: exit 2, one line
        raise click.ClickException(f"Redis at {redact_url(cfg.network.redis_url)} is unreachable")
    membership = Membership(client, run_id=cfg.run.run_id)

    def render() -> Table:
        records = membership.live_members(stage=None, states=None)
        if not membership.redis_available:
            raise click.ClickException(f"Redis at {redact_url(cfg.network.redis_url)} is unreachable")
        table = Table(title=f"run {cfg.run.run_id}: {len(records)} workers")
        for column in ("stage", "worker", "name", "state", "data address", "exchange address", "step", "outer step",
                       "loss", "tokens/s", "queue", "heartbeat age s"):
            table.add_column(column)
        now = time.time()
        for r in sorted(records, key=lambda r: (r.stage, r.name, r.worker_id)):
            table.add_row(str(r.stage), r.worker_id[:8], r.name or "-", r.state.value, r.data_addr, r.exchange_addr,
                          str(r.inner_step), str(r.outer_step), "-" if r.loss is None else f"{r.loss:.3f}",
                          f"{r.tokens_per_s:.0f}", str(r.queue_depth), f"{now - r.heartbeat_time:.1f}")
        return table

    console = Console()
    if not watch:
        console.print(render())
        return
    if not console.is_terminal:  # a log or a pipe: a new table every interval, Live would print only the last
        while True:
            console.print(render())
            time.sleep(interval)
    with Live(render(), console=console, refresh_per_second=4) as live:
        while True:
            time.sleep(interval)
            live.update(render())
