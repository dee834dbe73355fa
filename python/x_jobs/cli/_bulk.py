"""``jobs retry`` and ``jobs cancel`` by filter: count the matching jobs, confirm on a terminal,
then change them in batches of their own transactions (x_jobs.retry_jobs, x_jobs.cancel_jobs).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, LiteralString

import psycopg
import typer

from x_jobs.cli._database import _OWN_TIMEZONES, OWN_TIMEZONE, _require_0_4, database
from x_jobs.cli._options import _iso_datetime
from x_jobs.cli._output import EXIT_USAGE, Output, _safe

logger = logging.getLogger(__name__)

#: Jobs per call of x_jobs.cancel_jobs or retry_jobs (their max_rows), each call a transaction
#: of its own: the rows a call changes stay locked until it commits, and a worker's heartbeat
#: of one of them waits that long.
BULK_BATCH = 10_000

# The bulk forms (x_jobs 0.4.0 and later): every job that matches the filters, NULL matching any.
CANCEL_JOBS: LiteralString = """
    SELECT x_jobs.cancel_jobs(
        queue => %(queue)s, name => %(name)s, state => %(state)s, tenant_id => %(tenant_id)s,
        created_before => %(created_before)s::timestamptz,
        created_after => %(created_after)s::timestamptz,
        max_rows => %(max_rows)s::integer, dry_run => %(dry_run)s::boolean
    )
"""
RETRY_JOBS: LiteralString = """
    SELECT x_jobs.retry_jobs(
        queue => %(queue)s, name => %(name)s, state => %(state)s, tenant_id => %(tenant_id)s,
        created_before => %(created_before)s::timestamptz,
        created_after => %(created_after)s::timestamptz,
        max_rows => %(max_rows)s::integer, dry_run => %(dry_run)s::boolean
    )
