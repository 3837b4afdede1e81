"""Logging setup shared by every subcommand: standard :mod:`logging`, JSON lines by default.

Each record becomes one JSON object per line on stderr with ``time`` (RFC 3339, UTC),
``level``, ``logger``, ``msg`` and any ``extra=`` fields the caller passed. Callers must never
pass credentials or tokens in ``extra``.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import orjson

_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


class JSONFormatter(logging.Formatter):
    """Format a :class:`logging.LogRecord` as one compact JSON line."""

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as JSON; exceptions are rendered under ``exc``."""
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler writing to whatever ``sys.stderr`` is when a record is emitted (as
    :data:`logging.lastResort` does), so a replaced or closed stderr (an embedding program,
    a test runner's capture) never breaks logging."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(level: str = "info", fmt: str = "json") -> None:
    """Configure the root logger.

    Args:
        level: a :mod:`logging` level name (``debug``, ``info``, ``warning``, ``error``).
        fmt: ``json`` (one JSON object per line) or ``text`` (human-readable).

    Raises:
        ValueError: unknown level or format.
    """
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    handler = _StderrHandler()
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    elif fmt == "text":
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    else:
        raise ValueError(f"unknown log format {fmt!r}")
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
