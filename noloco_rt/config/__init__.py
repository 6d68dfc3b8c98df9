"""The one typed configuration of a run.

Values flow one way: defaults, then a TOML file, then ``NOLOCO_<SECTION>_<FIELD>``
environment variables, then CLI flags. Every section is a keyword-only dataclass
that validates itself; a bad value raises :class:`ConfigError` naming the field,
the value and what is allowed.

errors      ConfigError and the checks sections validate with
training    what is trained and how: run, model, data, optim, outer, pipeline, routing
runtime     how the processes run: network, worker, coordinator, store, paths
schema      Config, the whole of it, and SECTIONS (name -> section class)
loading     TOML file, NOLOCO_* variables and --set flags, coerced and merged
toml_out    config_to_toml, the effective config written back as TOML
"""

from noloco_rt.config.errors import ConfigError
from noloco_rt.config.loading import ENV_PREFIX, env_overrides, load_config, parse_assignment
from noloco_rt.config.pipeline import (
    ROUTING_POLICIES,
    SIMULATION_ROUTINGS,
    PipelineConfig,
    RoutingConfig,
)
from noloco_rt.config.runtime import (
    CoordinatorConfig,
    NetworkConfig,
    PathsConfig,
    StoreConfig,
    WorkerConfig,
)
from noloco_rt.config.schema import SECTIONS, Config
from noloco_rt.config.toml_out import config_to_toml
from noloco_rt.config.training import (
    DATA_SOURCES,
    LOG_FORMATS,
    METHODS,
    OUTER_DEFAULTS,
    TOKEN_DTYPES,
    DataConfig,
    ModelConfig,
    OptimConfig,
    OuterConfig,
    ResolvedOuter,
    RunConfig,
)

__all__ = [
    "DATA_SOURCES",
    "ENV_PREFIX",
    "LOG_FORMATS",
    "METHODS",
    "OUTER_DEFAULTS",
    "ROUTING_POLICIES",
    "SECTIONS",
    "SIMULATION_ROUTINGS",
    "TOKEN_DTYPES",
    "Config",
    "ConfigError",
    "CoordinatorConfig",
    "DataConfig",
    "ModelConfig",
    "NetworkConfig",
    "OptimConfig",
    "OuterConfig",
    "PathsConfig",
    "PipelineConfig",
    "ResolvedOuter",
    "RoutingConfig",
    "RunConfig",
    "StoreConfig",
    "WorkerConfig",
    "config_to_toml",
    "env_overrides",
    "load_config",
    "parse_assignment",
]
