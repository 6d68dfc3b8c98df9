"""Two sites joined by one slow link, against the same training on one site.

    python -m benchmarks.two_sites --out benchmarks/results/two_sites.md      # root: namespaces
    python -m benchmarks.two_sites --quick                                    # 1 seed, 10 Mbit/s, 40 steps

S x R real `noloco-rt worker` processes and one redis-server in namespaces
(workers/faults/site_netns.py): replicas 0 .. R/2 - 1 of every stage in site a, the others in
site b, fast links inside a site, one link of the given rate between the sites with an RTT of
--rtt-ms added by a relay on that link only. Placements per seed:

- one site: every worker in site a (the baseline; nothing crosses the slow link);
- two sites, local routing: worker.site names the site and routing.far_share (--far-share,
  0 by default) is the share of microbatches sent to the other site;
- two sites, measured links (--measured): no site names; workers tell the other site's
  next-stage workers by their link round trips (routing.locality = auto), the same far_share;
- two sites, uniform (--uniform): no site names and routing.locality = labels, so half the
  activations cross.

Across sites every worker sets worker.min_bandwidth_mbit_s to the link's rate, as a run
across such a link must (a joiner's bootstrap may cross it). Per run: stage 0's tokens/s (benchmarks/wan.py), the val loss of the consensus of the final
checkpoints, and the bytes that crossed the link (tbf's counters on both ends). Ratios are
against one site with the same seed, then their mean and range over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.table import emit, markdown_table
from benchmarks.wan import (
    DATA_PORT_BASE,
    EXCHANGE_PORT_BASE,
    REDIS_PORT,
    consensus_val_loss,
    missing_tools,
    stage0_throughput,
    start_redis,
)
from workers.faults import netns, site_netns
from workers.faults.netns import LinkSpec

SITE_NAMES = ("a", "b")
RUN_ID = "two-sites"


@dataclass(frozen=True)
class Placement:
    name: str
    two_sites: bool
    site_names: bool
    """worker.site is set (routing keeps activations inside a site)."""
    measured: bool = False
    """No site names: routing tells near from far by measured links."""


ONE_SITE = Placement("one site", False, False)
LOCAL = Placement("two sites, local routing", True, True)
MEASURED = Placement("two sites, measured links", True, False, measured=True)
UNIFORM = Placement("two sites, uniform routing", True, False)


@dataclass(frozen=True)
class Trial:
    placement: Placement
    link: LinkSpec | None
    """The link between the sites (None: one site)."""
    seed: int
    stages: int
    replicas: int
    preset: str
    steps: int
    far_share: float

    @property
    def label(self) -> str:
        return self.placement.name if self.link is None else f"{self.placement.name}, {self.link.label}"

    def site_of(self, rank: int) -> int:
        """Worker `rank` (stage-major) is in site 0 or 1: the first half of each stage's replicas in 0."""
        return int(self.placement.two_sites and rank % self.replicas >= self.replicas // 2)


def _ports(rank: int) -> tuple[int, int]:
    return DATA_PORT_BASE + rank, EXCHANGE_PORT_BASE + rank


def _worker_command(trial: Trial, out: Path, rank: int) -> list[str]:
    stage, replica = divmod(rank, trial.replicas)
    data_port, exchange_port = _ports(rank)
    settings = {"pipeline.stages": trial.stages, "model.preset": trial.preset, "run.run_id": RUN_ID,
                "run.seed": trial.seed, "paths.checkpoint_dir": out / "checkpoints", "worker.leave_grace_s": 5,
                "network.data_port": data_port, "network.exchange_port": exchange_port,
                "network.trusted_network": "true"}  # namespaces of our own: nobody else reaches them
    if trial.placement.site_names:
        settings |= {"worker.site": SITE_NAMES[trial.site_of(rank)], "routing.far_share": trial.far_share}
    elif trial.placement.measured:
        settings |= {"routing.locality": "auto", "routing.far_share": trial.far_share}
    else:  # nothing tells near from far
        settings["routing.locality"] = "labels"
    if trial.link is not None:  # what a run across such a link sets: transfer timeouts for its rate
        settings["worker.min_bandwidth_mbit_s"] = trial.link.rate_mbit
    return [*netns.exec_prefix(rank), sys.executable, "-m", "noloco_rt.cli", "worker", "--stage", str(stage),
            "--name", f"s{stage}-r{replica}", "--steps", str(trial.steps),
            "--redis-url", f"redis://{netns.SERVICE_IP}:{REDIS_PORT}/0", "--bind-host", "0.0.0.0",
            "--advertise-host", netns.worker_ip(rank), "--metrics-port", "0",
            *[arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]]


def link_bytes() -> int:
    """Bytes sent on both ends of the link between the sites since it was shaped (tbf's counters)."""
    total = 0
    for site, ifname in enumerate((f"{netns.PREFIX}-xa", f"{netns.PREFIX}-xb")):
        shown = subprocess.run([*site_netns.router_prefix(site), "tc", "-s", "qdisc", "show", "dev", ifname],
                               capture_output=True, text=True, check=False).stdout
        found = re.search(r"Sent (\d+) bytes", shown)
        total += int(found.group(1)) if found else 0
    return total


def start_sites(trial: Trial, procs: list[subprocess.Popen[bytes]]) -> None:
    """Fresh namespaces for the trial's workers, the link between the sites shaped, Redis in
    site a and (with a link) each site's relay, appended to `procs` as each starts (the caller
    stops them, and calls netns.cleanup, whatever happens)."""
    workers = trial.stages * trial.replicas
    sites = [trial.site_of(rank) for rank in range(workers)]
    netns.cleanup()
    site_netns.create(sites)
    site_netns.shape(trial.link)
    procs.append(start_redis(netns.SERVICE_IP, site_netns.router_prefix(0)))
    if trial.link is not None:
        ports = [_ports(rank) for rank in range(workers)]
        procs += [subprocess.Popen(site_netns.relay_command(site, sites, ports, trial.link.delay_s),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for site in (0, 1)]


def start_worker(trial: Trial, out: Path, rank: int, extra_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Worker `rank` in its namespace, logging to out/logs/s{stage}-r{replica}.log, with one torch
    thread (as `up` gives each worker) and `extra_args` after its own."""
    stage, replica = divmod(rank, trial.replicas)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (out / "logs" / f"s{stage}-r{replica}.log").open("wb") as log:
        return subprocess.Popen([*_worker_command(trial, out, rank), *extra_args], stdout=log,
                                stderr=subprocess.STDOUT, env=env)


def run_trial(trial: Trial, root: Path) -> dict[str, Any]:
    """One training in fresh namespaces: tokens/s, final val loss, bytes across the sites."""
    out = root / re.sub(r"[^A-Za-z0-9.-]+", "_", f"{trial.label}-seed{trial.seed}")
    (out / "logs").mkdir(parents=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        start_sites(trial, procs)
        services = len(procs)  # redis and relays: stopped with the others, never waited for
        procs += [start_worker(trial, out, rank) for rank in range(trial.stages * trial.replicas)]
        for proc in procs[services:]:
            if proc.wait(timeout=3600) != 0:
                raise SystemExit(f"{trial}: a worker exited {proc.returncode}; logs in {out / 'logs'}")
        crossed = link_bytes() if trial.link is not None else 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        netns.cleanup()
    return {**stage0_throughput(out / "logs", trial.preset), "link_bytes": crossed,
            "val_loss": consensus_val_loss(out, trial.preset, trial.stages, run_id=RUN_ID)}


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "—"
    mean = statistics.fmean(values)
    return f"{mean:{fmt}}" if len(values) == 1 else f"{mean:{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def report(results: list[tuple[Trial, dict[str, Any]]], args: argparse.Namespace) -> str:
    """One row per placement and link: means and ranges over seeds, ratios seed by seed against one site."""
    base = {t.seed: r for t, r in results if t.link is None}
    rows = []
    for label in dict.fromkeys(t.label for t, _ in results):
        runs = [(t, r) for t, r in results if t.label == label]
        speed = [r["tokens_per_s"] / base[t.seed]["tokens_per_s"] for t, r in runs if t.seed in base]
        loss = [100 * (r["val_loss"] / base[t.seed]["val_loss"] - 1) for t, r in runs if t.seed in base]
        rows.append([label, str(len(runs)), _spread([r["tokens_per_s"] for _, r in runs], ".0f"),
                     _spread(speed, ".2f"), _spread([r["val_loss"] for _, r in runs], ".4f"),
                     _spread(loss, "+.2f"), _spread([r["link_bytes"] / 1e6 for _, r in runs], ".0f")])
    title = (f"Two sites against one, {args.layout} {args.preset}, {args.steps} steps, RTT {args.rtt_ms:g} ms "
             f"between the sites, far_share {args.far_share:g} (`python -m benchmarks.two_sites`): mean "
             "[range] over seeds; ratios seed by seed against one site")
    return markdown_table(title, ["placement", "seeds", "stage 0 tokens/s", "÷ one site", "val loss",
                                  "val loss vs one site %", "MB across sites"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, 10 Mbit/s, 40 steps")
    parser.add_argument("--layout", default="2x4", help="STAGESxREPLICAS, an even number of replicas")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rates", default="10,100", help="Mbit/s of the link between the sites, comma-separated")
    parser.add_argument("--rtt-ms", type=float, default=50.0)
    parser.add_argument("--far-share", type=float, default=0.0)
    parser.add_argument("--measured", action="store_true",
                        help="also run two sites without site names, near and far from measured links")
    parser.add_argument("--uniform", action="store_true", help="also run two sites without site names or locality")
    parser.add_argument("--no-labels", action="store_true", help="leave out the placement with site names")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs-dir", type=Path, default=None,
                        help="keep every run's logs and checkpoints here (default: a temporary folder)")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.rates, args.steps = "0", "10", 40
    stages, _, replicas = args.layout.partition("x")
    if int(replicas) % 2:
        raise SystemExit(f"--layout {args.layout}: the replicas split evenly over two sites")
    if (why := missing_tools([])) is not None:
        raise SystemExit(why)
    if args.runs_dir is not None and args.runs_dir.is_dir() and any(args.runs_dir.iterdir()):
        raise SystemExit(f"--runs-dir {args.runs_dir} holds earlier runs: remove it or name an empty folder")
    links = [LinkSpec(int(rate), args.rtt_ms / 2000) for rate in args.rates.split(",") if rate.strip()]
    trials = []
    for seed in (int(s) for s in args.seeds.split(",")):
        common = dict(seed=seed, stages=int(stages), replicas=int(replicas), preset=args.preset, steps=args.steps,
                      far_share=args.far_share)
        trials.append(Trial(ONE_SITE, None, **common))
        for link in links:
            placements = [p for p, wanted in ((LOCAL, not args.no_labels), (MEASURED, args.measured),
                                              (UNIFORM, args.uniform)) if wanted]
            trials += [Trial(p, link, **common) for p in placements]
    results: list[tuple[Trial, dict[str, Any]]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="two-sites-") as tmp:
        runs = args.runs_dir or Path(tmp)
        for number, trial in enumerate(trials, 1):
            print(f"[{time.monotonic() - began:6.0f}s] {number}/{len(trials)} {trial.label}, seed {trial.seed} ...",
                  flush=True)
            result = run_trial(trial, runs)
            print(f"    {result['tokens_per_s']:.0f} tokens/s, val loss {result['val_loss']:.4f}, "
                  f"{result['link_bytes'] / 1e6:.1f} MB across", flush=True)
            results.append((trial, result))
    emit(report(results, args), args.out)
    if args.out is not None:
        rows = [{"trial": {**t.__dict__, "placement": t.placement.name, "link": t.link.label if t.link else None},
                 **r} for t, r in results]
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
