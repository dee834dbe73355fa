"""Where a command's answer goes: one JSON document on stdout (``--json``), or text and tables
for a person; how it ends on an error (one line and a hint on stderr, the exit code); how values
from the database are shown (times in UTC, control characters as escapes, JSON with every digit).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.highlighter import JSONHighlighter
from rich.table import Table
from rich.text import Text

from x_jobs._conn import HIDDEN, has_password, redact
from x_jobs.errors import XJobsError
from x_jobs.errors import first_line as _first_line

logger = logging.getLogger(__name__)

#: The database refused what a command asked: an x_jobs refusal (X_JOB_NOT_FOUND), one this
#: client makes in the same manner (X_MESSAGE_NOT_FOUND, the install refusals), or any other
#: SQL error (X_DATABASE_ERROR: a statement timeout, a read-only transaction).
EXIT_REFUSED = 1
#: The command could not do its work as it was set up: a usage error (X_USAGE, an input the
#: database cannot store), a connection problem (X_CONNECT_FAILED, X_CONNECTION_LOST), a
#: database without x_jobs or with a version this client cannot speak to (X_NOT_INSTALLED,
#: X_VERSION_UNSUPPORTED), a login without the x_jobs role it needs (X_PERMISSION_DENIED); and
#: whatever stops `worker` or `relay` (X_METRICS_PORT_UNAVAILABLE, a --queue the claim refuses).
EXIT_USAGE = 2

#: What the CLI's connections load for a timestamp Python cannot hold: 'infinity' (a run
#: suspended on an event without a timeout is due then) and '-infinity', years past 9999 or BC.
INFINITY = datetime.max.replace(tzinfo=UTC)
NEG_INFINITY = datetime.min.replace(tzinfo=UTC)

#: JSON nested deeper than this is printed as the text jsonb wrote. Python decodes, copies
#: (dataclasses.asdict) and encodes JSON by recursion, one or two frames a level, and jsonb
#: nests far deeper than the recursion limit (1000 frames): a value a few hundred levels deep
#: would end jobs list and show in a RecursionError.
JSON_DEPTH = 100


class RawJson:
    """A JSON value nested deeper than JSON_DEPTH, kept as jsonb's text; _dumps writes that text
    as it is, so --json still prints the very value."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __deepcopy__(self, memo: dict[int, Any]) -> RawJson:
        return self  # immutable; dataclasses.asdict deep-copies what is no list or dict

    def __repr__(self) -> str:
        return f"RawJson({self.text[:20]!r}...)"


#: Unicode's Bidi_Control characters (ALM, LRM, RLM, the embeddings and overrides U+202A to
#: U+202E, the isolates U+2066 to U+2069): invisible, they reorder what a terminal shows after
#: them, so that "invoice\\u202egpj.exe" reads as "invoiceexe.jpg".
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
#: C0 controls but tab and newline, DEL and C1: text from the database (a job's name, an error
#: a handler raised) must not steer the operator's terminal with ESC or CSI sequences; nor
#: reorder it with the bidi controls, shown as \\u escapes.
_CONTROLS = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0)) if c not in (0x09, 0x0A)},
    **{c: f"\\u{c:04x}" for c in _BIDI},
}
#: json.dumps escapes C0 but, with ensure_ascii=False, leaves DEL, C1 and the bidi controls
#: raw; in JSON they can only be inside strings, where \\u escapes say the same.
_JSON_CONTROLS = {c: f"\\u{c:04x}" for c in (*range(0x7F, 0xA0), *_BIDI)}
# A Decimal's or RawJson's stand-in while json.dumps runs: NUL, which no PostgreSQL text or
# jsonb holds.
_VERBATIM = re.compile(r'"\\u0000(\d+)\\u0000"')


def _safe(text: str) -> str:
    """``text`` with its control characters shown as escapes (\\x1b, \\u202e), for a person's
    terminal."""
    return text.translate(_CONTROLS)


def _cell(text: str) -> Text:
    """Database text in a table cell: never markup (Text), never a terminal control."""
    return Text(_safe(text))


