"""Sections that say what is trained and how: run, model, data, optim, outer (how
microbatches move between stages: noloco_rt/config/pipeline.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from noloco_rt.config.errors import require, require_choice
from noloco_rt.config.presets import PRESETS

PRECISIONS = ("auto", "float32", "bfloat16")
COMPILE_MODES = ("auto", "on", "off")
COMPILE_SCOPES = ("block", "stage")
CUDA_GRAPHS = ("off", "on")
ACTIVATION_CHECKPOINTING = ("auto", "on", "off")
MAX_VOCAB = 1 << 32
"""Token ids are uint32 on disk and on the wire."""
MAX_SEQ_LEN = 1 << 20
MAX_BATCH = 1 << 16
"""Beyond these one microbatch's activations exceed any device: a typo, refused in one line."""

METHODS = ("noloco", "diloco", "local", "ddp", "adam")
OUTER_PAIRINGS = ("matched", "ready", "random-peer")
OVERLAP_CORRECTIONS = ("provisional", "deferred")
DATA_SOURCES = ("stdlib", "files", "tokens")
TOKEN_DTYPES = ("uint16", "uint32")
LOG_FORMATS = ("auto", "json", "console")


@dataclass(kw_only=True)
class RunConfig:
    """What identifies a run, how long it trains and how it reports."""

    run_id: str = "default"
    """Name of the run; membership keys and wire messages carry it, so runs never mix."""
    seed: int = 0
    """Seed for weights (all replicas of a stage start identical), data order and routing."""
    steps: int = 1000
    """Inner steps to train, counted on the first stage (the data consumed): later stages
    finish when their upstream has."""
    eval_every: int = 50
    """Inner steps between evaluations (validation loss, replica spread)."""
    eval_batches: int = 8
    """Validation batches per evaluation."""
    log_format: str = "auto"
    """auto: readable on a terminal, JSON otherwise."""

    def __post_init__(self) -> None:
        require(bool(self.run_id) and self.run_id.replace("-", "").replace("_", "").isalnum(),
                 "run", "run_id", self.run_id, "letters, digits, '-' and '_' only, not empty")
        require(self.steps >= 1, "run", "steps", self.steps, "must be >= 1")
        require(self.eval_every >= 1, "run", "eval_every", self.eval_every, "must be >= 1")
        require(self.eval_batches >= 1, "run", "eval_batches", self.eval_batches, "must be >= 1")
        require_choice("run", "log_format", self.log_format, LOG_FORMATS)


