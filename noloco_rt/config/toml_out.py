"""Writing a config back out as TOML (`noloco-rt config show`, a run's saved config)."""

from __future__ import annotations

import dataclasses
from typing import Any

from noloco_rt.config.redaction import redact_url
from noloco_rt.config.schema import SECTIONS, Config, is_fault_injection


def toml_value(value: Any) -> str:
    """One value as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


SECRET_FIELDS = frozenset({("network", "curve_secret_key")})
URL_FIELDS = frozenset({("network", "redis_url"), ("store", "url")})


def _redacted_line(section: str, name: str, value: Any) -> str | None:
    """The line that stands for a secret when redacting, or None for a field that holds none."""
    if (section, name) in SECRET_FIELDS and value:
        return f"# {name} = (set, {len(value)} characters: redacted; --show-secrets prints it)"
    if (section, name) in URL_FIELDS and value:
        shown = redact_url(value)
        return None if shown == value else f"{name} = {toml_value(shown)}  # password redacted"
    return None


def _fault_off(section: str, name: str, value: Any) -> bool:
    """A fault-injection knob at its default (the fault off): left out, it reads back the same."""
    if not is_fault_injection(name):
        return False
    default = {f.name: f.default for f in dataclasses.fields(SECTIONS[section])}[name]
    return value == default


def config_to_toml(config: Config, *, redact: bool = False) -> str:
    """The effective config as TOML that load_config reads back to an equal Config.

    Unset fields (None) are written as comments: outer ones with the method default in force.
    Fault-injection knobs (schema.is_fault_injection) appear only when a fault is on.
    redact: for a person's eyes, the CURVE secret key becomes a comment and the Redis
    password *** (the result no longer reads back to an equal Config).
    """
    lines: list[str] = []
    resolved = config.outer.resolved()
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        for name, value in values.items():
            if _fault_off(section, name, value):
                continue
            if redact and (line := _redacted_line(section, name, value)) is not None:
                lines.append(line)
            elif value is None and section == "outer":
                lines.append(f"# {name} = {toml_value(getattr(resolved, name))}  (method default)")
            elif value is None:
                lines.append(f"# {name} unset")
            else:
                lines.append(f"{name} = {toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
