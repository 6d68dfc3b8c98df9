"""ConfigError and the two checks every section's __post_init__ is written with."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names field, value and what is allowed."""

    def __init__(self, field_name: str, value: Any, allowed: str) -> None:
        self.field_name = field_name
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid {field_name} = {value!r}: {allowed}")


def require(ok: bool, section: str, name: str, value: Any, allowed: str) -> None:
    """Raise ConfigError for section.name unless ok; `allowed` says what would be valid."""
    if not ok:
        raise ConfigError(f"{section}.{name}", value, allowed)


def require_choice(section: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raise ConfigError for section.name unless value is one of choices."""
    require(value in choices, section, name, value, f"must be one of {', '.join(choices)}")