@dataclass(kw_only=True)
class ModelConfig:
    """The model: a built-in Llama-style preset (its shape, precision and starting weights) or
    your own (factory)."""

    preset: str = "tiny"
    """Model shape (noloco_rt.config.presets.PRESETS): tiny, small, 125m, 1b or 7b."""
    seq_len: int = 64
    """Tokens per sequence."""
    vocab_size: int = 256
    """256 for the byte-level tokenizer; larger for pre-tokenized data."""
    precision: str = "auto"
    """Workers' forward and backward: auto (bfloat16 autocast on CUDA, float32 on CPU),
    float32, or bfloat16 (autocast on any device). Weights, optimizer states and the outer
    step stay float32 either way."""
    compile: str = "auto"
    """torch.compile each transformer block of a worker's stage: auto (on CUDA, where a plain
    loop of the 125m preset ran at 2.2x its eager tokens/s; off on the CPU, where compiling
    takes tens of seconds per worker and gains little at these sizes), on, or off. Blocks are
    compiled one by one (the same code for every block, weights' names unchanged)."""
    compile_scope: str = "block"
    """What model.compile compiles: block (each transformer block on its own: one graph serves
    every block, so compiling costs one block's time whatever the depth) or stage (the whole
    stage as one graph, embedding and head included: fewer, fused launches, and a compile that
    grows with the stage's depth). On the CPU, stage ran 1.1-1.4x faster than block on
    launch-bound tiny stages, no faster on a whole 125m (and compiled for 65 s against 37 s;
    benchmarks/README.md, "Compiling a stage"); not yet measured on a GPU, so block stays the
    default. A model of your own is always compiled whole."""
    cuda_graphs: str = "off"
    """on: what model.compile compiles on CUDA replays as CUDA graphs (torch.compile's
    reduce-overhead mode: one launch per compiled graph instead of one per kernel, for
    host-bound stages). The gradients are then kept in buffers of their own, added to in
    place, and what a graph made is copied before it goes to the wire, since a graph's next
    replay reuses its memory. Needs model.compile auto or on; the CPU compiles as without
    it. off until measured on a GPU (benchmarks/README.md, "gpu-check")."""
    init_from: str = ""
    """Empty: weights from run.seed. Else a consensus .safetensors file or a Hugging Face
    Llama folder of this model's shape that every stage starts from (a worker's own
    checkpoint still wins). Its existence is checked when a run starts, not here: a
    consensus file embeds this config and must stay loadable after the file is gone."""

    activation_checkpointing: str = "auto"
    """Recompute each block in backward instead of keeping its activations (one more forward
    of compute; a block's activations shrink to its input). on, off, or auto: a worker turns it
    on only when its in-flight microbatches would not fit its memory budget without it (the
    CUDA device's share, or worker.memory_budget_gb; noloco_rt.memory.fit), since the recompute
    costs about a third more compute; with no budget (the CPU by default) and in the simulator,
    auto is off."""
    factory: str = ""
    """Empty: the built-in preset. Else your own model: "package.module:function" or
    "path/to/file.py:function", a function of the run's Config returning a
    noloco_rt.model.staged.StagedModel (its stages, loss and data; docs/own-model.md), or
    "hf:PATH", a transformers causal-LM folder (config.json, weights optional) staged
    from transformers' own modules on the run's token data.
    Every worker and the coordinator import it, so it must be importable where they run.
    preset, init_from and activation checkpointing do not apply to it; the memory planning
    (pipeline.max_inflight = 0, `noloco-rt plan`) does to hf:PATH, whose stages it measures."""

    @property
    def hf_folder(self) -> str | None:
        """The transformers folder factory names (hf:PATH), or None."""
        return self.factory[len(HF_PREFIX):] if is_hf_reference(self.factory) else None

    def __post_init__(self) -> None:
        require(not self.factory or _is_factory_reference(self.factory), "model", "factory", self.factory,
                "must be package.module:function, path/to/file.py:function or hf:PATH")
        require(not (self.factory and self.init_from), "model", "init_from", self.init_from,
                "applies to the built-in presets only, not with model.factory")
        require_choice("model", "precision", self.precision, PRECISIONS)
        require_choice("model", "compile", self.compile, COMPILE_MODES)
        require_choice("model", "compile_scope", self.compile_scope, COMPILE_SCOPES)
        require_choice("model", "cuda_graphs", self.cuda_graphs, CUDA_GRAPHS)
        require(not (self.cuda_graphs == "on" and self.compile == "off"), "model", "cuda_graphs", self.cuda_graphs,
                "needs model.compile auto or on: CUDA graphs replay what torch.compile compiled")
        require_choice("model", "activation_checkpointing", self.activation_checkpointing, ACTIVATION_CHECKPOINTING)
        require_choice("model", "preset", self.preset, tuple(PRESETS))
        require(2 <= self.seq_len <= MAX_SEQ_LEN, "model", "seq_len", self.seq_len, f"must be between 2 and {MAX_SEQ_LEN}")
        require(2 <= self.vocab_size <= MAX_VOCAB, "model", "vocab_size", self.vocab_size,
                f"must be between 2 and {MAX_VOCAB} (token ids are stored as uint32)")


HF_PREFIX = "hf:"
"""model.factory naming a transformers folder (noloco_rt/hf_model) rather than code."""


def is_hf_reference(text: str) -> bool:
    return text.startswith(HF_PREFIX)


def _is_factory_reference(text: str) -> bool:
    """module:function, the module dotted or a .py path, the function an identifier; or
    hf:PATH, a transformers model folder."""
    if is_hf_reference(text):
        return bool(text[len(HF_PREFIX):].strip())
    module, sep, function = text.rpartition(":")
    return bool(sep and module.strip() and function.isidentifier())


