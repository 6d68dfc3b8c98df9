"""structlog set-up: readable on a terminal, JSON lines otherwise.

Only entry points (the CLI) call configure_logging; library code just asks for a
logger and binds run / worker / stage once.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog


def configure_logging(log_format: str = "auto", *, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    stream = stream or sys.stderr
    use_json = log_format == "json" or (log_format == "auto" and not stream.isatty())
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
        logger_factory=structlog.PrintLoggerFactory(file=stream),
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: Any) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger("noloco_rt").bind(**bound)