def _dumps(value: Any, indent: int | None = None) -> str:
    """JSON for ``value`` with Decimals written as the exact numbers they are (json.dumps would
    refuse them, or round them through float) and RawJson as the text it is."""
    verbatim: list[str] = []

    def mark(item: Any) -> Any:
        if isinstance(item, Decimal | RawJson):
            verbatim.append(item.text if isinstance(item, RawJson) else str(item))
            return f"\0{len(verbatim) - 1}\0"
        if isinstance(item, dict):
            return {key: mark(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple):
            return [mark(inner) for inner in item]
        return item

    text = json.dumps(mark(value), indent=indent, ensure_ascii=False, default=_json_default)
    if verbatim:
        text = _VERBATIM.sub(lambda found: verbatim[int(found[1])], text)
    return text.translate(_JSON_CONTROLS)


def _json_view(value: Any) -> Text:
    """A JSON value for a person: indented and highlighted as rich's JSON, digits kept. A
    RawJson is one long line: folded, not cropped."""
    return JSONHighlighter()(Text(_dumps(value, indent=2), no_wrap=not isinstance(value, RawJson)))


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return _infinite(value) or value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


#: Columns for output that is no terminal (a pipe, a file): wide enough that `| grep name`
#: finds whole names, where rich would fold everything to 80.
PIPE_WIDTH = 200


def _width() -> int | None:
    """Rich's own choice in a terminal or under COLUMNS; PIPE_WIDTH otherwise."""
    if "COLUMNS" in os.environ or sys.stdout.isatty():
        return None
    return PIPE_WIDTH


class Output:
    """Where a command's answer goes: one JSON document on stdout, or text and tables for a
    person. Values from the database are always wrapped in ``Text``, so rich never reads them as
    markup."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def emit(self, doc: Mapping[str, Any], *human: RenderableType | str) -> None:
        if self.as_json:
            typer.echo(_dumps(doc, indent=2))
            return
        console = Console(highlight=False, markup=False, emoji=False, width=_width())
        for part in human:
            console.print(_cell(part) if isinstance(part, str) else part)

    def fail(
        self,
        exit_code: int,
        message: str,
        hint: str | None,
        *,
        code: str | None = None,
        sqlstate: str | None = None,
    ) -> NoReturn:
        """End the command: one line on stderr, then the hint (and the JSON error document)."""
        message = _first_line(message)
        typer.echo(f"x-jobs: {_safe(message)}", err=True)
        if hint:
            typer.echo(f"hint: {_safe(hint)}", err=True)
        if self.as_json:
            error = {"code": code, "sqlstate": sqlstate, "message": message, "hint": hint}
            typer.echo(_dumps({"error": error}, indent=2))
        raise typer.Exit(exit_code)

    def refuse(self, exit_code: int, err: XJobsError) -> NoReturn:
        self.fail(exit_code, err.message, err.hint, code=_code_of(err), sqlstate=err.sqlstate)


def _code_of(err: XJobsError) -> str:
    """The X_ code an error's message starts with (that of the refusal it was made of), else
    its class's."""
    head = err.message.split(":", 1)[0]
    return head if head.startswith("X_") and head.isupper() else err.code


def _infinite(value: datetime) -> str | None:
    """ "infinity" or "-infinity" for the stand-ins of times Python cannot hold (== as asdict
    copies them), else None."""
    if value == INFINITY:
        return "infinity"
    return "-infinity" if value == NEG_INFINITY else None


def _when(value: datetime | None) -> str:
    """A time for a person: UTC, to the second."""
    if value is None:
        return "-"
    return _infinite(value) or value.astimezone(UTC).isoformat(sep=" ", timespec="seconds")


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _table(title: str | None = None) -> Table:
    """A table in the manner of `ps`: no box, two spaces between columns, so more fits."""
    return Table(
        title=title,
        title_justify="left",
        box=None,
        padding=(0, 1),
        pad_edge=False,
        header_style="bold",
    )


def _fields(rows: list[tuple[str, RenderableType | str]]) -> Table:
    """A two-column grid of labels and values, for one record."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(label, _cell(value) if isinstance(value, str) else value)
    return grid


#: Characters of a step's output or error in the steps table; --json has them whole.
SHORT = 60


def _shorten(text: str, limit: int = SHORT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _utc(value: datetime | None) -> str:
    """A time in a table: UTC without the offset (the header says UTC), as `jobs list`."""
    if value is None:
        return "-"
    return _infinite(value) or value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _next_page(args: list[str], dsn: str | None) -> list[str]:
    """The line that says how to ask for the next page: ``args`` and the --dsn the command was
    given (none when it read DATABASE_URL or PG*: the next command reads them too). A password
    in that --dsn is never printed: it shows as *** and a second line says to put it back."""
    if dsn is None:
        return [f"next page: {shlex.join(args)}"]
    line = f"next page: {shlex.join([*args, '--dsn', redact(dsn)])}"
    if not has_password(dsn):
        return [line]
    return [
        line,
        f"(the password in --dsn is shown as {HIDDEN}: give it in its place, or keep it out of"
        " the DSN with PGPASSWORD or ~/.pgpass)",
    ]
