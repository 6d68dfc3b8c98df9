"""The header's `extra` map as one typed structure (pure, no sockets).

Every key a message kind may carry is a field here, and its wire type is checked when the
header is decoded (noloco_rt/net/wire.py), before any kind-specific code reads it: an
unknown key, a nil, a bool where a count belongs, a string where a list belongs are all
one reject, malformed_header. What needs context stays with the code that has it: a reply
address's form (noloco_rt/net/messages.py), a piece inside the stage's tensors, a group's
size and a counter's name (noloco_rt/outer/snapshot.py, chunks.py), a verdict's value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from noloco_rt.counts import is_count


class ExtraError(ValueError):
    """The `extra` map is not one a sender of ours writes; the text says which key and why."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_int_list(value: Any, length: int | None = None) -> bool:
    return isinstance(value, list) and (length is None or len(value) == length) and all(map(_is_int, value))


def _is_specs(value: Any) -> bool:
    """[[shape, dtype], ...]: a shape a list of sizes, a dtype its name."""
    return isinstance(value, list) and all(
        isinstance(spec, list) and len(spec) == 2 and isinstance(spec[1], str)
        and isinstance(spec[0], list) and all(is_count(d) for d in spec[0]) for spec in value)


def _is_counters(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _is_int(v) for k, v in value.items())


@dataclass(frozen=True, kw_only=True, slots=True)
class HeaderExtra:
    """What a message kind carries beyond the fixed header fields; None (or False) is absent."""

    # a forward (the data path)
    reply_to: str | None = None
    """Where the gradient goes: tcp://host:port, or absent for none."""
    origin_step: int | None = None
    """The stage-0 inner step of this data, which a later stage's outer-step clock follows."""
    # a gradient (the data path)
    held_us: int | None = None
    """Microseconds the receiver held the forward, from its arrival to this reply: the sender
    takes it from its round trip to learn the link's (noloco_rt/routing/locality.py)."""
    # a snapshot: a push, a bootstrap reply
    codec: str | None = None
    parts: str | None = None
    """Which tensors the payload holds (noloco_rt/outer/snapshot.py PartsKind)."""
    specs: list[list[Any]] | None = None
    """[[shape, dtype], ...] of the payload's tensors."""
    checksum: str | None = None
    counters: dict[str, int] | None = None
    """A bootstrap's inner and outer step counts, which the joiner adopts."""
    # a streamed push's chunk
    for_step: int | None = None
    """The receiver's outer step the push is for."""
    group: int | None = None
    """The group as the sender computed it, itself included."""
    chunk: list[int] | None = None
    """[index, total]."""
    pieces: list[list[int]] | None = None
    """[[tensor, start, count], ...]: where the chunk's elements go."""
    # the outer step's talk
    verdict: str | None = None
    """A partner's decision on our push (workers/outer/verdicts.py)."""
    observer: bool = False
    """A bootstrap request from the coordinator: it only reads, nobody joins."""
    preparing: bool = False
    """A bootstrap reply without a snapshot: the donor copies one for us, ask again."""

    def to_wire(self) -> dict[str, Any]:
        """The map msgpack sends: the fields that are present, nothing else."""
        return {name: value for name in _NAMES if (value := getattr(self, name)) is not None and value is not False}

    @classmethod
    def from_wire(cls, value: Any) -> HeaderExtra:
        """The structure of a received map; raises ExtraError on an unknown key or a value
        of the wrong type."""
        if not isinstance(value, dict):
            raise ExtraError("extra is not a map")
        for name, item in value.items():
            check = _CHECKS.get(name)
            if check is None:
                raise ExtraError(f"unknown extra field {str(name)[:40]!r}")
            if not check[0](item):
                raise ExtraError(f"extra {name}: {str(item)[:60]!r} is not {check[1]}")
        return cls(**value)


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "reply_to": (lambda v: isinstance(v, str), "a string"),
    "origin_step": (is_count, "a step"),
    "held_us": (is_count, "a count of microseconds"),
    "codec": (lambda v: isinstance(v, str), "a string"),
    "parts": (lambda v: isinstance(v, str), "a string"),
    "specs": (_is_specs, "a list of [shape, dtype]"),
    "checksum": (lambda v: isinstance(v, str), "a string"),
    "counters": (_is_counters, "a map of names to ints"),
    "for_step": (is_count, "a step"),
    "group": (_is_int, "an int"),
    "chunk": (lambda v: _is_int_list(v, 2), "[index, total]"),
    "pieces": (lambda v: isinstance(v, list) and all(_is_int_list(p, 3) for p in v), "a list of [tensor, start, count]"),
    "verdict": (lambda v: isinstance(v, str), "a string"),
    "observer": (lambda v: isinstance(v, bool), "a bool"),
    "preparing": (lambda v: isinstance(v, bool), "a bool"),
}
_NAMES = tuple(f.name for f in fields(HeaderExtra))
assert set(_NAMES) == set(_CHECKS), "every field of HeaderExtra has its wire check"
