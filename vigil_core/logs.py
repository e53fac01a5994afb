"""Structured logging: JSON lines in production, readable lines in a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]


def configure_logging(fmt: LogFormat = "auto", level: str = "info", stream: object = None) -> None:
    """Configure structlog once per process. ``auto`` picks console output on a TTY, else JSON."""
    out = stream if stream is not None else sys.stderr
    if fmt == "auto":
        fmt = "console" if getattr(out, "isatty", lambda: False)() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # One write per line (print writes the line and its newline apart): a line from another
        # thread (the store's writer, a library's own logging) never lands inside one of ours.
        logger_factory=structlog.WriteLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
