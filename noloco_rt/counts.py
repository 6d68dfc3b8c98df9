"""One check for a count read from outside (a message, Redis, the store, a file) (pure)."""

from __future__ import annotations

from typing import Any


def is_count(value: Any, maximum: int | None = None) -> bool:
    """Whether `value` is a non-negative int (at most `maximum` when given). A bool is not one,
    although Python counts it as an int: msgpack and JSON hand back true and false as bools."""
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0
            and (maximum is None or value <= maximum))
