"""``x-jobs events publish``: an event for the workflow runs that wait for it."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Annotated, LiteralString

import typer
from psycopg.rows import class_row

from x_jobs.cli._database import database
from x_jobs.cli._options import AsJson, Dsn, _json_input
from x_jobs.cli._output import Output

logger = logging.getLogger(__name__)


events_cli = typer.Typer(help="Publish events to waiting workflow runs.", no_args_is_help=True)


@dataclass(frozen=True)
class PublishedRow:
    """What x_jobs.publish answers."""

    event_id: int
    woken: int


# NULL payload (no --payload) is the API's default; --payload null publishes JSON null.
PUBLISH: LiteralString = """
    SELECT event_id, woken
    FROM x_jobs.publish(event => %(event)s, payload => %(payload)s::jsonb, key => %(key)s)
"""


@events_cli.command("publish")
def events_publish(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The event, such as order.paid.")],
    payload_json: Annotated[
        str | None,
        typer.Option(
            "--payload",
            metavar="JSON",
            help="The event's payload, a JSON value: the output of the waits it resolves.",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            help="Wake only the waits on this key (and those naming no key).", show_default=False
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Publish an event (x_jobs.publish): the waits that match it are done with its payload and
    their suspended runs are due at once. Prints the event's id and how many runs it woke."""
    out = Output(as_json)
    payload = None if payload_json is None else _json_input(payload_json, "--payload")
    params = {"event": name, "payload": payload, "key": key}
    with database(dsn, out) as conn, conn.transaction():
        cur = conn.cursor(row_factory=class_row(PublishedRow))
        row = cur.execute(PUBLISH, params).fetchone()
    assert row is not None  # publish answers one row or raises
    keyed = f" with key {key!r}" if key is not None else ""
    woke = "no run waited for it" if row.woken == 0 else f"woke {row.woken} run"
    woke += "s" if row.woken > 1 else ""
    out.emit(
        dataclasses.asdict(row),
        f"event {name!r}{keyed} published as id {row.event_id}: {woke}",
    )
