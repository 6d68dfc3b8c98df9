"""structlog set-up: readable on a terminal, JSON lines otherwise; and the reader of those lines.

Only entry points (the CLI) call configure_logging; library code just asks for a
logger and binds run / worker / stage once.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TextIO

import structlog


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written, not when logging was configured: a
    caller that swaps it (a notebook, a test capturing output) and closes its stand-in
    must not leave every later log line writing to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(log_format: str = "auto", *, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    is_terminal = (stream or sys.stderr).isatty()
    use_json = log_format == "json" or (log_format == "auto" and not is_terminal)
    renderer: Any = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=stream or _CurrentStderr()),
        cache_logger_on_first_use=False,
    )


class EventLog(Protocol):
    """What library code asks of a logger: an event name and fields, at a level (a structlog
    BoundLogger, as get_logger gives, or anything with these methods)."""

    def debug(self, event: str, **fields: Any) -> Any: ...

    def info(self, event: str, **fields: Any) -> Any: ...

    def warning(self, event: str, **fields: Any) -> Any: ...

    def error(self, event: str, **fields: Any) -> Any: ...

    def exception(self, event: str, **fields: Any) -> Any: ...


def get_logger(**bound: Any) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger("noloco_rt").bind(**bound)


LogRecord = dict[str, Any]


def read_json_lines(path: Path, offset: int = 0) -> tuple[list[LogRecord], int]:
    """The JSON records of a log (or metrics.jsonl) from byte `offset`, and the offset to read
    on from. Only complete lines are read: a last line still being written (or torn by a
    killed writer) waits for the next read. Lines that are not a JSON object (a traceback,
    torch's own output) are skipped. A file not there yet holds no record."""
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            chunk = handle.read()
    except FileNotFoundError:
        return [], offset
    complete = chunk[:chunk.rfind(b"\n") + 1]
    records = []
    for line in complete.decode(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records, offset + len(complete)


def record_seconds(stamp: str) -> float:
    """A log record's ISO-8601 timestamp ("...Z" or with an offset) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
