"""``x-jobs outbox list|show|redrive``: outbox messages newest first and page by page, one
message, and the dead ones to send again.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, LiteralString

import typer
from psycopg.rows import class_row
from rich.console import RenderableType
from rich.table import Table

from x_jobs.cli._database import database
from x_jobs.cli._options import (
    BIGINT_MAX,
    BIGINT_MIN,
    INT_MAX,
    INT_MIN,
    AsJson,
    Dsn,
    InTenant,
    PageSize,
)
from x_jobs.cli._output import (
    SHORT,
    Output,
    _cell,
    _fields,
    _json_view,
    _next_page,
    _or_dash,
    _shorten,
    _table,
    _utc,
    _when,
)
from x_jobs.errors import (
    MessageNotFound,
    StateUnknown,
)
from x_jobs.errors import first_line as _first_line

logger = logging.getLogger(__name__)


outbox_cli = typer.Typer(
    help="List and show outbox messages, send dead ones again.", no_args_is_help=True
)


@dataclass(frozen=True)
class OutboxRow:
    """A message of x_jobs.outbox as the operator reads it (``OUTBOX_COLUMNS``)."""

    id: int
    created_at: datetime
    max_attempts: int
    topic: str
    key: str | None
    headers: Any
    payload: Any
    state: str
    attempt: int
    available_at: datetime
    relay: str | None
    delivered_at: datetime | None
    last_error: str | None
    tenant_id: str


OUTBOX_COLUMNS: LiteralString = """
    id, created_at, max_attempts, topic, key, headers, payload, state::text AS state, attempt,
    available_at, relay, delivered_at, last_error, tenant_id
"""
OUTBOX_STATES: LiteralString = "SELECT pg_catalog.enum_range(NULL::x_jobs.outbox_state)::text[]"
# Newest first, paged by id as x_jobs.list_jobs pages jobs. The state is checked against
# OUTBOX_STATES first, as list_outbox itself would refuse it.
LIST_OUTBOX: LiteralString = (
    "SELECT "
    + OUTBOX_COLUMNS
    + """
    FROM x_jobs.list_outbox(state => %(state)s, topic => %(topic)s, key => %(key)s,
                            before_id => %(before)s::bigint, max_rows => %(limit)s::integer)
    ORDER BY id DESC
"""
)
SHOW_OUTBOX: LiteralString = (
    "SELECT " + OUTBOX_COLUMNS + " FROM x_jobs.outbox_message(id => %(id)s)"
)
# NULL ids or topic: no restriction there (the command refuses to pass both NULL).
REDRIVE: LiteralString = """
    SELECT x_jobs.outbox_redrive(
        ids => %(ids)s::bigint[], topic => %(topic)s, max_rows => %(limit)s::integer
    )
"""


def _outbox_table(messages: list[OutboxRow]) -> Table:
    # As `jobs list`: the fixed columns stay narrow, topic, key and last error fold.
    table = _table()
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("topic", overflow="fold", min_width=8)
    table.add_column("key", overflow="fold", min_width=5)
    table.add_column("state", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    table.add_column("available at (UTC)", no_wrap=True)
    table.add_column("last error", overflow="fold", min_width=10, max_width=SHORT)
    for message in messages:
        table.add_row(
            _cell(str(message.id)),
            _cell(message.topic),
            _cell(_or_dash(message.key)),
            _cell(message.state),
            _cell(f"{message.attempt}/{message.max_attempts}"),
            _cell(_utc(message.available_at)),
            _cell(_shorten(_first_line(message.last_error)) if message.last_error else ""),
        )
    return table


def _literal(text: str) -> str:
    """``text`` quoted as SQL's %L does, so the refusal reads as the one `jobs list` prints."""
    return "'" + text.replace("'", "''") + "'"