"""

# A time without an offset as the session's own TimeZone reads it (inside OWN_TIMEZONE).
IN_OWN_TIMEZONE: LiteralString = "SELECT %s::timestamp::timestamptz"

ByQueue = Annotated[
    str | None, typer.Option("--queue", help="Every job of this queue.", show_default=False)
]
ByName = Annotated[
    str | None, typer.Option("--name", help="Every job of this name.", show_default=False)
]
ByTenant = Annotated[
    str | None, typer.Option("--tenant", help="Every job of this tenant.", show_default=False)
]
CreatedBefore = Annotated[
    datetime | None,
    typer.Option(
        "--created-before",
        metavar="ISO8601",
        parser=_iso_datetime,
        help="Every job created before this time; without an offset, in the session's TimeZone.",
        show_default=False,
    ),
]
CreatedAfter = Annotated[
    datetime | None,
    typer.Option(
        "--created-after",
        metavar="ISO8601",
        parser=_iso_datetime,
        help="Every job created after this time; without an offset, in the session's TimeZone.",
        show_default=False,
    ),
]
Yes = Annotated[
    bool,
    typer.Option(
        "--yes",
        "-y",
        help="Change the matching jobs without asking (needed when stdin is no terminal).",
    ),
]


@dataclass(frozen=True)
class _Bulk:
    """What `jobs cancel` or `jobs retry` does by filter: the verb, its forms (the past tense is
    the --json key), the SQL function, and why a job the dry run counted may be left."""

    verb: str
    doing: str
    done: str
    call: LiteralString
    left: str


CANCELLING = _Bulk("cancel", "cancelling", "cancelled", CANCEL_JOBS, "they finished meanwhile")
RETRYING = _Bulk(
    "retry",
    "retrying",
    "retried",
    RETRY_JOBS,
    "a live job holds their idempotency key, or they changed meanwhile",
)


def _jobs(count: int) -> str:
    return f"{count:,} job{'' if count == 1 else 's'}"


def _own_times(conn: psycopg.Connection[Any], filters: dict[str, Any]) -> None:
    """The --created-* times without an offset, read in the session's own TimeZone (as
    --run-at is), not in the UTC that database() pinned: from then on, instants."""
    naive = [k for k in ("created_before", "created_after") if _is_naive(filters[k])]
    if not naive:
        return
    with conn.transaction():
        conn.execute(OWN_TIMEZONE, [_OWN_TIMEZONES.get(conn, "UTC")])
        for key in naive:
            row = conn.execute(IN_OWN_TIMEZONE, [filters[key]]).fetchone()
            assert row is not None
            filters[key] = row[0]


def _is_naive(value: object) -> bool:
    return isinstance(value, datetime) and value.tzinfo is None


def _bulk_count(
    conn: psycopg.Connection[Any],
    bulk: _Bulk,
    filters: Mapping[str, Any],
    *,
    max_rows: int | None,
    dry_run: bool,
) -> int:
    row = conn.execute(bulk.call, {**filters, "max_rows": max_rows, "dry_run": dry_run}).fetchone()
    return 0 if row is None else int(row[0])


def _by_filters(
    bulk: _Bulk, filters: dict[str, Any], yes: bool, out: Output, dsn: str | None
) -> None:
    """Count the matching jobs (a dry run), ask on a terminal unless --yes, then change them in
    calls of BULK_BATCH, each its own transaction, and at most as many as were counted: jobs
    that match only later (enqueued meanwhile) were not confirmed."""
    shown = " ".join(
        f"{key.removesuffix('_id')}={value.isoformat() if isinstance(value, datetime) else value}"
        for key, value in filters.items()
        if value is not None
    )
    with database(dsn, out) as conn:
        _require_0_4(conn, f"to {bulk.verb} jobs by filter", f"or {bulk.verb} them by ID")
        _own_times(conn, filters)
        matching = _bulk_count(conn, bulk, filters, max_rows=None, dry_run=True)
        if matching == 0:
            out.emit({bulk.done: 0}, f"no job to {bulk.verb} matches {shown}; nothing changed")
            return
        what = f"{_jobs(matching)} matching {shown}"
        if not yes:
            if not sys.stdin.isatty():
                out.fail(
                    EXIT_USAGE,
                    f"X_USAGE: {bulk.doing} {what} needs a confirmation, and stdin is not a"
                    " terminal",
                    f"Pass --yes to {bulk.verb} them without asking.",
                    code="X_USAGE",
                )
            if not typer.confirm(_safe(f"{bulk.verb.capitalize()} {what}?"), err=True):
                out.emit({bulk.done: 0}, "nothing changed")
                return
        changed = 0
        while changed < matching:
            batch = min(BULK_BATCH, matching - changed)
            got = _bulk_count(conn, bulk, filters, max_rows=batch, dry_run=False)
            changed += got
            if got < batch:
                break
    said = f"{_jobs(changed)} {bulk.done}"
    if changed < matching:
        said += f" of the {matching:,} that matched: for the others, {bulk.left}"
    out.emit({bulk.done: changed}, said)


def _filters(
    queue: str | None,
    name: str | None,
    state: str | None,
    tenant: str | None,
    created_before: datetime | None,
    created_after: datetime | None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "name": name,
        "state": state,
        "tenant_id": tenant,
        "created_before": created_before,
        "created_after": created_after,
    }


def _ids_or_filters(verb: str, ids: list[int], filters: Mapping[str, Any]) -> bool:
    """Whether the command goes by filters; a usage error unless it has IDs or filters alone."""
    named = any(value is not None for value in filters.values())
    if ids and named:
        raise typer.BadParameter(
            f"give the IDs of the jobs to {verb}, or filters, not both", param_hint="'ID'"
        )
    if not ids and not named:
        raise typer.BadParameter(
            f"name the jobs to {verb}: give their IDs, or filters (--queue, --name, --state,"
            " --tenant, --created-before, --created-after)",
            param_hint="'ID' / '--queue' ...",
        )
    return named
