"""Writing a config back out as TOML (`noloco-rt config show`, a run's saved config)."""

from __future__ import annotations

from typing import Any

from noloco_rt.config.schema import Config


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

    Unset fields (None) are written as comments: outer ones with the method default in force.
    """
    lines: list[str] = []
    resolved = config.outer.resolved()
    for section, values in config.to_dict().items():
        lines.append(f"[{section}]")
        for name, value in values.items():
            if value is None and section == "outer":
                lines.append(f"# {name} = {_toml_value(getattr(resolved, name))}  (method default)")
            elif value is None:
                lines.append(f"# {name} unset")
            else:
                lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)
