"""The one typed configuration of a run.

Values flow one way: defaults, then a TOML file, then ``NOLOCO_<SECTION>_<FIELD>``
environment variables, then CLI flags. Every section is a keyword-only dataclass
that validates itself; a bad value raises :class:`ConfigError` naming the field,
the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noloco_rt.net.codec_names import CODECS
from noloco_rt.process import PROCESS_ENV_VARS

ENV_PREFIX = "NOLOCO_"

METHODS = ("noloco", "diloco", "local", "ddp")
ROUTING_POLICIES = ("p2c", "random")
DATA_SOURCES = ("stdlib", "files", "tokens")
TOKEN_DTYPES = ("uint16", "uint32")
LOG_FORMATS = ("auto", "json", "console")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names field, value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {field_name} = {value!r}: {allowed}")


def _require(ok: bool, section: str, name: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{section}.{name}", value, allowed)


def _choice(section: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    _require(value in choices, section, name, value, f"must be one of {', '.join(choices)}")


@dataclass(kw_only=True)
class RunConfig:
    run_id: str = "default"
    """Name of the run; membership keys and wire messages carry it, so runs never mix."""
    seed: int = 0
    """Seed for weights (all replicas of a stage start identical), data order and routing."""
    steps: int = 1000
    """Inner steps to train."""
    eval_every: int = 50
    """Inner steps between evaluations (validation loss, replica spread)."""
    eval_batches: int = 8
    """Validation batches per evaluation."""
    log_format: str = "auto"
    """auto: readable on a terminal, JSON otherwise."""

    def __post_init__(self) -> None:
        _require(bool(self.run_id) and self.run_id.replace("-", "").replace("_", "").isalnum(),
                 "run", "run_id", self.run_id, "letters, digits, '-' and '_' only, not empty")
        _require(self.steps >= 1, "run", "steps", self.steps, "must be >= 1")
        _require(self.eval_every >= 1, "run", "eval_every", self.eval_every, "must be >= 1")
        _require(self.eval_batches >= 1, "run", "eval_batches", self.eval_batches, "must be >= 1")
        _choice("run", "log_format", self.log_format, LOG_FORMATS)


@dataclass(kw_only=True)
class ModelConfig:
    preset: str = "tiny"
    """One of the presets in noloco_rt.model.PRESETS."""
    seq_len: int = 64
    """Tokens per sequence."""
    vocab_size: int = 256
    """256 for the byte-level tokenizer; larger for pre-tokenized data."""

    def __post_init__(self) -> None:
        from noloco_rt.model import PRESETS  # local: model imports torch

        _choice("model", "preset", self.preset, tuple(PRESETS))
        _require(self.seq_len >= 2, "model", "seq_len", self.seq_len, "must be >= 2")
        _require(self.vocab_size >= 2, "model", "vocab_size", self.vocab_size, "must be >= 2")


@dataclass(kw_only=True)
class DataConfig:
    source: str = "stdlib"
    """stdlib: the Python standard library's source; files: text files/globs; tokens: uint16/32 token files."""
    paths: list[str] = field(default_factory=list)
    """Files or globs for source = files or tokens."""
    token_dtype: str = "uint16"
    """Element type of pre-tokenized files."""
    val_percent: float = 5.0
    """Share of files (by path hash) held out for validation."""
    batch_size: int = 8
    """Sequences per microbatch."""
    microbatches: int = 1
    """Microbatches each stage-0 replica feeds per inner step."""

    def __post_init__(self) -> None:
        _choice("data", "source", self.source, DATA_SOURCES)
        _choice("data", "token_dtype", self.token_dtype, TOKEN_DTYPES)
        _require(self.source == "stdlib" or len(self.paths) > 0, "data", "paths", self.paths,
                 f"source = {self.source} needs at least one file or glob")
        _require(0.0 < self.val_percent < 100.0, "data", "val_percent", self.val_percent,
                 "must be between 0 and 100 (exclusive)")
        _require(self.batch_size >= 1, "data", "batch_size", self.batch_size, "must be >= 1")
        _require(self.microbatches >= 1, "data", "microbatches", self.microbatches, "must be >= 1")


