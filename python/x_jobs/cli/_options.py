"""The options and arguments the operator's commands share (``--dsn``, ``--json``, page
sizes, SQL's number ranges), and the parsers of JSON text, ISO 8601 times and MODULE:APP.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from datetime import datetime
from typing import Annotated, Any

import typer

from x_jobs.app import App

logger = logging.getLogger(__name__)

Dsn = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="Database conninfo or URL; default DATABASE_URL, else libpq's PG* environment.",
        show_default=False,
    ),
]
AsJson = Annotated[
    bool, typer.Option("--json", help="Print one JSON document on stdout instead of tables.")
]

#: The scope of a listing command: x_jobs.tenant, set for its transaction (see database()).
InTenant = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        metavar="TENANT",
        help="Act for this tenant only (x_jobs.tenant for the command's transaction).",
        show_default=False,
    ),
]

#: The rows a page of `jobs list` or `outbox list` may hold: those x_jobs.list_jobs takes (a
#: usage error outside them, before anything is sent).
PageSize = Annotated[int, typer.Option(min=1, max=1000, help="Rows per page.")]

# The ranges of SQL's bigint and integer: a number outside them is a usage error here, not an
# "out of range" or "function ... does not exist" from the database.
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def load_app(target: str) -> App:
    """The App at MODULE:ATTRIBUTE (``myproject.jobs:app``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"{target!r} is not MODULE:APP, such as myproject.jobs:app")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise typer.BadParameter(f"cannot import {module_name!r}: {err}") from err
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{target!r} is not an x_jobs.App (found {type(app).__name__})")
    return app


def _json_input(value: str, option: str = "--input") -> str:
    """The JSON text an option gave, checked; a usage error (exit 2) naming ``option`` otherwise.
    ``@PATH`` reads it from a file, ``-`` from stdin (no JSON text starts with @ or is a lone -):
    the command line holds about 128 KiB, the database takes up to 1 MiB.

    The text itself goes to the database (``%s::jsonb``): read into Python floats, a number
    would lose digits jsonb keeps."""
    text = _read_json_source(value, option)

    # jsonb has no NaN or Infinity: refuse them here, like any other text that is not JSON.
    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        parsed = json.loads(text, parse_constant=no_constants, parse_int=len, parse_float=len)
    except ValueError as err:
        raise typer.BadParameter(f"not a JSON value ({err})", param_hint=f"'{option}'") from err
    except RecursionError:
        # Nested deeper than Python decodes (jsonb nests deeper): the database checks the rest,
        # but not the NUL escape it cannot store, refused here all the same.
        if _NUL_ESCAPE.search(text):
            raise _unstorable(option, "a NUL character (\\u0000)") from None
        return text
    why = _unstorable_text(parsed)
    if why is not None:
        raise _unstorable(option, why)
    return text


#: A \\u0000 escape in JSON text: a backslash that no other backslash escapes, then u0000.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _unstorable(option: str, what: str) -> typer.BadParameter:
    return typer.BadParameter(
        f"it holds {what}, which PostgreSQL cannot store in jsonb: nothing was sent",
        param_hint=f"'{option}'",
    )


def _unstorable_text(value: Any) -> str | None:
    """Why jsonb cannot store the strings (keys too) of a JSON value: a NUL character, or half
    of a surrogate pair; None when it can. Walked without recursion."""
    stack = [value]
    while stack:
        item = stack.pop()
        texts: list[str] = []
        if isinstance(item, dict):
            texts = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            texts = [item]
        for text in texts:
            if "\x00" in text:
                return "a NUL character (\\u0000)"
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                return "half of a UTF-16 surrogate pair (such as \\ud800 alone)"
    return None


def _read_json_source(value: str, option: str) -> str:
    """``value``, or the text of the file ``@PATH`` or of stdin (``-``) it names."""
    if value != "-" and not value.startswith("@"):
        return value
    where = "stdin" if value == "-" else value[1:]
    try:
        if value == "-":
            return sys.stdin.read()
        with open(value[1:], encoding="utf-8") as source:
            return source.read()
    except (OSError, UnicodeDecodeError) as err:
        raise typer.BadParameter(
            f"cannot read JSON from {where}: {err}", param_hint=f"'{option}'"
        ) from err


def _iso_datetime(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError as err:
        raise typer.BadParameter(
            f"{value!r} is not an ISO 8601 time, such as 2026-12-01T09:00:00+00:00"
        ) from err
