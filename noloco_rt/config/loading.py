"""Reading a config: a TOML file, then NOLOCO_* variables, then --set flags, each coerced
to the field's type and merged over the defaults before the sections validate themselves."""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noloco_rt.config.errors import ConfigError
from noloco_rt.config.prepared_manifest import find_prepared_dir, read_manifest
from noloco_rt.config.schema import SECTIONS, Config
from noloco_rt.process.lifetime import PROCESS_ENV_VARS

ENV_PREFIX = "NOLOCO_"


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


MOVED_FIELDS = {"data.microbatches": "pipeline.max_inflight, the microbatches per inner step of up and "
                                     "simulate alike (one number, so that both train the same tokens)"}
"""Fields a config may still name from an older version: what to set instead."""


def _merge(target: dict[str, dict[str, Any]], layer: Mapping[str, Any], origin: str) -> None:
    for section, values in layer.items():
        if section not in SECTIONS:
            raise ConfigError(section, values, f"unknown section in {origin}; known: {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(section, values, f"must be a table of fields in {origin}")
        known = _field_types(SECTIONS[section])
        for name, value in values.items():
            if f"{section}.{name}" in MOVED_FIELDS:
                raise ConfigError(f"{section}.{name}", value,
                                  f"no longer a field ({origin}): set {MOVED_FIELDS[f'{section}.{name}']}")
            if name not in known:
                raise ConfigError(f"{section}.{name}", value,
                                  f"unknown field in {origin}; {section} has {', '.join(known)}")
            target.setdefault(section, {})[name] = _coerce(f"{section}.{name}", value, known[name])


def _config_variable(key: str) -> tuple[str, str] | None:
    """(section, field) of a NOLOCO_<SECTION>_<FIELD> name, None for any other variable."""
    if not key.startswith(ENV_PREFIX) or key in PROCESS_ENV_VARS:  # those a supervisor sets
        return None
    section, _, name = key[len(ENV_PREFIX):].lower().partition("_")
    return (section, name) if section in SECTIONS and name else None


def env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """NOLOCO_OUTER_ALPHA=0.4 -> {"outer": {"alpha": "0.4"}}. A known section with an unknown
    field is an error (a typo must not be silently ignored); a NOLOCO_ name with no config
    section (a test's or a script's own knob, e.g. NOLOCO_CKPT_KILLS) is not the config's."""
    layer: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if (parsed := _config_variable(key)) is not None:
            section, name = parsed
            layer.setdefault(section, {})[name] = value
    return layer


def foreign_env_vars(environ: Mapping[str, str]) -> list[str]:
    """NOLOCO_* names that are neither config fields' sections nor the supervisor's: worth a
    warning (a misspelt section?), never an abort."""
    return sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in PROCESS_ENV_VARS
                  and _config_variable(k) is None)


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
            data = tomllib.loads(file_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError("--config", str(path), "file does not exist") from None
        except UnicodeDecodeError as exc:
            raise ConfigError("--config", str(path), f"is not UTF-8 text (TOML must be): {exc.reason} "
                              f"at byte {exc.start}") from None
        except OSError as exc:  # a directory, no permission, an I/O error
            raise ConfigError("--config", str(path), f"cannot be read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("--config", str(path), f"is not valid TOML: {exc}") from None
        _merge(merged, data, str(path))
    _merge(merged, env_overrides(os.environ if environ is None else environ), "environment")
    for layer in overrides or []:
        _merge(merged, layer, "command line")
    sections = {name: SECTIONS[name](**merged.get(name, {})) for name in SECTIONS}
    _follow_prepared(sections, set(merged.get("model", {})))
    return Config(**sections)


def _follow_prepared(sections: dict[str, Any], model_fields_set: set[str]) -> None:
    """data.paths naming a `noloco-rt prepare` directory: vocab_size and token_dtype follow
    its manifest, so a run never needs to repeat what the tokenizer already says."""
    data, model = sections["data"], sections["model"]
    if data.source != "tokens":
        return
    directory = find_prepared_dir(data.paths)
    if directory is None:
        return
    manifest = read_manifest(directory)
    if "vocab_size" not in model_fields_set:
        model.vocab_size = manifest.vocab_size
    elif model.vocab_size < manifest.vocab_size:
        raise ConfigError("model.vocab_size", model.vocab_size,
                          f"smaller than the {manifest.vocab_size} tokens of {directory}'s tokenizer; "
                          "leave it unset to follow the tokenizer")
    data.token_dtype = manifest.token_dtype
