"""A whole training over emulated WAN links, against the same training on loopback.

    sudo .venv/bin/python -m benchmarks.wan --out benchmarks/results/wan.md
    sudo .venv/bin/python -m benchmarks.wan --quick          # 2 x 2, tiny, 100 Mbit/s only
    sudo .venv/bin/python -m benchmarks.wan --rtt-ms 50 --baseline-tree /path/to/old/checkout

Each run is S x R real `noloco-rt worker` processes and one redis-server. With links, every
worker sits in its own network namespace behind `tbf` links of the given rate in both
directions (workers/faults/netns.py; Redis in the hub), so activations, gradients and
snapshots all cross an emulated access link. An RTT comes from the delaying relay of
benchmarks/sync in routed mode: each worker binds fixed ports and advertises the hub's
address on its link, where the relay listens and forwards to it after the delay (every
worker-to-worker connection crosses it once; Redis is not delayed). The loopback run is the
same command on 127.0.0.1. Per run: stage 0's tokens/s (tokens trained / the span from the
first progress line to the last worker done) and the val loss of the consensus of the final
checkpoints. Ratios are against loopback with the same layout, preset and wire dtype.

--baseline-tree runs float32 once more per layout and link with the worker code of another
checkout (an older commit: "today's path" for a before/after comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.table import emit, markdown_table
from noloco_rt.config import load_config
from noloco_rt.consensus.scored import consensus_of_checkpoints
from noloco_rt.logs import read_json_lines, record_seconds
from noloco_rt.membership.embedded_redis import redis_server_binary
from workers.faults import netns
from workers.faults.netns import LinkSpec

REDIS_PORT = 16390
DATA_PORT_BASE, EXCHANGE_PORT_BASE = 17000, 17200
"""Fixed ports per worker when a relay adds an RTT (worker i: base + i)."""


@dataclass(frozen=True)
class Trial:
    stages: int
    replicas: int
    preset: str
    wire_dtype: str
    link: LinkSpec | None
    """None: loopback."""
    steps: int
    tree: Path | None = None
    """Run the workers from this checkout instead of this one (None: this one)."""
    overlap: bool = False
    """outer.overlap on (the outer exchange off the training path)."""

    @property
    def label(self) -> str:
        return self.link.label if self.link else "loopback"

    @property
    def code(self) -> str:
        """The wire dtype column: which data path ran."""
        code = f"{self.wire_dtype} ({self.tree.name})" if self.tree else self.wire_dtype
        return f"{code} + overlap" if self.overlap else code


def missing_tools(links: list[LinkSpec]) -> str | None:
    """One line naming the package to install, or None when every tool is here."""
    if not shutil.which("ip") or not shutil.which("tc"):
        return "benchmarks.wan needs `ip` and `tc` (install iproute2) and root"
    return None


def _settings(trial: Trial, out: Path, index: int) -> list[str]:
    pairs: dict[str, Any] = {"pipeline.stages": trial.stages, "model.preset": trial.preset,
                             "paths.checkpoint_dir": out / "checkpoints", "run.run_id": "wan", "worker.leave_grace_s": 5}
    if trial.tree is None:  # an older checkout may not know the setting; its data path is float32
        pairs["pipeline.wire_dtype"] = trial.wire_dtype
    if trial.overlap:
        pairs["outer.overlap"] = "true"
    if _relayed(trial):
        pairs |= {"network.data_port": DATA_PORT_BASE + index, "network.exchange_port": EXCHANGE_PORT_BASE + index}
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def _relayed(trial: Trial) -> bool:
    return trial.link is not None and trial.link.delay_s > 0


def _start_relay(trial: Trial, workers: int) -> subprocess.Popen[bytes] | None:
    """The routed relay in the hub (the RTT): hub_ip(i):port -> worker_ip(i):port for both ports."""
    if not _relayed(trial):
        return None
    assert trial.link is not None
    routes = [f"--route={base + i}={netns.worker_ip(i)}:{base + i}"
              for i in range(workers) for base in (DATA_PORT_BASE, EXCHANGE_PORT_BASE)]
    return subprocess.Popen([*netns.hub_prefix(), sys.executable, "-m", "benchmarks.sync.relay",
                             "--delay-s", str(trial.link.delay_s), *routes],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # it is killed mid-transfer


def run_trial(trial: Trial, root: Path) -> dict[str, Any]:
    """One training; its throughput and final val loss."""
    name = f"{trial.label}-{trial.stages}x{trial.replicas}-{trial.preset}-{trial.code}"
    out = root / "".join(c if c.isalnum() or c in "-." else "_" for c in name)
    (out / "logs").mkdir(parents=True)
    workers = trial.stages * trial.replicas
    shaped = trial.link is not None
    redis_host = "10.77.0.1" if shaped else "127.0.0.1"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if shaped:
            netns.shape(workers, trial.link, redirect=False)
        procs.append(start_redis(redis_host, netns.hub_prefix() if shaped else []))
        relay = _start_relay(trial, workers)
        for index in range(workers):
            procs.append(_start_worker(trial, out, index, redis_host))
        if relay is not None:
            procs.insert(1, relay)  # stopped with the others, never waited for
        for proc in procs[2 if relay else 1:]:
            if proc.wait(timeout=1800) != 0:
                raise SystemExit(f"{trial}: a worker exited {proc.returncode}; logs in {out / 'logs'}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    try:
        val_loss = consensus_val_loss(out, trial.preset, trial.stages)
    except Exception as exc:  # noqa: BLE001 - an older checkout's checkpoints may not load here; keep the speed
        print(f"  val loss not scored: {exc!r}", flush=True)
        val_loss = float("nan")
    return {**stage0_throughput(out / "logs", trial.preset), "val_loss": val_loss}


def _start_worker(trial: Trial, out: Path, index: int, redis_host: str) -> subprocess.Popen[bytes]:
    stage, replica = divmod(index, trial.replicas)
    shaped = trial.link is not None
    host = netns.worker_ip(index) if shaped else "127.0.0.1"
    advertise = netns.hub_ip(index) if _relayed(trial) else host
    args = [*(netns.exec_prefix(index) if shaped else []), sys.executable, "-m", "noloco_rt.cli", "worker",
            "--stage", str(stage), "--name", f"s{stage}-r{replica}", "--steps", str(trial.steps),
            "--redis-url", f"redis://{redis_host}:{REDIS_PORT}/0", "--bind-host", host,
            "--advertise-host", advertise, "--metrics-port", "0", "--set", "network.trusted_network=true",
            *_settings(trial, out, index)]  # namespaces of our own: nobody else reaches them
    # One torch thread per worker, as `noloco-rt up` gives them: S x R processes share the cores,
    # and OpenMP threads of several processes fighting over them made runs several times slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"PYTHONPATH": str(trial.tree)} if trial.tree else {})}
    with (out / "logs" / f"s{stage}-r{replica}.log").open("wb") as log:  # -m imports from the cwd first
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=trial.tree)


def start_redis(host: str, prefix: list[str]) -> subprocess.Popen[bytes]:
    """A bare redis-server on host:REDIS_PORT, run under `prefix` (a namespace's exec)."""
    args = [*prefix, redis_server_binary(), "--bind", host, "--port",
            str(REDIS_PORT), "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    time.sleep(0.5)  # redis-server listens within milliseconds; workers retry anyway
    return proc


def stage0_throughput(logs: Path, preset: str) -> dict[str, Any]:
    """Stage 0's tokens/s: per stage-0 worker, the inner steps between its first and last
    progress lines over the time between them (start-up and shutdown left out), summed."""
    cfg = load_config(environ={}, overrides=[{"model": {"preset": preset}}])
    tokens_per_step = cfg.pipeline.microbatches_per_step * cfg.data.batch_size * cfg.model.seq_len  # B microbatches a step
    rate, spans = 0.0, []
    for path in logs.glob("s0-*.log"):
        events, _ = read_json_lines(path)
        progress = [(e["inner_step"], record_seconds(e["timestamp"])) for e in events if e.get("event") == "train_progress"]
        if len(progress) >= 2 and progress[-1][1] > progress[0][1]:
            (first_step, first_t), (last_step, last_t) = progress[0], progress[-1]
            rate += (last_step - first_step) * tokens_per_step / (last_t - first_t)
            spans.append(last_t - first_t)
    return {"tokens_per_s": rate, "train_s": max(spans, default=float("nan"))}


def consensus_val_loss(out: Path, preset: str, stages: int, run_id: str = "wan") -> float:
    """Val loss of the consensus of the final checkpoints under out/checkpoints."""
    cfg = load_config(environ={}, overrides=[{"model": {"preset": preset}, "run": {"run_id": run_id},
                                              "pipeline": {"stages": stages}}])
    scored = consensus_of_checkpoints(cfg, out / "checkpoints", out / "consensus.safetensors", source="wan")
    return float(scored.to_json()["val_loss"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 x 2, tiny, 100 Mbit/s")
    parser.add_argument("--steps", type=int, default=150, help="inner steps (H = 50: the last checkpoint "
                        "holds slow weights after steps // 50 outer steps)")
    parser.add_argument("--wire-dtypes", default="float32,float16,int8")
    parser.add_argument("--layouts", default="2x2:tiny,2x2:small,2x4:tiny", help="STAGESxREPLICAS:PRESET, comma-separated")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round trip added by a relay in the hub")
    parser.add_argument("--rates", default="100,1000", help="link rates in Mbit/s, comma-separated ('': loopback only)")
    parser.add_argument("--no-loopback", action="store_true", help="links only (ratios to loopback need it)")
    parser.add_argument("--baseline-tree", type=Path, default=None,
                        help="also run float32 with the workers of this checkout (an older commit)")
    parser.add_argument("--overlap", action="store_true",
                        help="also run the first wire dtype with outer.overlap on")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rates = [100] if args.quick else [int(rate) for rate in args.rates.split(",") if rate.strip()]
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
                codes = [(wire, None, False) for wire in wires]
                codes += [("float32", args.baseline_tree.resolve(), False)] if args.baseline_tree else []
                codes += [(wires[0], None, True)] if args.overlap else []
                for wire, tree, overlap in codes:
                    for link in ([] if args.no_loopback else [None]) + links:
                        trial = Trial(stages, replicas, preset, wire, link, args.steps, tree, overlap)
                        print(f"[{time.monotonic() - began:6.0f}s] {stages}x{replicas} {preset} {trial.code} "
                              f"{trial.label} ...", flush=True)
                        results.append((trial, run_trial(trial, Path(tmp))))
        finally:
            netns.cleanup()
    emit(report(results, args), args.out)
    if args.out is not None:
        rows = [{"trial": {**t.__dict__, "link": t.label, "tree": str(t.tree) if t.tree else None}, **r}
                for t, r in results]
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


def _layout(text: str) -> tuple[int, int, str]:
    shape, _, preset = text.strip().partition(":")
    stages, _, replicas = shape.partition("x")
    return int(stages), int(replicas), preset or "tiny"


def report(results: list[tuple[Trial, dict[str, Any]]], args: argparse.Namespace) -> str:
    loopback = {(t.stages, t.replicas, t.preset, t.code): r for t, r in results if t.link is None}
    float32 = {(t.stages, t.replicas, t.preset, t.label): r for t, r in results if t.code == "float32"}
    before = {(t.stages, t.replicas, t.preset, t.label): r for t, r in results if t.tree is not None}

    def ratio(r: dict[str, Any], base: dict[str, Any] | None) -> str:
        return f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}" if base else "—"

    rows = []
    for t, r in results:
        same_link = (t.stages, t.replicas, t.preset, t.label)
        rows.append([f"{t.stages} × {t.replicas}", t.preset, t.label, t.code, f"{r['tokens_per_s']:.0f}",
                     ratio(r, loopback.get((t.stages, t.replicas, t.preset, t.code))), ratio(r, float32.get(same_link)),
                     ratio(r, before.get(same_link)), f"{r['val_loss']:.4f}"])
    title = (f"Training over emulated links, {args.steps} steps per run (`python -m benchmarks.wan"
             f"{' --quick' if args.quick else ''}`): stage 0 tokens/s, ratios against loopback (same layout, "
             "preset and data path), against float32 and against the baseline checkout's float32 (same link)")
    return markdown_table(title, ["layout", "preset", "link", "wire dtype", "tokens/s", "÷ loopback",
                                  "÷ float32", "÷ before", "val loss"], rows)


if __name__ == "__main__":
    main()
