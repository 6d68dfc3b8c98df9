"""A whole training over emulated WAN links, against the same training on loopback.

    sudo .venv/bin/python -m benchmarks.wan --out benchmarks/results/wan.md
    sudo .venv/bin/python -m benchmarks.wan --quick          # 2 x 2, tiny, 100 Mbit/s only

Each run is S x R real `noloco-rt worker` processes and one redis-server. With links, every
worker sits in its own network namespace behind `tbf` links of the given rate in both
directions (benchmarks/sync/netns.py; Redis in the hub), so activations, gradients and
snapshots all cross an emulated access link; an RTT needs the delaying relay of
benchmarks/sync, which needs iptables. The loopback run is the same command on 127.0.0.1.
Per run: stage 0's tokens/s (tokens trained / the span from the first progress line to the
last worker done) and the val loss of the consensus of the final checkpoints. Ratios are
against loopback with the same layout, preset and wire dtype.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.sync import netns
from benchmarks.sync.netns import LinkSpec
from benchmarks.table import emit, markdown_table
from noloco_rt.logs import read_json_lines

REDIS_PORT = 16390


@dataclass(frozen=True)
class Trial:
    stages: int
    replicas: int
    preset: str
    wire_dtype: str
    link: LinkSpec | None
    """None: loopback."""
    steps: int

    @property
    def label(self) -> str:
        return self.link.label if self.link else "loopback"


def missing_tools(links: list[LinkSpec]) -> str | None:
    """One line naming the package to install, or None when every tool is here."""
    if not shutil.which("ip") or not shutil.which("tc"):
        return "benchmarks.wan needs `ip` and `tc` (install iproute2) and root"
    if any(link.delay_s > 0 for link in links) and not shutil.which("iptables"):
        return "benchmarks.wan: a link with an RTT needs iptables (install iptables); drop --rtt-ms to run without"
    return None


def _settings(trial: Trial, out: Path) -> list[str]:
    pairs = {"pipeline.stages": trial.stages, "pipeline.wire_dtype": trial.wire_dtype, "model.preset": trial.preset,
             "paths.checkpoint_dir": out / "checkpoints", "run.run_id": "wan", "worker.leave_grace_s": 5}
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def run_trial(trial: Trial, root: Path) -> dict[str, Any]:
    """One training; its throughput and final val loss."""
    out = root / f"{trial.label}-{trial.stages}x{trial.replicas}-{trial.preset}-{trial.wire_dtype}".replace(" ", "")
    (out / "logs").mkdir(parents=True)
    workers = trial.stages * trial.replicas
    shaped = trial.link is not None
    redis_host = "10.77.0.1" if shaped else "127.0.0.1"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if shaped:
            netns.shape(workers, trial.link)
        procs.append(_start_redis(redis_host, shaped))
        for index in range(workers):
            stage, replica = divmod(index, trial.replicas)
            host = netns.worker_ip(index) if shaped else "127.0.0.1"
            args = [*(netns.exec_prefix(index) if shaped else []), sys.executable, "-m", "noloco_rt.cli", "worker",
                    "--stage", str(stage), "--name", f"s{stage}-r{replica}", "--steps", str(trial.steps),
                    "--redis-url", f"redis://{redis_host}:{REDIS_PORT}/0", "--bind-host", host,
                    "--advertise-host", host, "--metrics-port", "0", *_settings(trial, out)]
            with (out / "logs" / f"s{stage}-r{replica}.log").open("wb") as log:
                procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
        for proc in procs[1:]:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"{trial}: a worker exited {proc.returncode}; logs in {out / 'logs'}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {**_throughput(out / "logs", trial), "val_loss": _val_loss(out, trial)}


def _start_redis(host: str, shaped: bool) -> subprocess.Popen[bytes]:
    from noloco_rt.membership.embedded_redis import redis_server_binary

    args = [*(netns.hub_prefix() if shaped else []), redis_server_binary(), "--bind", host, "--port",
            str(REDIS_PORT), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    time.sleep(0.5)  # redis-server listens within milliseconds; workers retry anyway
    return proc


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _throughput(logs: Path, trial: Trial) -> dict[str, Any]:
    """Stage 0's tokens/s: per stage-0 worker, the inner steps between its first and last
    progress lines over the time between them (start-up and shutdown left out), summed."""
    from noloco_rt.config import load_config

    cfg = load_config(environ={}, overrides=[{"model": {"preset": trial.preset}}])
    tokens_per_step = cfg.pipeline.max_inflight * cfg.data.batch_size * cfg.model.seq_len  # B microbatches a step
    rate, spans = 0.0, []
    for path in logs.glob("s0-*.log"):
        events, _ = read_json_lines(path)
        progress = [(e["inner_step"], _seconds(e["timestamp"])) for e in events if e.get("event") == "train_progress"]
        if len(progress) >= 2 and progress[-1][1] > progress[0][1]:
            (first_step, first_t), (last_step, last_t) = progress[0], progress[-1]
            rate += (last_step - first_step) * tokens_per_step / (last_t - first_t)
            spans.append(last_t - first_t)
    return {"tokens_per_s": rate, "train_s": max(spans, default=float("nan"))}


def _val_loss(out: Path, trial: Trial) -> float:
    from noloco_rt.config import load_config
    from noloco_rt.export import consensus_of_checkpoints

    cfg = load_config(environ={}, overrides=[{"model": {"preset": trial.preset}, "run": {"run_id": "wan"},
                                              "pipeline": {"stages": trial.stages}}])
    scored = consensus_of_checkpoints(cfg, out / "checkpoints", out / "consensus.safetensors", source="wan")
    return float(scored.to_json()["val_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 x 2, tiny, 100 Mbit/s")
    parser.add_argument("--steps", type=int, default=150, help="inner steps (H = 50: the last checkpoint "
                        "holds slow weights after steps // 50 outer steps)")
    parser.add_argument("--wire-dtypes", default="float32,float16,int8")
    parser.add_argument("--layouts", default="2x2:tiny,2x2:small,2x4:tiny", help="STAGESxREPLICAS:PRESET, comma-separated")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="needs iptables")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rates = [100] if args.quick else [100, 1000]
    links = [LinkSpec(rate, args.rtt_ms / 2000) for rate in rates]
    if (why := missing_tools(links)) is not None:
        raise SystemExit(why)
    layouts = [(2, 2, "tiny")] if args.quick else [_layout(text) for text in args.layouts.split(",")]
    wires = [w.strip() for w in args.wire_dtypes.split(",")]
    results: list[tuple[Trial, dict[str, Any]]] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="wan-") as tmp:
        netns.cleanup()
        try:
            netns.create(max(s * r for s, r, _ in layouts))
            for stages, replicas, preset in layouts:
                for wire in wires:
                    for link in (None, *links):
                        trial = Trial(stages, replicas, preset, wire, link, args.steps)
                        print(f"[{time.monotonic() - began:6.0f}s] {stages}x{replicas} {preset} {wire} "
                              f"{trial.label} ...", flush=True)
                        results.append((trial, run_trial(trial, Path(tmp))))
        finally:
            netns.cleanup()
    emit(report(results, args), args.out)
    if args.out is not None:
        rows = [{"trial": {**t.__dict__, "link": t.label}, **r} for t, r in results]
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


def _layout(text: str) -> tuple[int, int, str]:
    shape, _, preset = text.strip().partition(":")
    stages, _, replicas = shape.partition("x")
    return int(stages), int(replicas), preset or "tiny"


def report(results: list[tuple[Trial, dict[str, Any]]], args: argparse.Namespace) -> str:
    loopback = {(t.stages, t.replicas, t.preset, t.wire_dtype): r for t, r in results if t.link is None}
    float32 = {(t.stages, t.replicas, t.preset, t.label): r for t, r in results if t.wire_dtype == "float32"}
    rows = []
    for t, r in results:
        base = loopback[(t.stages, t.replicas, t.preset, t.wire_dtype)]
        f32 = float32.get((t.stages, t.replicas, t.preset, t.label))
        rows.append([f"{t.stages} × {t.replicas}", t.preset, t.label, t.wire_dtype, f"{r['tokens_per_s']:.0f}",
                     f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}",
                     f"{r['tokens_per_s'] / f32['tokens_per_s']:.2f}" if f32 else "—", f"{r['val_loss']:.4f}"])
    title = (f"Training over emulated links, {args.steps} steps per run (`python -m benchmarks.wan"
             f"{' --quick' if args.quick else ''}`): stage 0 tokens/s, ratios against loopback (same layout, "
             "preset and wire dtype) and against float32 (same link)")
    return markdown_table(title, ["layout", "preset", "link", "wire dtype", "tokens/s", "÷ loopback",
                                  "÷ float32", "val loss"], rows)


if __name__ == "__main__":
    main()
