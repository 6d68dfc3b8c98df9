"""The run directory of `noloco-rt up`: config.toml, metrics.jsonl, logs/, checkpoints/,
consensus.safetensors and curves.png.

A directory is reused only by a run of the same configuration (its workers then resume
their checkpoints); another configuration there is refused rather than mixed.
"""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib
from pathlib import Path
from typing import Any

from noloco_rt.config import Config, config_to_toml

# Sections that must match for checkpoints in a run directory to be reusable.
_MUST_MATCH = ("model", "pipeline", "data", "optim", "outer")


class RunDirError(ValueError):
    """The run directory cannot be used for this configuration."""


def prepare_run_dir(out: Path, cfg: Config) -> Path:
    """Create `out` (or accept one of the same run) and write config.toml; returns its path."""
    config_path = out / "config.toml"
    # Never write the Redis URL: it may hold a password; processes get it from the environment.
    new_text = config_to_toml(dataclasses.replace(cfg, network=dataclasses.replace(cfg.network, redis_url="")))
    if config_path.exists():
        old = tomllib.loads(config_path.read_text())
        new = tomllib.loads(new_text)
        changed = [f"{section}.{name}: {old.get(section, {}).get(name)!r} -> {value!r}"
                   for section in _MUST_MATCH for name, value in new.get(section, {}).items()
                   if old.get(section, {}).get(name) != value]
        if old.get("run", {}).get("run_id") != new["run"]["run_id"]:
            changed.append(f"run.run_id: {old.get('run', {}).get('run_id')!r} -> {new['run']['run_id']!r}")
        if changed:
            raise RunDirError(f"{out} holds a run with another configuration ({'; '.join(changed[:4])}); "
                              f"choose another --out or remove that directory")
    out.mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    config_path.write_text(new_text)
    return config_path


class MetricsLog:
    """Appends one JSON object per line to metrics.jsonl, flushed at once (a crash loses nothing)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._handle.write(json.dumps({"time": round(time.time(), 3), **record}, default=str) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl as records; a torn last line (killed mid-write) is skipped."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def consensus_of_final_checkpoints(cfg: Config, checkpoint_dir: Path, path: Path, *, source: str) -> dict[str, Any]:
    """Average the workers' last checkpoints per stage into the consensus file at `path`,
    load it back (what a user will load) and score it; also the final replica spread.
    Raises noloco_rt.export.ExportError when some stage has no usable checkpoint."""
    from noloco_rt.algo.diagnostics import perplexity, pooled_spread, replica_spread
    from noloco_rt.evaluation import validation_loss
    from noloco_rt.export import (
        load_consensus,
        mean_over_replicas,
        replicas_from_checkpoints,
        save_consensus,
    )

    replicas, steps = replicas_from_checkpoints(checkpoint_dir, cfg)
    counts = [len(stage) for stage in replicas]
    step = min(steps)
    save_consensus(path, cfg, [mean_over_replicas(stage) for stage in replicas], metadata={
        "step": str(step), "replicas_per_stage": ",".join(map(str, counts)), "source": source,
        "created": f"{time.time():.3f}"})
    _, model, _ = load_consensus(path)
    loss = validation_loss(model, cfg)
    spreads = [replica_spread(stage) for stage in replicas]
    numels = [sum(t.numel() for t in stage[0]) for stage in replicas]
    return {"step": step, "val_loss": loss, "val_ppl": perplexity(loss),
            "spread": pooled_spread(spreads, numels), "spread_by_stage": spreads,
            "replicas_per_stage": counts, "consensus": str(path)}
