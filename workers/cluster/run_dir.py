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
from noloco_rt.logs import read_json_lines

# Sections that must match for checkpoints in a run directory to be reusable.
_MUST_MATCH = ("model", "pipeline", "data", "optim", "outer")


class RunDirError(ValueError):
    """The run directory cannot be used for this configuration."""


def prepare_run_dir(out: Path, cfg: Config) -> Path:
    """Create `out` (or accept one of the same run) and write config.toml; returns its path."""
    config_path = out / "config.toml"
    # No secret in the file: the Redis URL is left out and the CURVE secret and a store URL's
    # password redacted; the processes get them from the environment (processes.child_env).
    new_text = config_to_toml(dataclasses.replace(cfg, network=dataclasses.replace(
        cfg.network, redis_url="", curve_secret_key="")), redact=True)
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
    return read_json_lines(path)[0]
