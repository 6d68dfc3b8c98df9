"""Sections that say how microbatches move between stages: pipeline (the cut, B, the wire
dtypes) and routing (which next-stage replica takes each)."""

from __future__ import annotations

from dataclasses import dataclass

from noloco_rt.config.choices import GRADIENT_WIRE_DTYPES, WIRE_DTYPES
from noloco_rt.config.errors import require, require_choice

DEFAULT_MAX_INFLIGHT = 4
"""The in-flight count a worker uses where memory allows (pipeline.max_inflight = 0)."""
ROUTING_POLICIES = ("balanced", "p2c", "random")
SIMULATION_ROUTINGS = ("balanced", "balanced-sequence", "local", "fixed", "p2c", "random")
LOCALITIES = ("auto", "labels")


@dataclass(kw_only=True)
class PipelineConfig:
    """How the model is cut into stages and what travels between them."""

    stages: int = 2
    """Pipeline stages the model is cut into (by layer ranges)."""
    replicas: int = 2
    """Replicas per stage (the simulator; live workers decide it in a real run)."""
    max_inflight: int = 0
    """B: microbatches per inner step. Every stage-0 replica feeds B microbatches of
    data.batch_size sequences; a worker accepts (stage 0: originates) B forwards before it
    waits for their gradients and steps. The simulator trains the same B. 0: from memory
    (noloco_rt.memory.fit): 4 where worker.memory_budget_gb holds them (turning activation
    checkpointing on if model.activation_checkpointing = auto and it must), else the most
    that fit, at least 1; on the CPU and in the simulator always 4."""
    wire_dtype: str = "float16"
    """How activations and gradients travel between stages: float32 (exact), bfloat16,
    float16 (default: half the bytes), int8 (activations: int8 with a per-token scale;
    gradients: bfloat16) or int4 (the same at 7 levels a side, two codes a byte). Their
    cost in perplexity, simulated at 2,000 steps over 3 seeds: float16 +0.6 %, int8 +0.9 %,
    int4 +3.9 % (benchmarks/README.md, "Wire dtype of activations and gradients")."""
    gradient_wire_dtype: str = "auto"
    """How gradients travel back between stages: auto (bfloat16 when wire_dtype is int8 or
    int4, otherwise wire_dtype), float32, bfloat16, float16 or int8 (a per-token scale, as
    int8 activations). int8 both ways, simulated as above: +0.6 %, no worse than bfloat16
    gradients at 3 seeds, for 3.8x fewer bytes than float32 each way."""
    simulate_wire_dtype: bool = False
    """The simulator passes activations (forward) and gradients (backward) between stages
    through wire_dtype as workers pack them (true), or hands them on exactly (false: how the
    simulator figures in benchmarks/README.md were made unless they say otherwise). Workers
    always use wire_dtype."""

    def __post_init__(self) -> None:
        require_choice("pipeline", "wire_dtype", self.wire_dtype, WIRE_DTYPES)
        require_choice("pipeline", "gradient_wire_dtype", self.gradient_wire_dtype, GRADIENT_WIRE_DTYPES)
        require(self.stages >= 1, "pipeline", "stages", self.stages, "must be >= 1")
        require(self.replicas >= 1, "pipeline", "replicas", self.replicas, "must be >= 1")
        require(self.max_inflight >= 0, "pipeline", "max_inflight", self.max_inflight,
                "must be >= 1, or 0 to derive it from the memory budget")

    @property
    def microbatches_per_step(self) -> int:
        """B where no device decides it (the simulator, a CPU worker): the explicit number, or
        the default."""
        return self.max_inflight or DEFAULT_MAX_INFLIGHT


@dataclass(kw_only=True)
class RoutingConfig:
    """Which replica of the next stage a microbatch goes to."""

    policy: str = "balanced"
    """Workers. balanced: each origin step's microbatches dealt evenly over the live
    next-stage workers by a step-seeded permutation, a slow one passed over for the p2c
    choice (routing/balanced.py); p2c: two random live candidates, the lower expected cost
    wins (observed round trip × microbatches ahead, routing/next_hop.next_hop_cost);
    random: uniform. Re-sends are always load-aware (p2c)."""
    simulation: str = "balanced"
    """The simulator's routing. balanced: a step-seeded permutation per stage sends every
    replica exactly B (pipeline.max_inflight) microbatches per step; balanced-sequence: the
    same per sequence (the authors' granularity), every replica gets exactly batch_size · B
    sequences; fixed: replica i of stage 0 always feeds replica i of every later stage (no
    routing, the paper's ablation); local: balanced, with each stage's replicas split into
    routing.sites equal sites and only routing.far_share of the microbatches leaving their
    site at each hop (two sites joined by a slow link); p2c / random: each microbatch hops as
    workers route it, so a replica that receives nothing skips its inner step (kept for
    comparison)."""
    sites: int = 1
    """The simulator's sites for routing.simulation = local: each stage's replicas split into
    this many equal groups (pipeline.replicas must divide evenly)."""
    far_share: float = 0.5
    """The share of microbatches sent to another site at each hop: by workers (see
    routing.locality), and by the simulator's local routing. Two sites: 0.5 is what balanced
    routing crosses anyway; 0 keeps every site to itself between outer steps, so only the
    outer exchange mixes them (and a peer judged far by measurement is never measured again)."""
    locality: str = "auto"
    """How a worker tells near next-stage workers from far ones (balanced routing). auto: by
    worker.site where it names one, otherwise by measured links: a peer whose best recent link
    round trip (its own time with the forward taken out) is 2x and 10 ms more than the
    nearest peer's is far (routing/locality.py), and a joiner asks the nearest donor of its
    stage by probed round trips (at step 0 it starts from the seed when every donor is far);
    labels: by worker.site only, a worker without one treats every peer as near."""

    def __post_init__(self) -> None:
        require_choice("routing", "policy", self.policy, ROUTING_POLICIES)
        require_choice("routing", "simulation", self.simulation, SIMULATION_ROUTINGS)
        require_choice("routing", "locality", self.locality, LOCALITIES)
        require(self.sites >= 1, "routing", "sites", self.sites, "must be >= 1")
        require(0.0 <= self.far_share <= 1.0, "routing", "far_share", self.far_share, "must be in [0, 1]")
