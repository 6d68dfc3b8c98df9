"""What a worker publishes about its progress, besides liveness: one list of fields.

The membership record carries these fields (as Redis hash fields of the same names),
`noloco-rt up` shows them per worker, `noloco-rt status` prints some. Peers route on
queue_depth alone; the rest is for people watching.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

_REQUIRED = {"required": True}
"""Marks a field every member record must hold (the rest may be missing: defaults apply)."""


@dataclass(frozen=True, kw_only=True)
class WorkerProgress:
    outer_step: int = field(default=0, metadata=_REQUIRED)
    queue_depth: int = field(default=0, metadata=_REQUIRED)
    """Forwards waiting or in flight at the worker: the routing hint."""
    inner_step: int = 0
    loss: float | None = None
    """Mean training loss of the last inner step (stages that compute the loss)."""
    tokens_per_s: float = 0.0
    peer_exchanges: int = 0
    local_outer_steps: int = 0
    retried: int = 0
    dropped: int = 0


_PARSERS = {"int": int, "float": float, "float | None": float}


def progress_of(source: Any) -> dict[str, Any]:
    """The progress fields of `source` (a WorkerProgress or anything holding them), by name."""
    return {f.name: getattr(source, f.name) for f in fields(WorkerProgress)}


def progress_to_text(progress: WorkerProgress) -> dict[str, str]:
    """Redis hash fields: str() of each value ("" for no loss)."""
    return {name: "" if value is None else str(value) for name, value in progress_of(progress).items()}


def progress_from_text(text: dict[str, str]) -> dict[str, Any]:
    """Parsed progress fields; raises KeyError for a missing required one, ValueError if malformed."""
    values: dict[str, Any] = {}
    for f in fields(WorkerProgress):
        raw = text[f.name] if f.metadata.get("required") else text.get(f.name)
        values[f.name] = _PARSERS[str(f.type)](raw) if f.metadata.get("required") or raw else f.default
    return values
