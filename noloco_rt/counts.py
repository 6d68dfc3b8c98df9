"""One check for a count read from outside (a message, Redis, the store, a file) (pure)."""

from __future__ import annotations

from typing import Any


def is_count(value: Any, maximum: int | None = None) -> bool:
    """Whether `value` is a non-negative int (at most `maximum` when given). A bool is not one,
    although Python counts it as an int: msgpack and JSON hand back true and false as bools."""
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0
            and (maximum is None or value <= maximum))


def count_in_text(text: Any, *, max_digits: int = 18) -> int | None:
    """The count a text holds (ASCII digits only, at most `max_digits` of them), or None when it
    holds anything else: a Redis value, a metadata entry. str.isdigit alone takes "²", which
    int() refuses."""
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > max_digits:
        return None
    return int(text)
