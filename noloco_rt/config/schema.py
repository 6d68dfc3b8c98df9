"""The whole config: one field per section, and the checks that span sections."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from noloco_rt.config.errors import require
from noloco_rt.config.pipeline import PipelineConfig, RoutingConfig
from noloco_rt.config.presets import PRESETS
from noloco_rt.config.runtime import (
    CoordinatorConfig,
    NetworkConfig,
    PathsConfig,
    StoreConfig,
    WorkerConfig,
)
from noloco_rt.config.training import DataConfig, ModelConfig, OptimConfig, OuterConfig, RunConfig


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
    store: StoreConfig = field(default_factory=StoreConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def __post_init__(self) -> None:
        if self.routing.simulation == "local":
            require(self.pipeline.replicas % self.routing.sites == 0, "routing", "sites", self.routing.sites,
                    f"must divide pipeline.replicas = {self.pipeline.replicas} (equal sites)")
        if self.model.factory:  # your own model: its StagedModel says how many stages it has
            return
        layers = PRESETS[self.model.preset].n_layers
        require(self.pipeline.stages <= layers, "pipeline", "stages", self.pipeline.stages,
                 f"preset {self.model.preset} has {layers} layers, so at most {layers} stages")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return dataclasses.asdict(self)


# Section name -> its dataclass, in declaration order.
SECTIONS: dict[str, type] = dict(typing.get_type_hints(Config))

FAULT_INJECTION_PREFIX = "fault_"
"""Fields named so (worker.fault_slowdown, ...) inject faults for tests and `noloco-rt chaos`
(docs/testing.md): settable like any field, but left out of `config show` while off and out
of the configuration reference."""


def is_fault_injection(name: str) -> bool:
    """Whether the field `name` of any section is a fault-injection knob (not a user's setting)."""
    return name.startswith(FAULT_INJECTION_PREFIX)