@dataclass(kw_only=True)
class OptimConfig:
    """Inner optimizer: AdamW with linear warmup then cosine decay to lr_min."""

    lr: float = 3e-3
    lr_min: float = 3e-4
    warmup_steps: int = 50
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    grad_clip: float = 1.0
    """Max global grad norm per stage; 0 disables clipping."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim", "lr", self.lr, "must be > 0")
        _require(0 <= self.lr_min <= self.lr, "optim", "lr_min", self.lr_min, "must be in [0, optim.lr]")
        _require(self.warmup_steps >= 0, "optim", "warmup_steps", self.warmup_steps, "must be >= 0")
        _require(self.weight_decay >= 0, "optim", "weight_decay", self.weight_decay, "must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            _require(0 <= value < 1, "optim", name, value, "must be in [0, 1)")
        _require(self.grad_clip >= 0, "optim", "grad_clip", self.grad_clip, "must be >= 0")


# Paper defaults per method (DESIGN §1); None in OuterConfig means "use these".
# local reuses noloco's coefficients so that it differs from noloco only by its group.
OUTER_DEFAULTS: dict[str, dict[str, float | int]] = {
    "noloco": {"alpha": 0.5, "beta": 0.7, "h": 50},
    "diloco": {"alpha": 0.3, "beta": 0.7, "h": 100, "gamma": 0.0},
    "local": {"alpha": 0.5, "beta": 0.7, "h": 50},
    "ddp": {"alpha": 0.0, "beta": 0.0, "h": 1, "gamma": 0.0},
}


@dataclass(kw_only=True)
class OuterConfig:
    """The outer step: δ ← α·δ + β·mean Δ + γ·(mean φ − φ_i) every h inner steps."""

    method: str = "noloco"
    alpha: float | None = None
    """Outer momentum; None: the method's paper default."""
    beta: float | None = None
    """Weight of the mean outer gradient; None: the method's paper default."""
    gamma: float | None = None
    """Weight of the pull toward the group's mean slow weights; None: beta for noloco/local, 0 for diloco."""
    h: int | None = None
    """Inner steps per outer step; None: the method's paper default."""
    group_size: int = 2
    """noloco: members per group (i plus group_size - 1 random live peers)."""

    def __post_init__(self) -> None:
        _choice("outer", "method", self.method, METHODS)
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            _require(value is None or (math.isfinite(value) and 0 <= value <= 2), "outer", name,
                     value, "must be a number in [0, 2]")
        _require(self.h is None or self.h >= 1, "outer", "h", self.h, "must be >= 1")
        _require(self.group_size >= 2, "outer", "group_size", self.group_size, "must be >= 2")

    def resolved(self) -> ResolvedOuter:
        """The coefficients actually used, method defaults filled in."""
        defaults = OUTER_DEFAULTS[self.method]
        alpha = self.alpha if self.alpha is not None else float(defaults["alpha"])
        beta = self.beta if self.beta is not None else float(defaults["beta"])
        if self.gamma is not None:
            gamma = self.gamma
        else:
            gamma = float(defaults.get("gamma", beta))
        h = self.h if self.h is not None else int(defaults["h"])
        return ResolvedOuter(method=self.method, alpha=alpha, beta=beta, gamma=gamma, h=h,
                             group_size=self.group_size)


@dataclass(frozen=True, kw_only=True)
class ResolvedOuter:
    method: str
    alpha: float
    beta: float
    gamma: float
    h: int
    group_size: int


@dataclass(kw_only=True)
class PipelineConfig:
    stages: int = 2
    """Pipeline stages the model is cut into (by layer ranges)."""
    replicas: int = 2
    """Replicas per stage (the simulator; live workers decide it in a real run)."""
    max_inflight: int = 4
    """B: forwards a worker accepts before it waits for their gradients and steps."""

    def __post_init__(self) -> None:
        _require(self.stages >= 1, "pipeline", "stages", self.stages, "must be >= 1")
        _require(self.replicas >= 1, "pipeline", "replicas", self.replicas, "must be >= 1")
        _require(self.max_inflight >= 1, "pipeline", "max_inflight", self.max_inflight, "must be >= 1")


