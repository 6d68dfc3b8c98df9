"""Sections that say how the processes run: network, worker, coordinator, store, paths."""

from __future__ import annotations

import math
from dataclasses import dataclass

from noloco_rt.config.choices import DELTA_CODECS, SITE_PATTERN, SNAPSHOT_CODECS
from noloco_rt.config.errors import require, require_choice
from noloco_rt.config.redaction import redact_url

MIN_BANDWIDTH_MBIT_S = 0.01


@dataclass(kw_only=True)
class NetworkConfig:
    """Addresses, ports, Redis and CURVE keys of every process."""

    bind_host: str = "127.0.0.1"
    """Interface a worker's sockets (and the coordinator's /status) bind to; 0.0.0.0 for all.
    The default reaches only this machine: set it, and advertise_host, for several machines."""
    advertise_host: str = ""
    """Address peers use to reach this worker (pod IP, the node's IP, a router's public IP),
    published in Redis with its ports; empty: bind_host."""
    data_port: int = 0
    """TCP port of the worker's data socket (activations in, gradients in), which workers of
    the neighbouring stages connect to; 0: a free port in 20000-60000."""
    exchange_port: int = 0
    """TCP port of the worker's exchange socket (outer-step pushes, joiners' downloads,
    the coordinator's pulls), which workers of its own stage and the coordinator connect to;
    0: a free port in 20000-60000."""
    advertise_data_port: int = 0
    """Port peers reach the data socket at when it is not the bound one: a router or NAT that
    forwards this public port to data_port (set data_port then); 0: the bound port."""
    advertise_exchange_port: int = 0
    """The same for the exchange socket (forwarded to exchange_port); 0: the bound port."""
    metrics_port: int = 0
    """Port of the worker's Prometheus /metrics; 0: a free port (logged as metrics_serving)."""
    redis_url: str = ""
    """redis:// or rediss:// URL (password allowed); empty: an embedded local server."""
    redis_password_file: str = ""
    """A file whose first line is Redis's password (e.g. a mounted Kubernetes Secret), used when
    redis_url carries none: the password then shows in no URL, environment or `ps`."""
    redis_tls_ca_file: str = ""
    """With a rediss:// URL: the CA that signed Redis's certificate (PEM); empty: the system's CAs."""
    redis_tls_cert_file: str = ""
    """With a rediss:// URL and a Redis that asks for client certificates: ours (PEM)..."""
    redis_tls_key_file: str = ""
    """...and its private key (PEM). Both or neither."""
    curve_key_dir: str = ""
    """Folder with the run's CURVE key pair (<name>.secret, <name>.public from `noloco-rt keys
    generate`, e.g. a mounted Kubernetes Secret); empty and no curve_secret_key: CURVE off."""
    curve_secret_key: str = ""
    """The run's CURVE secret key as z85 text (e.g. NOLOCO_NETWORK_CURVE_SECRET_KEY from a Secret)."""
    curve_public_key: str = ""
    """Optional with curve_secret_key (derived from it); if given it must match."""
    trusted_network: bool = False
    """A worker bound beyond loopback (bind_host not 127.x, ::1 or localhost) without CURVE
    keys refuses to start unless this is true: anyone who reaches its ports could then feed it
    microbatches and snapshots (poison the model) and download its weights. Set it only on a
    network nobody else reaches."""

    def __post_init__(self) -> None:
        shown_url = redact_url(self.redis_url)  # never echo a password
        tls = {n: getattr(self, n) for n in ("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")}
        if any(tls.values()) and self.redis_url:  # empty: given by the environment (a run dir's config.toml)
            require(self.redis_url.startswith("rediss://"), "network", "redis_url", shown_url,
                    "the redis_tls_* files need a rediss:// URL (TLS)")
        require(bool(self.redis_tls_cert_file) == bool(self.redis_tls_key_file), "network", "redis_tls_key_file",
                self.redis_tls_key_file, "set redis_tls_cert_file and redis_tls_key_file together")
        for name in ("data_port", "exchange_port", "metrics_port", "advertise_data_port", "advertise_exchange_port"):
            value = getattr(self, name)
            require(0 <= value <= 65535, "network", name, value, "must be a port in [0, 65535]")
        for kind in ("data", "exchange"):  # a forwarded port must know where it leads
            require(not getattr(self, f"advertise_{kind}_port") or bool(getattr(self, f"{kind}_port")), "network",
                    f"advertise_{kind}_port", getattr(self, f"advertise_{kind}_port"),
                    f"needs a fixed {kind}_port: the port it forwards to (a free one is new at every start)")
        # Syntax only here; files are read and pairs checked where keys are used (noloco_rt.net.curve).
        require(not (self.curve_key_dir and self.curve_secret_key), "network", "curve_key_dir",
                 self.curve_key_dir, "set either curve_key_dir or curve_secret_key, not both")
        require(not self.curve_public_key or bool(self.curve_secret_key or self.curve_key_dir), "network",
                 "curve_public_key", self.curve_public_key, "needs curve_secret_key (servers need the secret)")
        for name in ("curve_secret_key", "curve_public_key"):
            value = getattr(self, name).strip()
            shown = "<hidden>" if name == "curve_secret_key" else value
            require(value == "" or len(value) == 40, "network", name, shown,
                     f"a CURVE key is 40 z85 characters, got {len(value)}")
        require(self.redis_url == "" or self.redis_url.startswith(("redis://", "rediss://", "unix://")),
                 "network", "redis_url", shown_url, "must start with redis://, rediss:// or unix://")


