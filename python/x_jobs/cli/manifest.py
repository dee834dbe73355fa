"""``x-jobs manifest``: the job declarations, as the database recorded them or as an App
would declare them (:mod:`x_jobs.declarations`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.table import Table

from x_jobs import declarations
from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn, load_app
from x_jobs.cli._output import Output, _cell, _or_dash, _table, _utc
from x_jobs.errors import VersionUnsupported

logger = logging.getLogger(__name__)


def _duration(value: timedelta | None) -> str:
    return "-" if value is None else f"{value.total_seconds():g}s"


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _manifest_table(types: list[declarations.JobType], *, from_database: bool) -> Table:
    """The declarations, one row a job: what an enqueue that leaves an option out gets ("-":
    not declared, the built-in default), and from the database who declared it and serves it."""
    table = _table()
    table.add_column("job", overflow="fold", min_width=8)
    table.add_column("queue", overflow="fold", min_width=5)
    for column in ("attempts", "retry", "dead letters", "timeout", "concurrency", "keep done"):
        table.add_column(column, no_wrap=column != "concurrency", overflow="fold")
    if from_database:
        table.add_column("declared (UTC)", overflow="fold")
        table.add_column("served by", overflow="fold", min_width=8)
        table.add_column("parked", justify="right", no_wrap=True)
    for t in types:
        retry = (
            "-"
            if t.backoff_base is None and t.backoff_max is None
            else f"{_duration(t.backoff_base)}..{_duration(t.backoff_max)}"
        )
        concurrency = "-"
        if t.concurrency_limit is not None:
            concurrency = f"{t.concurrency_limit} per {t.concurrency_key or 'key from the input'}"
        elif t.concurrency_key is not None:
            concurrency = f"1 per {t.concurrency_key}"
        row = [
            t.name,
            _or_dash(t.queue),
            _or_dash(t.max_attempts),
            retry,
            _yes_no(t.dead_letter),
            _duration(t.timeout),
            concurrency,
            _yes_no(t.keep_done),
        ]
        if from_database:
            declared = "not declared"
            if t.declared_at is not None:
                declared = f"{_utc(t.declared_at)} by {t.declared_by}"
                declared += f" ({t.build})" if t.build else ""
            row += [declared, ", ".join(t.served_by) or "-", str(t.parked)]
        table.add_row(*(_cell(cell) for cell in row))
    return table


def _as_job_type(declared: Mapping[str, Any]) -> declarations.JobType:
    """A declaration the app would send, as the database would answer it back."""

    def interval(name: str) -> timedelta | None:
        value = declared.get(name)
        return None if value is None else timedelta(seconds=float(str(value).split()[0]))

    return declarations.JobType(
        name=str(declared["name"]),
        queue=declared.get("queue"),
        max_attempts=declared.get("max_attempts"),
        priority=declared.get("priority"),
        dead_letter=declared.get("dead_letter"),
        backoff_base=interval("backoff_base"),
        backoff_max=interval("backoff_max"),
        keep_done=declared.get("keep_done"),
        concurrency_key=declared.get("concurrency_key"),
        concurrency_limit=declared.get("concurrency_limit"),
        timeout=interval("timeout"),
        declared_at=None,
        declared_by=None,
        build=None,
        served_by=[],
        parked=0,
    )


def manifest_command(
    app_path: Annotated[
        str | None,
        typer.Argument(
            metavar="[MODULE:APP]",
            help="Print what this App declares, without a database.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """The job declarations: what workers recorded in the database (x_jobs.job_types), or what
    MODULE:APP would declare.

    From the database: per job, the defaults an enqueue gets for what it leaves out (from any
    language), the timeout, who declared it when, the live workers that announced it, and how
    many of its jobs are parked (handed back while no worker served it). Needs x_jobs_worker
    and x_jobs 0.4.0.
    """
    out = Output(as_json)
    if app_path is not None:
        app = load_app(app_path)
        declared = declarations.declarations(app)
        types = [_as_job_type(d) for d in declared]
        out.emit(
            {"declarations": declared},
            _manifest_table(types, from_database=False) if types else "the app declares no job",
        )
        return
    with database(dsn, out) as conn:
        row = conn.execute("SELECT x_jobs.version()").fetchone()
        version = "?" if row is None else str(row[0])
        if not declarations.speaks_declarations(version):
            raise VersionUnsupported(
                f"X_VERSION_UNSUPPORTED: declarations are recorded from x_jobs 0.4.0 on, "
                f"the database has {version}",
                hint="Upgrade the database (ALTER EXTENSION x_jobs UPDATE, or x-jobs install) "
                "and start the workers again, or pass MODULE:APP to see what an app declares.",
            )
        types = declarations.job_types(conn)
    out.emit(
        {"job_types": [dataclasses.asdict(t) for t in types]},
        _manifest_table(types, from_database=True)
        if types
        else "no job is declared, served or parked",
    )
