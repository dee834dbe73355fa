"""``x-jobs rate-limits``: each rate limit, what its current window spent, and its waiting jobs."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import LiteralString

from psycopg.rows import class_row

from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn
from x_jobs.cli._output import Output, _cell, _table

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RateLimitRow:
    """One limit of x_jobs.rate_limits()."""

    key: str
    max_starts: int
    per: timedelta
    window_start: datetime
    starts: int
    remaining: int
    waiting: int


RATE_LIMITS: LiteralString = """
    SELECT key, max_starts, per, window_start, starts, remaining, waiting FROM x_jobs.rate_limits()
"""


def rate_limits(dsn: Dsn = None, as_json: AsJson = False) -> None:
    """Each rate limit (x_jobs.rate_limits): at most max_starts starts per period, what the
    current window spent and has left, and how many jobs of the key wait for its budget.

    Limits are set by workers' declarations (@app.job(rate_limit=...)) or
    x_jobs.set_rate_limit, and dropped with x_jobs.drop_rate_limit.
    """
    out = Output(as_json)
    with database(dsn, out) as conn:
        rows = conn.cursor(row_factory=class_row(RateLimitRow)).execute(RATE_LIMITS).fetchall()
    table = _table()
    for column in ("key", "max", "per", "window", "starts", "remaining", "waiting"):
        table.add_column(column, justify="left" if column in ("key", "window") else "right")
    for r in rows:
        table.add_row(
            _cell(r.key),
            _cell(str(r.max_starts)),
            _cell(f"{r.per.total_seconds():g}s"),
            _cell(r.window_start.isoformat()),
            _cell(str(r.starts)),
            _cell(str(r.remaining)),
            _cell(str(r.waiting)),
        )
    out.emit(
        {
            "rate_limits": [
                {
                    **dataclasses.asdict(r),
                    "per": r.per.total_seconds(),
                    "window_start": r.window_start.isoformat(),
                }
                for r in rows
            ]
        },
        table if rows else "no rate limit is declared",
    )