@dataclass(kw_only=True)
class WorkerConfig:
    """Timing and fault-handling knobs of `noloco-rt worker`."""

    heartbeat_interval_s: float = 1.0
    """Membership heartbeat; the record's TTL is 3 heartbeats."""
    view_refresh_s: float = 0.0
    """Seconds between background reads of the stages a worker talks to (its own and the
    next); 0: grows with the fleet (0.5 s up to 2,500 workers, 2 s at 10,000)."""
    exchange_timeout_s: float = 10.0
    """How long an outer round waits for the partners' pushes (and a push for its
    acknowledgement); then the step goes on without them."""
    snapshot_codec: str = "int8-zstd"
    """Compression of outer-step snapshots: lossless raw, zstd, shuffle-zstd, or lossy
    bf16-shuffle-zstd, int8-zstd (default: 3.9x fewer bytes, +0.3 % ppl at 2,000 steps),
    int4-zstd (7.8x, +5 %), int2-zstd (17.7x, diverges): blockwise, stochastic rounding; each
    side averages with its own snapshot as the other decoded it. Bootstraps always travel
    lossless."""
    delta_codec: str = ""
    """Sparse outer exchange, an experiment (docs/architecture.md §4, "Fewer bytes"): at outer
    steps that are not a multiple of theta_every, partners send only their outer gradient Δ
    (plus what earlier rounds did not send: error feedback) with this codec, topk2-zstd or
    topk4-zstd (about 140x fewer bytes), average Δ alone, and step with what they sent; every
    theta_every-th step they send their whole state with snapshot_codec. Measured far worse
    than the default at H = 50 (benchmarks/README.md). "" (off, default): every step sends
    the whole state."""
    theta_every: int = 8
    """With delta_codec: every theta_every-th outer step exchanges the whole state (θ, or φ and
    Δ), which pulls the replicas' slow weights together (γ)."""
    error_feedback: bool = True
    """With delta_codec: what Δ's codec left out is added to the next Δ sent (reset when the
    whole state is sent: it carries everything)."""
    snapshot_chunk_mb: float = 4.0
    """Outer-step snapshots stream in chunks of about this many raw MB, each compressed and
    sent on its own, so compressing, sending and decoding overlap."""
    snapshot_encode_threads: int = 2
    """Threads compressing a snapshot's chunks at once (off the training thread)."""
    memory_budget_gb: float = 0.0
    """Memory (GB, 10^9 bytes) one worker may use for its stage, for pipeline.max_inflight = 0 and
    model.activation_checkpointing = auto. 0: on CUDA the device's total memory divided by the
    workers sharing it (LOCAL_WORLD_SIZE over the device count), on the CPU no budget
    (4 in flight, checkpointing off: today's behaviour)."""
    max_retries: int = 3
    """Re-sends of a microbatch to other workers before it is dropped."""
    deadline_floor_s: float = 2.0
    """Shortest wait for a microbatch's gradient before it is re-sent; the deadline is 4x the
    95th percentile of observed round trips, clamped to [deadline_floor_s, deadline_ceiling_s]."""
    deadline_ceiling_s: float = 30.0
    """Longest wait for a microbatch's gradient before it is re-sent (see deadline_floor_s)."""
    bootstrap_timeout_s: float = 60.0
    """How long a joiner looks for a peer to download its state from (a floor: a large stage
    on a slow link gets longer, see min_bandwidth_mbit_s)."""
    min_bandwidth_mbit_s: float = 200.0
    """The slowest link between two workers this run must tolerate. The outer exchange and the
    bootstrap download get at least the time their stage's bytes take at this rate, with a
    3x margin (noloco_rt.transfer_time), so a 1b stage is not cut off by a fixed 10 s."""
    allow_reseed: bool = False
    """A worker that finds no live peer of its stage while the run's stage is past outer step 0
    (its high-water mark in Redis) exits 3 instead of starting the stage from the seed; true:
    restart the stage from scratch anyway."""
    redis_wait_s: float = 120.0
    """At start, how long a worker (or the coordinator) retries an unreachable Redis, warning
    every 5 s, before it exits 2 (on Kubernetes Redis may start after the workers). An outage
    later in the run never stops training: workers use their cached view."""
    upstream_lost_s: float = 600.0
    """A later stage finishes once its upstream stage marked itself finished and has no live
    worker. An upstream stage that vanished without finishing (every machine of it reclaimed)
    is waited for, however long, so its replacements, resuming from the durable store, find a
    downstream: a run never ends short of run.steps. Every this many seconds of such a wait a
    warning (`upstream_lost`) says so."""
    upstream_gone_s: float = 5.0
    """A later stage finishes once its upstream stage, marked finished, has had no live worker
    for this long: a margin for an upstream worker that restarts and trains on."""
    leave_grace_s: float = 20.0
    """After SIGTERM: time to finish in-flight work and write the last checkpoint."""
    forked_start: bool = True
    """The workers (and coordinator) that `up`, `launch` and `chaos` supervise are forked from a
    process that has already imported torch and the worker's modules: each start and restart
    skips ~2.5 s of a core of imports. False: each starts a fresh interpreter."""
    checkpoint_every: int = 0
    """Outer steps between the worker's checkpoints (0, the default: none counted in steps,
    only checkpoint_interval_s). Peers and the durable store already hold a stage's state, so
    a checkpoint at every outer step is housekeeping on the hot path that buys little. They
    are written off the training thread; one due while the previous write still runs is skipped."""
    checkpoint_interval_s: float = 300.0
    """A checkpoint is due at the first outer step this long after the last completed write
    (0: off), so a worker that crashes with no live peer loses at most about five minutes of
    work; at that pace even a 1b stage's state (about 12 GB with its optimizer) asks some
    40 MB/s of a disk. The final checkpoint (finished, or leaving on SIGTERM) is always written."""
    checkpoint_keep: int = 1
    """Checkpoints a worker keeps: <name>.pt, the newest, then <name>.pt.1 ... older ones
    (each a full copy of the state: mind the disk). A resume that cannot read the newest
    falls back to an older one. A write that fails (a full disk) is counted
    (noloco_checkpoint_failures_total) and training goes on with the last good one."""
    left_exit_code: int = 0
    """Exit status of a worker that left on SIGTERM before its steps were done. 0 on bare
    metal; Kubernetes Jobs use 75 so a preempted pod is replaced, not counted as completed."""
    alive_file: str = ""
    """A file the training loop touches about once a second (empty: none). A liveness probe
    that finds it stale knows the loop hung, not merely that the worker waits for data."""
    max_peer_distance_ratio: float = 2.0
    """A peer's outer-step contribution farther than this from ours, relative to our weight
    norm (noloco_rt.outer.peer_checks), is rejected as "too_far" and the peer blacklisted. Honest
    replicas measured at most 0.06 (h = 5) and 0.27 (h = 50) (benchmarks/peer_distance.py)."""
    fault_scale_snapshot: float = 1.0
    """FAULT INJECTION, for tests and chaos runs only: multiply the outer-step snapshot this
    worker serves by this factor (1.0: off). Its own training is unaffected."""
    fault_nan_snapshot: bool = False
    """FAULT INJECTION, for tests and chaos runs only: serve outer-step snapshots holding NaN."""
    fault_slowdown: float = 1.0
    """FAULT INJECTION, for tests and chaos runs only: a slower GPU. After each inner step's
    compute the worker idles (factor - 1) times that step's training time, not the time its
    outer step or checkpoint held the training thread (1.0: off)."""
    peer_backoff_max_s: float = 60.0
    """A peer that failed an exchange, a forward or a bootstrap is avoided for 1 s, doubling
    with each failure in a row, at most this long: after a network partition heals, peers
    across it may wait up to this long before they pair again."""
    site: str = ""
    """Where this worker runs (a data centre, region or cloud zone: letters, digits, '.', '_'
    and '-', at most 63). Workers that name their sites keep most microbatches among the next
    stage's workers of their own site and send routing.far_share of them to other sites, so
    fewer bytes cross the slow links between sites (balanced routing only). Empty: near and
    far are told by measured links (routing.locality)."""
    count_host_reads: bool = False
    """DIAGNOSTIC: count the training thread's reads of device values (each a host
    synchronisation on a GPU) and log them as host_reads on every train_progress line, the
    reads of the line itself excluded. It slows every tensor operation: for tests and for
    finding a stall, not for training."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval_s", "exchange_timeout_s", "deadline_floor_s", "bootstrap_timeout_s",
                     "leave_grace_s", "upstream_lost_s", "upstream_gone_s"):
            value = getattr(self, name)
            require(value > 0, "worker", name, value, "must be > 0")
        require(self.deadline_ceiling_s >= self.deadline_floor_s, "worker", "deadline_ceiling_s",
                 self.deadline_ceiling_s, "must be >= worker.deadline_floor_s")
        require(math.isfinite(self.redis_wait_s) and self.redis_wait_s >= 0, "worker", "redis_wait_s",
                self.redis_wait_s, "must be >= 0 seconds")
        require(self.view_refresh_s >= 0, "worker", "view_refresh_s", self.view_refresh_s, "must be >= 0 (0: auto)")
        require_choice("worker", "snapshot_codec", self.snapshot_codec, SNAPSHOT_CODECS)
        if self.delta_codec:
            require_choice("worker", "delta_codec", self.delta_codec, DELTA_CODECS)
        require(1 <= self.theta_every <= 1_000_000, "worker", "theta_every", self.theta_every,
                "must be between 1 and 1,000,000")
        require(math.isfinite(self.snapshot_chunk_mb) and self.snapshot_chunk_mb >= 0.01, "worker",
                "snapshot_chunk_mb", self.snapshot_chunk_mb, "must be >= 0.01")
        require(1 <= self.snapshot_encode_threads <= 64, "worker", "snapshot_encode_threads",
                self.snapshot_encode_threads, "must be between 1 and 64")
        # Below a dial-up modem's rate the deadlines it implies run to days: a typo, not a link.
        require(math.isfinite(self.min_bandwidth_mbit_s) and self.min_bandwidth_mbit_s >= MIN_BANDWIDTH_MBIT_S,
                "worker", "min_bandwidth_mbit_s", self.min_bandwidth_mbit_s, f"must be >= {MIN_BANDWIDTH_MBIT_S}")
        require(math.isfinite(self.peer_backoff_max_s) and self.peer_backoff_max_s >= 1.0, "worker",
                "peer_backoff_max_s", self.peer_backoff_max_s, "must be >= 1 second")
        require(SITE_PATTERN.fullmatch(self.site) is not None, "worker", "site", self.site,
                "must be at most 63 letters, digits, '.', '_' or '-'")
        require(0 <= self.left_exit_code <= 125, "worker", "left_exit_code", self.left_exit_code,
                "must be an exit status in [0, 125]")
        require(math.isfinite(self.memory_budget_gb) and self.memory_budget_gb >= 0, "worker", "memory_budget_gb",
                self.memory_budget_gb, "must be >= 0 (0: the device's memory)")
        require(self.max_retries >= 0, "worker", "max_retries", self.max_retries, "must be >= 0")
        require(self.checkpoint_every >= 0, "worker", "checkpoint_every", self.checkpoint_every, "must be >= 0")
        require(math.isfinite(self.checkpoint_interval_s) and self.checkpoint_interval_s >= 0, "worker",
                "checkpoint_interval_s", self.checkpoint_interval_s, "must be >= 0 seconds (0: off)")
        require(self.checkpoint_keep >= 1, "worker", "checkpoint_keep", self.checkpoint_keep, "must be >= 1")
        require(self.max_peer_distance_ratio > 0, "worker", "max_peer_distance_ratio",
                 self.max_peer_distance_ratio, "must be > 0")
        require(math.isfinite(self.fault_slowdown) and self.fault_slowdown >= 1.0, "worker", "fault_slowdown",
                 self.fault_slowdown, "must be >= 1 (1.0 turns the fault off)")
        require(self.fault_scale_snapshot != 0, "worker", "fault_scale_snapshot", self.fault_scale_snapshot,
                 "must not be 0 (1.0 turns the fault off)")


@dataclass(kw_only=True)
class CoordinatorConfig:
    """`noloco-rt coordinator`: an observer that pulls snapshots, never on the training path."""

    eval_interval_s: float = 10.0
    """Seconds between evaluations of a model assembled from one replica per stage (one that
    found no replica to pull is tried again after 1 s)."""
    spread_interval_s: float = 30.0
    """Seconds between spread measurements (replica spread, consensus checkpoint; one that
    found no replica to pull is tried again after 1 s)."""
    spread_sample: int = 8
    """Replicas per stage pulled at random for a spread measurement and the consensus; a stage
    with this many or fewer is pulled whole (exact), a larger one gives an estimate with a 95%
    interval (noloco_rt.algo.spread_sample)."""
    max_pulls_per_s: float = 2.0
    """Snapshot pulls per second at most, so observing never loads the workers much."""
    pull_timeout_s: float = 10.0
    """Deadline of one snapshot pull."""
    status_port: int = 8780
    """The live page (/), /status (JSON) and /metrics (Prometheus); 0 picks a free port."""
    status_host: str = "127.0.0.1"
    """Where status_port listens. Loopback by default: CURVE does not cover this port, so it
    is not exposed unless you say so (the Kubernetes manifests pass `coordinator --host
    0.0.0.0` behind their Service); reach it from elsewhere through an SSH tunnel or your
    own access control."""
    exit_when_finished: bool = True
    """Once the run finished and its final model is made: exit 0. False: keep serving /status
    (with `final`) and /metrics until stopped, as a Kubernetes Deployment needs (it restarts a
    container that exits)."""

    def __post_init__(self) -> None:
        for name in ("eval_interval_s", "spread_interval_s", "max_pulls_per_s", "pull_timeout_s"):
            value = getattr(self, name)
            require(value > 0, "coordinator", name, value, "must be > 0")
        require(self.spread_sample >= 2, "coordinator", "spread_sample", self.spread_sample, "must be >= 2")
        require(0 <= self.status_port <= 65535, "coordinator", "status_port", self.status_port,
                 "must be a port in [0, 65535]")
        require(bool(self.status_host.strip()), "coordinator", "status_host", self.status_host,
                "must be a host name or address to listen on")


@dataclass(kw_only=True)
class StoreConfig:
    """Durable run state that outlives every worker (docs/architecture.md §5): stage
    checkpoints a stage resumes from when all its replicas died, and the consensus."""

    url: str = ""
    """A folder (a PersistentVolumeClaim's mount, a local path) or an fsspec URL (file://,
    s3://, gs://: the matching fsspec package must be installed); empty: no durable store."""
    every: int = 5
    """Outer steps between stage checkpoints; one replica per stage writes each."""
    keep: int = 2
    """Stage checkpoints kept per stage (older ones are deleted once a newer one is complete)."""

    def __post_init__(self) -> None:
        require(self.every >= 1, "store", "every", self.every, "must be >= 1 outer step")
        require(self.keep >= 1, "store", "keep", self.keep, "must be >= 1")
        require("://" not in self.url or self.url.split("://", 1)[0].isidentifier(), "store", "url",
                self.url, "must be a folder or a URL like file:///data, s3://bucket/prefix")


@dataclass(kw_only=True)
class PathsConfig:
    """Where a run's files go on this machine."""

    out_dir: str = "runs/latest"
    """Where a run writes metrics, logs, plots and its config."""
    checkpoint_dir: str = ""
    """Empty: <out_dir>/checkpoints."""

    def __post_init__(self) -> None:
        require(bool(self.out_dir), "paths", "out_dir", self.out_dir, "must not be empty")
