"""What the memory plan is asked about (pure): the run's settings, and a stage that was
measured instead of derived (an hf:PATH model)."""

from __future__ import annotations

from dataclasses import dataclass

from noloco_rt.config.presets import PRESETS, ModelShape
from noloco_rt.memory.sizes import CODEC_BYTES, PRECISION_BYTES, WIRE_BYTES


@dataclass(frozen=True)
class MeasuredStage:
    """One stage of a model measured rather than derived: bytes from a run on fake tensors."""

    params: int
    layers: int
    width: int
    """The stage's output features (what a wire copy carries per token)."""
    activations_fixed: int
    """What a microbatch's graph keeps whatever its size (autocast's weight casts)."""
    activations_per_sequence: int
    """What it keeps per sequence of model.seq_len tokens: saved tensors, the output, the ids."""
    backward_fixed: int
    """The first backward's peak beyond the lasting state, counting that microbatch's own
    activations and the gradients it allocates: the part fixed per microbatch..."""
    backward_per_sequence: int
    """...and the part per sequence."""

    def activations(self, sequences: int) -> int:
        return self.activations_fixed + sequences * self.activations_per_sequence

    def first_backward(self, sequences: int) -> int:
        return self.backward_fixed + sequences * self.backward_per_sequence


@dataclass(frozen=True, kw_only=True)
class PlanSettings:
    """What the estimate depends on besides the model's shape."""

    preset: str
    stages: int
    micro_batch: int
    """Sequences per microbatch (data.batch_size)."""
    seq_len: int
    vocab_size: int
    precision: str
    """float32 or bfloat16 (autocast): already resolved for the device."""
    activation_checkpointing: bool
    max_inflight: int
    wire_dtype: str = "float16"
    snapshot_codec: str = "int8-zstd"
    group_size: int = 2
    theta_only: bool = True
    """The outer exchange sends θ alone (γ = β) rather than φ and Δ."""
    error_feedback: bool = False
    """worker.delta_codec with its error feedback: one more copy of the stage (what is unsent)."""
    device: str = "cpu"
    """cpu: everything is one memory. cuda: the peak is the device's; the exchange's host
    copies and the wire copies are host memory (StageMemory.host)."""
    measured: tuple[MeasuredStage, ...] = ()
    """A model's stages measured (hf:PATH), one per stage; the preset is then not used."""

    def __post_init__(self) -> None:
        if self.measured:
            if len(self.measured) != self.stages:
                raise ValueError(f"{len(self.measured)} measured stages for stages = {self.stages}")
        elif self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}: one of {', '.join(PRESETS)}")
        elif not 1 <= self.stages <= PRESETS[self.preset].n_layers:
            raise ValueError(f"stages must be in [1, {PRESETS[self.preset].n_layers}] for preset {self.preset}, "
                             f"got {self.stages}")
        for name in ("micro_batch", "seq_len", "vocab_size", "max_inflight", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.precision not in PRECISION_BYTES:
            raise ValueError(f"precision must be float32 or bfloat16, got {self.precision!r}")
        if self.wire_dtype not in WIRE_BYTES:
            raise ValueError(f"wire_dtype must be one of {', '.join(WIRE_BYTES)}, got {self.wire_dtype!r}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.snapshot_codec not in CODEC_BYTES:
            raise ValueError(f"snapshot_codec must be one of {', '.join(CODEC_BYTES)}, got {self.snapshot_codec!r}")

    @property
    def shape(self) -> ModelShape:
        return PRESETS[self.preset]

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch."""
        return self.micro_batch * self.seq_len