@dataclass(kw_only=True)
class RoutingConfig:
    policy: str = "p2c"
    """p2c: two random live candidates, the shorter queue wins; random: uniform."""

    def __post_init__(self) -> None:
        _choice("routing", "policy", self.policy, ROUTING_POLICIES)


@dataclass(kw_only=True)
class NetworkConfig:
    bind_host: str = "127.0.0.1"
    """Interface the worker's sockets bind to."""
    advertise_host: str = ""
    """Address peers use to reach this worker (pod IP, public IP); empty: bind_host."""
    data_port: int = 0
    """0 picks a free port."""
    exchange_port: int = 0
    metrics_port: int = 0
    redis_url: str = ""
    """redis:// or rediss:// URL (password allowed); empty: an embedded local server."""
    curve_key_dir: str = ""
    """Folder with the run's CURVE key pair (<name>.secret, <name>.public from `noloco-rt keys
    generate`, e.g. a mounted Kubernetes Secret); empty and no curve_secret_key: CURVE off."""
    curve_secret_key: str = ""
    """The run's CURVE secret key as z85 text (e.g. NOLOCO_NETWORK_CURVE_SECRET_KEY from a Secret)."""
    curve_public_key: str = ""
    """Optional with curve_secret_key (derived from it); if given it must match."""

    def __post_init__(self) -> None:
        for name in ("data_port", "exchange_port", "metrics_port"):
            value = getattr(self, name)
            _require(0 <= value <= 65535, "network", name, value, "must be a port in [0, 65535]")
        # Syntax only here; files are read and pairs checked where keys are used (noloco_rt.net.curve).
        _require(not (self.curve_key_dir and self.curve_secret_key), "network", "curve_key_dir",
                 self.curve_key_dir, "set either curve_key_dir or curve_secret_key, not both")
        _require(not self.curve_public_key or bool(self.curve_secret_key or self.curve_key_dir), "network",
                 "curve_public_key", self.curve_public_key, "needs curve_secret_key (servers need the secret)")
        for name in ("curve_secret_key", "curve_public_key"):
            value = getattr(self, name).strip()
            shown = "<hidden>" if name == "curve_secret_key" else value
            _require(value == "" or len(value) == 40, "network", name, shown,
                     f"a CURVE key is 40 z85 characters, got {len(value)}")
        _require(self.redis_url == "" or self.redis_url.startswith(("redis://", "rediss://", "unix://")),
                 "network", "redis_url", self.redis_url, "must start with redis://, rediss:// or unix://")