@dataclass(kw_only=True)
class DataConfig:
    """The corpus stage-0 workers read, and how much of it a step takes."""

    source: str = "stdlib"
    """stdlib: the Python standard library's source; files: text files/globs; tokens: uint16/32 token files."""
    paths: list[str] = field(default_factory=list)
    """Files or globs for source = files or tokens; for tokens also a directory written by
    `noloco-rt prepare` (then its shards, dtype and tokenizer are used)."""
    token_dtype: str = "uint16"
    """Element type of pre-tokenized files (a prepared directory's manifest overrides it)."""
    tokenizer: str = ""
    """tokenizer.json the token ids belong to, for sample; "" = bytes, or the prepared directory's."""
    val_percent: float = 5.0
    """Share of files (by path hash) held out for validation."""
    batch_size: int = 8
    """Sequences per microbatch (pipeline.max_inflight microbatches make an inner step)."""

    def __post_init__(self) -> None:
        require_choice("data", "source", self.source, DATA_SOURCES)
        require_choice("data", "token_dtype", self.token_dtype, TOKEN_DTYPES)
        require(self.source == "stdlib" or len(self.paths) > 0, "data", "paths", self.paths,
                 f"source = {self.source} needs at least one file or glob")
        require(0.0 < self.val_percent < 100.0, "data", "val_percent", self.val_percent,
                 "must be between 0 and 100 (exclusive)")
        require(1 <= self.batch_size <= MAX_BATCH, "data", "batch_size", self.batch_size,
                f"must be between 1 and {MAX_BATCH}")


