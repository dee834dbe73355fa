"""Enqueue: send prepared requests (``Job.request``) to ``x_jobs.enqueue_many`` in one round
trip, on the caller's connection, so that the jobs join its transaction. Deduplication,
defaults, declarations and the wake-up all happen in SQL; a delay is turned into a run_at on
the database's clock first.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, LiteralString, cast

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from x_jobs.errors import InputInvalid, TimeInvalid, unstorable_as
from x_jobs.jobs import Enqueued

logger = logging.getLogger(__name__)

ENQUEUE_MANY: LiteralString = (
    "SELECT ord, id, run_id::text, deduped FROM x_jobs.enqueue_many(%(jobs)s) ORDER BY ord"
)
# The database's clock now, not when the transaction began (now()): a delay in the caller's
# transaction counts from the call. The test clock (x_jobs.fake_now) stands still, as x_jobs.now()
# and x_jobs._clock() read it (the latter is the workers' only).
DB_NOW: LiteralString = """
    SELECT CASE WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = ''
        THEN pg_catalog.clock_timestamp() ELSE x_jobs.now() END
"""


def send(db: psycopg.Connection[Any], requests: Sequence[Mapping[str, Any]]) -> list[Enqueued]:
    """Enqueue ``requests`` (jobs of several kinds mixed) on ``db``; what each answered, in
    order."""
    # Rows as tuples whatever row_factory the caller's connection has (dict_row...).
    cur = db.cursor(row_factory=tuple_row)
    if any("_delay" in req for req in requests):
        # A delay counts from the database's clock, not this machine's.
        row = cur.execute(DB_NOW).fetchone()
        assert row is not None
        now = cast(datetime, row[0])
        requests = [_with_run_at(req, now) for req in requests]
    with unstorable_as(
        InputInvalid,
        "a job's input",
        "Leave out NUL characters (send such bytes encoded, base64 say).",
    ):
        rows = cur.execute(ENQUEUE_MANY, {"jobs": Jsonb(requests)}).fetchall()
    return [Enqueued(id=int(r[1]), run_id=str(r[2]), deduped=bool(r[3])) for r in rows]


def _with_run_at(req: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    out = {k: v for k, v in req.items() if k != "_delay"}
    if "_delay" in req:
        try:
            out["run_at"] = (now + timedelta(seconds=float(req["_delay"]))).isoformat()
        except OverflowError:
            raise TimeInvalid(
                f"X_TIME_INVALID: a delay of {req['_delay']} s ends past the year 9999",
                hint="Pass a delay that ends before the year 10000.",
            ) from None
    return out
