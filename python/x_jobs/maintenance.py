"""Retention: delete what is past its time, fold old counters (``x-jobs maintain``).

Each kind of row has its own purge function in SQL, bounded to a batch per call so that no call
holds locks or writes WAL in one long burst; :func:`maintain` calls each one in its own short
transaction until a call takes less than a batch, then folds the old counter buckets. It needs
the ``x_jobs_admin`` role. Run it from cron or a Kubernetes CronJob, every hour or so; two at
once share the work of ``purge`` (SKIP LOCKED) and are harmless for the others.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, LiteralString

import psycopg

#: Per kind of row (a field of Retention), in the order maintain runs them: what the rows are,
#: for a person, and the purge function that deletes them.
PURGES: dict[str, tuple[str, LiteralString]] = {
    "jobs": ("finished jobs", "SELECT x_jobs.purge(older_than => %s, batch_size => %s)"),
    "events": ("events", "SELECT x_jobs.purge_events(older_than => %s, batch_size => %s)"),
    "outbox": (
        "delivered outbox messages",
        "SELECT x_jobs.purge_outbox(older_than => %s, batch_size => %s)",
    ),
    "webhooks": (
        "received webhooks",
        "SELECT x_jobs.purge_webhook_ledger(older_than => %s, batch_size => %s)",
    ),
}
ROLLUP: LiteralString = "SELECT x_jobs.rollup_counters()"

_AGE = re.compile(r"(\d+)([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
#: The longest retention, the database's own bound (x_jobs._require_retention, purge): its
#: "1000 years" compared as intervals are, a month counting 30 days, so 360000 days; past it the
#: purge functions refuse, and now() minus much longer falls before SQL's first timestamp.
MAX_AGE = timedelta(days=360_000)


def parse_age(text: str) -> timedelta | None:
    """``7d``, ``36h``, ``90m``, ``30s``, ``2w`` as a timedelta; ``off`` as None (keep all)."""
    text = text.strip().lower()
    if text == "off":
        return None
    found = _AGE.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not an age: use a number and s, m, h, d or w (7d), or off")
    try:
        age = timedelta(**{_UNITS[found[2]]: int(found[1])})
    except OverflowError:
        age = timedelta.max
    if age > MAX_AGE:
        raise ValueError(
            f"{text!r} is longer than 360000d (1000 years of 360 days, as the database counts "
            "them): keep for good with off"
        )
    return age


@dataclass(frozen=True)
class Retention:
    """How long each kind of row is kept after it is finished; None keeps it for good.

    ``jobs``: terminal jobs (done, failed, dead, cancelled) with their errors and steps, from
    when they finished. ``events``: published events; a wait with ``since`` further back than
    this misses the purged ones. ``outbox``: delivered messages (dead ones stay until redriven).
    ``webhooks``: the ledger of received deliveries, which dedupes a sender's retries: keep it
    longer than any sender retries (Stripe's window is 3 days).
    """

    jobs: timedelta | None = timedelta(days=7)
    events: timedelta | None = timedelta(days=30)
    outbox: timedelta | None = timedelta(days=7)
    webhooks: timedelta | None = timedelta(days=7)


@dataclass
class Maintained:
    """What one :func:`maintain` pass did: rows deleted per kind (absent: kept for good), and
    the counter buckets folded into wider ones or dropped."""

    deleted: dict[str, int] = field(default_factory=dict)
    counters_folded: int = 0


def maintain(
    conn: psycopg.Connection[Any], retention: Retention | None = None, batch_size: int = 10_000
) -> Maintained:
    """One retention pass over ``conn``, which must be in autocommit mode: each batch commits on
    its own, so none holds its locks until the whole pass ends."""
    if not conn.autocommit:
        raise ValueError("maintain needs an autocommit connection: each batch commits alone")
    retention = retention or Retention()
    done = Maintained()
    for kind, (_, statement) in PURGES.items():
        age: timedelta | None = getattr(retention, kind)
        if age is None:
            continue
        total = 0
        while True:
            row = conn.execute(statement, [age, batch_size]).fetchone()
            taken = int(row[0]) if row else 0
            total += taken
            if taken < batch_size:
                break
        done.deleted[kind] = total
    row = conn.execute(ROLLUP).fetchone()
    done.counters_folded = int(row[0]) if row else 0
    return done