@dataclass(kw_only=True)
class OptimConfig:
    """Inner optimizer: AdamW with linear warmup then cosine decay to lr_min."""

    lr: float = 3e-3
    """Peak learning rate, reached at the end of warmup."""
    lr_min: float = 3e-4
    """Learning rate at the end of the cosine decay (run.steps)."""
    warmup_steps: int = 50
    """Inner steps of linear warmup from 0 to lr (unless warmup_fraction is set)."""
    warmup_fraction: float | None = None
    """Warmup as a share of run.steps; when set it replaces warmup_steps, so a recipe keeps
    its warmup share at any run length (the paper: 1,000 of 25,000 steps = 0.04)."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay."""
    adam_beta1: float = 0.9
    """AdamW's first-moment decay."""
    adam_beta2: float = 0.95
    """AdamW's second-moment decay (the paper's recipe, configs/paper.toml: 0.999)."""
    grad_clip: float = 1.0
    """Max global grad norm per stage; 0 disables clipping."""

    def __post_init__(self) -> None:
        require(self.lr > 0, "optim", "lr", self.lr, "must be > 0")
        require(0 <= self.lr_min <= self.lr, "optim", "lr_min", self.lr_min, "must be in [0, optim.lr]")
        require(self.warmup_steps >= 0, "optim", "warmup_steps", self.warmup_steps, "must be >= 0")
        require(self.warmup_fraction is None or 0 <= self.warmup_fraction < 1, "optim", "warmup_fraction",
                self.warmup_fraction, "must be in [0, 1), or unset to use warmup_steps")
        require(self.weight_decay >= 0, "optim", "weight_decay", self.weight_decay, "must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            require(0 <= value < 1, "optim", name, value, "must be in [0, 1)")
        require(self.grad_clip >= 0, "optim", "grad_clip", self.grad_clip, "must be >= 0")

    def warmup_steps_for(self, total_steps: int) -> int:
        """Warmup steps of a run of total_steps: round(warmup_fraction · total_steps) when
        warmup_fraction is set, else warmup_steps."""
        if self.warmup_fraction is None:
            return self.warmup_steps
        return round(self.warmup_fraction * total_steps)


# Paper defaults per method (docs/architecture.md §1); None in OuterConfig means "use these".
# local reuses noloco's coefficients so that it differs from noloco only by its group.
# ddp and adam take no outer step; their entries only fill ResolvedOuter.
OUTER_DEFAULTS: dict[str, dict[str, float | int]] = {
    "noloco": {"alpha": 0.5, "beta": 0.7, "h": 50},
    "diloco": {"alpha": 0.3, "beta": 0.7, "h": 100, "gamma": 0.0},
    "local": {"alpha": 0.5, "beta": 0.7, "h": 50},
    "ddp": {"alpha": 0.0, "beta": 0.0, "h": 1, "gamma": 0.0},
    "adam": {"alpha": 0.0, "beta": 0.0, "h": 1, "gamma": 0.0},
}


@dataclass(kw_only=True)
class OuterConfig:
    """The outer step: δ ← α·δ + β·mean Δ + γ·(mean φ − φ_i) every h inner steps."""

    method: str = "noloco"
    """noloco, diloco, local (an outer step with a group of one), ddp (gradients averaged
    every step) or adam (plain Adam per replica, no outer step: the authors' "local")."""
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
    overlap: bool = True
    """Take the outer step at once with a group of one, and correct it exactly when the
    partners' states arrive (docs/architecture.md §4), so training never waits for the network; false:
    the paper's blocking step. The simulator with overlap delays the correction by
    simulated_delay_steps (0: the blocking step exactly)."""
    overlap_correction: str = "provisional"
    """The simulator with overlap: what the inner steps between an outer step and its
    partners' arrival run on. provisional (what workers do): the local step is taken at once
    and corrected exactly later; deferred (an ablation, measured worse at a delay of 4 in
    benchmarks/README.md): the step waits, θ trains on, and the whole group step is taken
    when the partners' states are in, θ keeping its progress since."""
    pairing: str = "matched"
    """noloco: matched (the seeded partition of the stage's view at each outer step, the
    paper's matching), ready (workers pair by readiness through the stage's Redis queue,
    whatever their step count; the seeded partition when Redis is away; pairs only; the
    simulator, in lockstep, treats it as matched) or random-peer (the simulator only, the
    old runtime's pairing for ablations: each replica uses the state of one uniformly
    random other replica; not a matching)."""
    max_delay_steps: int | None = None
    """Workers with overlap: a round not settled this many inner steps after its outer step
    is given up on both sides of the pair (the step stays local, counted dropped_late);
    must be below h. None: h - 1, the next outer step. A round that settles sooner is
    applied sooner: this bounds only late ones (a straggler's partner waiting for its pull),
    where a late correction costs less than none (benchmarks/README.md)."""
    simulated_delay_steps: int = 0
    """The simulator with overlap: inner steps between an outer step and its correction (the
    partners' arrival); must be below h. 0 reproduces the blocking step."""

    def __post_init__(self) -> None:
        require_choice("outer", "method", self.method, METHODS)
        require(self.simulated_delay_steps >= 0, "outer", "simulated_delay_steps", self.simulated_delay_steps,
                 "must be >= 0")
        require_choice("outer", "pairing", self.pairing, OUTER_PAIRINGS)
        require_choice("outer", "overlap_correction", self.overlap_correction, OVERLAP_CORRECTIONS)
        require(self.pairing != "ready" or self.group_size == 2, "outer", "pairing", self.pairing,
                 "pairs by readiness only: needs outer.group_size = 2")
        require(self.max_delay_steps is None or self.max_delay_steps >= 1, "outer", "max_delay_steps",
                self.max_delay_steps, "must be >= 1")
        for name in ("alpha", "beta", "gamma"):
            value = getattr(self, name)
            require(value is None or (math.isfinite(value) and 0 <= value <= 2), "outer", name,
                     value, "must be a number in [0, 2]")
        require(self.h is None or self.h >= 1, "outer", "h", self.h, "must be >= 1")
        require(self.group_size >= 2, "outer", "group_size", self.group_size, "must be >= 2")
        require(self.pairing == "matched" or self.method == "noloco", "outer", "pairing", self.pairing,
                f"needs outer.method = 'noloco', not {self.method!r}")

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
        max_delay = self.max_delay_steps if self.max_delay_steps is not None else h - 1
        return ResolvedOuter(method=self.method, alpha=alpha, beta=beta, gamma=gamma, h=h,
                             group_size=self.group_size, max_delay_steps=max_delay)


@dataclass(frozen=True, kw_only=True)
class ResolvedOuter:
    method: str
    alpha: float
    beta: float
    gamma: float
    h: int
    group_size: int
    max_delay_steps: int
    """With overlap: the latest a round may settle, in inner steps after its outer step (0: h = 1)."""
