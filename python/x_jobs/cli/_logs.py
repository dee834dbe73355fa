"""How ``worker`` and ``relay`` log: a text line or a JSON object per record, in UTC, with the
record's extra fields and never a DSN's password.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from x_jobs._conn import redact

logger = logging.getLogger(__name__)

#: The attributes every log record has; the others are the fields a call passed as ``extra``.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS}


class TextLogFormatter(logging.Formatter):
    """A line per record: time, level, logger, message, then the extra fields as key=value
    (the job id, the error): without them "job failed" or "claiming was refused" says neither
    which nor why."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return _utc_ts(record)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = " ".join(f"{k}={_logfmt(v)}" for k, v in _extra(record).items())
        if fields:
            head, newline, rest = line.partition("\n")  # after the message, before a traceback
            line = f"{head} {fields}{newline}{rest}"
        return redact(line)  # a DSN's password, in a connection error of psycopg's pool say


def _logfmt(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\n\\'):
        return text
    return json.dumps(text)


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _utc_ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(_extra(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(entry, default=str))


def _utc_ts(record: logging.LogRecord) -> str:
    """A log record's time in UTC to the millisecond, as ISO 8601 with a Z:
    2026-11-30T19:26:50.123Z, whatever the process's time zone."""
    when = datetime.fromtimestamp(int(record.created), UTC)
    return f"{when:%Y-%m-%dT%H:%M:%S}.{int(record.msecs):03d}Z"


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(TextLogFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