@dataclass(kw_only=True)
class WorkerConfig:
    """Timing and fault-handling knobs of `noloco-rt worker`."""

    heartbeat_interval_s: float = 1.0
    """Membership heartbeat; the record's TTL is 3 heartbeats."""
    exchange_timeout_s: float = 10.0
    """Deadline of one outer exchange request; then another peer is tried."""
    exchange_attempts: int = 3
    """Peers tried at an outer step before falling back to a local step."""
    staleness_outer_steps: int = 1
    """A peer snapshot more than this many outer steps behind is not used."""
    snapshot_codec: str = "shuffle-zstd"
    """Compression of outer-step snapshots."""
    max_retries: int = 3
    """Re-sends of a microbatch to other workers before it is dropped."""
    deadline_floor_s: float = 2.0
    deadline_ceiling_s: float = 30.0
    bootstrap_timeout_s: float = 60.0
    """How long a joiner looks for a peer to download its state from."""
    leave_grace_s: float = 20.0
    """After SIGTERM: time to finish in-flight work and write the last checkpoint."""
    checkpoint_every: int = 1
    """Outer steps between periodic checkpoints (0: only on leave)."""
    max_peer_distance_ratio: float = 2.0
    """A peer's outer-step contribution farther than this from ours, relative to our weight
    norm (noloco_rt.algo.peer_checks), is rejected as "too_far" and the peer blacklisted. Honest
    replicas measured at most 0.06 (h = 5) and 0.27 (h = 50) (benchmarks/peer_distance.py)."""
    fault_scale_snapshot: float = 1.0
    """FAULT INJECTION, for tests and chaos runs only: multiply the outer-step snapshot this
    worker serves by this factor (1.0: off). Its own training is unaffected."""
    fault_nan_snapshot: bool = False
    """FAULT INJECTION, for tests and chaos runs only: serve outer-step snapshots holding NaN."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval_s", "exchange_timeout_s", "deadline_floor_s", "bootstrap_timeout_s",
                     "leave_grace_s"):
            value = getattr(self, name)
            _require(value > 0, "worker", name, value, "must be > 0")
        _require(self.deadline_ceiling_s >= self.deadline_floor_s, "worker", "deadline_ceiling_s",
                 self.deadline_ceiling_s, "must be >= worker.deadline_floor_s")
        _require(self.exchange_attempts >= 1, "worker", "exchange_attempts", self.exchange_attempts, "must be >= 1")
        _require(self.staleness_outer_steps >= 0, "worker", "staleness_outer_steps", self.staleness_outer_steps,
                 "must be >= 0")
        _choice("worker", "snapshot_codec", self.snapshot_codec, CODECS)
        _require(self.max_retries >= 0, "worker", "max_retries", self.max_retries, "must be >= 0")
        _require(self.checkpoint_every >= 0, "worker", "checkpoint_every", self.checkpoint_every, "must be >= 0")
        _require(self.max_peer_distance_ratio > 0, "worker", "max_peer_distance_ratio",
                 self.max_peer_distance_ratio, "must be > 0")
        _require(self.fault_scale_snapshot != 0, "worker", "fault_scale_snapshot", self.fault_scale_snapshot,
                 "must not be 0 (1.0 turns the fault off)")


@dataclass(kw_only=True)
class CoordinatorConfig:
    """`noloco-rt coordinator`: an observer that pulls snapshots, never on the training path."""

    eval_interval_s: float = 10.0
    """Seconds between evaluations of a model assembled from one replica per stage."""
    spread_interval_s: float = 30.0
    """Seconds between pulls of every replica (replica spread, consensus checkpoint)."""
    max_pulls_per_s: float = 2.0
    """Snapshot pulls per second at most, so observing never loads the workers much."""
    pull_timeout_s: float = 10.0
    """Deadline of one snapshot pull."""
    status_port: int = 8780
    """/status (JSON) and /metrics (Prometheus); 0 picks a free port."""

    def __post_init__(self) -> None:
        for name in ("eval_interval_s", "spread_interval_s", "max_pulls_per_s", "pull_timeout_s"):
            value = getattr(self, name)
            _require(value > 0, "coordinator", name, value, "must be > 0")
        _require(0 <= self.status_port <= 65535, "coordinator", "status_port", self.status_port,
                 "must be a port in [0, 65535]")


@dataclass(kw_only=True)
class PathsConfig:
    out_dir: str = "runs/latest"
    """Where a run writes metrics, logs, plots and its config."""
    checkpoint_dir: str = ""
    """Empty: <out_dir>/checkpoints."""

    def __post_init__(self) -> None:
        _require(bool(self.out_dir), "paths", "out_dir", self.out_dir, "must not be empty")


@dataclass(kw_only=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def __post_init__(self) -> None:
        from noloco_rt.model import PRESETS

        layers = PRESETS[self.model.preset].n_layers
        _require(self.pipeline.stages <= layers, "pipeline", "stages", self.pipeline.stages,
                 f"preset {self.model.preset} has {layers} layers, so at most {layers} stages")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


# Section name -> its dataclass, in declaration order.
SECTIONS: dict[str, type] = dict(typing.get_type_hints(Config))


def _field_types(section_cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(section_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(section_cls)}


def _coerce(qualified: str, value: Any, annotation: Any) -> Any:
    """Turn a TOML, environment or flag value into the field's type, or raise ConfigError."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
            return None
        inner = next(a for a in args if a is not type(None))
        return _coerce(qualified, value, inner)
    if origin is list:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            raise ConfigError(qualified, value, "must be a list")
        return [_coerce(qualified, item, args[0]) for item in value]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return value.lower() in ("1", "true", "yes", "on")
        raise ConfigError(qualified, value, "must be true or false")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(qualified, value, "must be an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(qualified, value, "must be an integer")
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(qualified, value, "must be a number")
        if isinstance(value, (int, float)):
            result = float(value)
        elif isinstance(value, str):
            try:
                result = float(value.strip())
            except ValueError:
                raise ConfigError(qualified, value, "must be a number") from None
        else:
            raise ConfigError(qualified, value, "must be a number")
        if not math.isfinite(result):
            raise ConfigError(qualified, value, "must be a finite number")
        return result
    if annotation is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(qualified, value, "must be a string")
        return str(value)
    raise TypeError(f"unsupported config field type {annotation!r} for {qualified}")


def _merge(target: dict[str, dict[str, Any]], layer: Mapping[str, Any], origin: str) -> None:
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(section, values, f"unknown section in {origin}; known: {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(section, values, f"must be a table of fields in {origin}")
        known = _field_types(SECTIONS[section])
        for name, value in values.items():
            if name not in known:
                raise ConfigError(f"{section}.{name}", value,
                                  f"unknown field in {origin}; {section} has {', '.join(known)}")
            target.setdefault(section, {})[name] = _coerce(f"{section}.{name}", value, known[name])


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """NOLOCO_OUTER_ALPHA=0.4 -> {"outer": {"alpha": "0.4"}}. Unknown names are errors."""
    layer: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or key in PROCESS_ENV_VARS:  # those a supervisor sets
            continue
        rest = key[len(ENV_PREFIX):].lower()
        section, _, name = rest.partition("_")
        if section not in SECTIONS or not name:
            raise ConfigError(key, value, "unknown NOLOCO_ variable; expected NOLOCO_<SECTION>_<FIELD> "
                              f"with SECTION in {', '.join(s.upper() for s in SECTIONS)}")
        layer.setdefault(section, {})[name] = value
    return layer


def parse_assignment(text: str) -> dict[str, dict[str, str]]:
    """'outer.alpha=0.4' (a --set flag) -> {"outer": {"alpha": "0.4"}}."""
    key, sep, value = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(text, text, "expected SECTION.FIELD=VALUE, e.g. outer.alpha=0.4")
    return {section: {name: value}}


def load_config(path: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None,
                overrides: list[Mapping[str, Any]] | None = None) -> Config:
    """Defaults <- TOML file <- NOLOCO_* variables <- overrides (CLI flags), then validated."""
    merged: dict[str, dict[str, Any]] = {}
    if path is not None:
        file_path = Path(path)
        try:
            data = tomllib.loads(file_path.read_text())
        except FileNotFoundError:
            raise ConfigError("--config", str(path), "file does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", str(path), f"is not valid TOML: {exc}") from None
        _merge(merged, data, str(path))
    _merge(merged, env_overrides(os.environ if environ is None else environ), "environment")
    for layer in overrides or []:
        _merge(merged, layer, "command line")
    sections = {name: SECTIONS[name](**merged.get(name, {})) for name in SECTIONS}
    return Config(**sections)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def config_to_toml(config: Config) -> str:
    """The effective config as TOML that load_config reads back to an equal Config.

    Fields left to their method default (None) are written as comments with the value in force.
    """
    lines: list[str] = []
    resolved = config.outer.resolved()
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        for name, value in values.items():
            if value is None:
                in_force = getattr(resolved, name, None)
                lines.append(f"# {name} = {_toml_value(in_force)}  (method default)")
            else:
                lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