@outbox_cli.command("list")
def outbox_list(
    state: Annotated[
        str | None,
        typer.Option(help="Only messages in this state (pending, inflight, delivered, dead)."),
    ] = None,
    topic: Annotated[str | None, typer.Option(help="Only messages of this topic.")] = None,
    key: Annotated[str | None, typer.Option(help="Only messages of this key.")] = None,
    before: Annotated[
        int | None,
        typer.Option(
            metavar="ID",
            min=BIGINT_MIN,
            max=BIGINT_MAX,
            help="Only ids below this one: the next page's start.",
        ),
    ] = None,
    limit: PageSize = 50,
    tenant: InTenant = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Outbox messages newest first, one page at a time (x_jobs.list_outbox); page on with --before.

    After a full page it prints the command for the next one: --before the page's last id.
    """
    out = Output(as_json)
    params = {"state": state, "topic": topic, "key": key, "before": before, "limit": limit}
    with database(dsn, out, tenant=tenant) as conn:
        # The refusals x_jobs.list_jobs makes for `jobs list`, in its order.
        if state is not None:
            row = conn.execute(OUTBOX_STATES).fetchone()
            states: list[str] = [] if row is None else list(row[0])
            if state not in states:
                raise StateUnknown(
                    f"X_STATE_UNKNOWN: {_literal(state)} is not an outbox state",
                    hint=f"Use one of: {', '.join(states)}.",
                )
        cur = conn.cursor(row_factory=class_row(OutboxRow))
        messages = cur.execute(LIST_OUTBOX, params).fetchall()
    next_before = messages[-1].id if len(messages) == limit else None
    human: list[RenderableType | str] = [_outbox_table(messages) if messages else "no messages"]
    if next_before is not None:
        args = ["x-jobs", "outbox", "list"]
        args += ["--state", state] if state is not None else []
        args += ["--topic", topic] if topic is not None else []
        args += ["--key", key] if key is not None else []
        args += ["--tenant", tenant] if tenant is not None else []
        args += ["--limit", str(limit)] if limit != 50 else []
        args += ["--before", str(next_before)]
        human += _next_page(args, dsn)
    out.emit(
        {"messages": [dataclasses.asdict(m) for m in messages], "next_before": next_before},
        *human,
    )


@outbox_cli.command("show")
def outbox_show(
    message_id: Annotated[
        int,
        typer.Argument(metavar="ID", min=BIGINT_MIN, max=BIGINT_MAX, help="The message's id."),
    ],
    tenant: InTenant = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """One outbox message: every column, its headers and payload as JSON."""
    out = Output(as_json)
    with database(dsn, out, tenant=tenant) as conn:
        cur = conn.cursor(row_factory=class_row(OutboxRow))
        row = cur.execute(SHOW_OUTBOX, {"id": message_id}).fetchone()
        if row is None:
            raise MessageNotFound(
                f"X_MESSAGE_NOT_FOUND: no outbox message has id {message_id}",
                hint="Check the id with `x-jobs outbox list`; delivered messages are removed "
                "by purge_outbox after their retention.",
            )
    out.emit(
        {"message": dataclasses.asdict(row)},
        _fields(
            [
                ("id", str(row.id)),
                ("topic", row.topic),
                ("key", _or_dash(row.key)),
                ("state", row.state),
                ("attempt", f"{row.attempt}/{row.max_attempts}"),
                ("available at", _when(row.available_at)),
                ("relay", _or_dash(row.relay)),
                ("created", _when(row.created_at)),
                ("delivered", _when(row.delivered_at)),
                ("last error", _or_dash(row.last_error)),
                ("tenant", row.tenant_id),
                ("headers", _json_view(row.headers)),
                ("payload", _json_view(row.payload)),
            ]
        ),
    )


@outbox_cli.command("redrive")
def outbox_redrive(
    message_ids: Annotated[
        list[int] | None,
        typer.Argument(
            metavar="ID",
            min=BIGINT_MIN,
            max=BIGINT_MAX,
            help="Dead messages to send again.",
            show_default=False,
        ),
    ] = None,
    topic: Annotated[
        str | None,
        typer.Option(help="Every dead message of this topic (with IDs: only those of it)."),
    ] = None,
    limit: Annotated[
        int,
        typer.Option(
            min=INT_MIN, max=INT_MAX, help="At most this many, oldest first, 1 to 100000."
        ),
    ] = 1000,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Send dead messages again (x_jobs.outbox_redrive): pending, due now, attempts from 0.

    Name them by ID, by --topic or both; a bare `redrive` is refused, never all by accident.

    Prints how many were dead and went back.
    """
    out = Output(as_json)
    ids = list(dict.fromkeys(message_ids or []))
    if not ids and topic is None:
        raise typer.BadParameter(
            "name the dead messages to send again: give their IDs, --topic, or both",
            param_hint="'ID' / '--topic'",
        )
    params = {"ids": ids or None, "topic": topic, "limit": limit}
    with database(dsn, out) as conn:
        row = conn.execute(REDRIVE, params).fetchone()
    redriven = 0 if row is None else int(row[0])
    if redriven == 0:
        said = "no dead message matched; nothing changed"
    else:
        said = f"{redriven} dead message{'s' if redriven > 1 else ''} sent again"
        if ids and redriven == limit < len(ids):
            # The ids past the limit were not looked at: dead or not, nobody knows yet.
            said += f"; the --limit of {limit} was reached: run it again for the other ids"
        elif ids and redriven < len(ids):
            said += f"; {len(ids) - redriven} of the ids named no dead message"
        elif not ids and redriven == limit:
            said += f"; there may be more: run it again to send the next {limit}"
    out.emit({"redriven": redriven, "ids": ids, "topic": topic, "limit": limit}, said)
