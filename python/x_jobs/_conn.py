"""How the client opens its connections: autocommit, named, in UTF-8, and with no prepared
statements (so that they work behind a pooler); and how it keeps the password of a DSN out of
everything it prints or logs."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

#: Every connection asks for UTF-8. On a SQL_ASCII database psycopg answers text as bytes unless
#: the client encoding names a codec (PostgreSQL converts nothing there either way), and then
#: nothing compares equal (the version check would read b'0.4.0' and refuse to start).
CLIENT_ENCODING = "utf8"

#: What stands for a password that was redacted.
HIDDEN = "***"

# The user:password@ of a URI's authority (the password runs to the last @ before the path, so
# one holding a raw @ is hidden whole), a password=... of its query string, and a password=...
# keyword of a key/value conninfo, its value bare or single-quoted with backslash escapes.
_URI_PASSWORD = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s:/?#@\"']*:)[^\s/?#\"']*(?=@)")
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^\s&#\"']*")
_KEYWORD_PASSWORD = re.compile(r"(?i)(\bpassword\s*=\s*)(?:'(?:[^'\\]|\\.)*'?|[^\s'\"]+)")


def redact(text: str) -> str:
    """``text`` with every password a DSN in it holds replaced by ``***``: the ``user:password@``
    of a URI, its ``?password=``, a ``password=...`` keyword. libpq quotes the whole DSN in some
    of its errors ("... in URI: "postgresql://u:s3cret@[bad/db""); what the client prints or
    logs about a connection goes through here."""
    text = _URI_PASSWORD.sub(rf"\g<1>{HIDDEN}", text)
    text = _QUERY_PASSWORD.sub(rf"\g<1>{HIDDEN}", text)
    return _KEYWORD_PASSWORD.sub(rf"\g<1>{HIDDEN}", text)


def has_password(dsn: str) -> bool:
    """Whether ``dsn`` holds a password (what :func:`redact` would hide)."""
    return redact(dsn) != dsn


def redact_error(err: BaseException) -> BaseException:
    """``err`` with the passwords in its message, and in those of the errors it was raised
    from, redacted in place (its type and attributes kept); returned for ``raise``."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.args = tuple(redact(a) if isinstance(a, str) else a for a in current.args)
        current = current.__cause__ or current.__context__
    return err


#: How long, in seconds, a connection may take to open, and the network may leave what the
#: client sent unanswered, unless the DSN says otherwise (see :func:`network_settings`).
PATIENCE = 10.0


def network_settings(dsn: str, patience: float = PATIENCE) -> dict[str, Any]:
    """The libpq settings that bound how long a connection can hang on the network: libpq's
    own defaults wait forever. A server whose host went away without a reset (a network cut, a
    failover that moved its address) left a connect waiting without end and a sent query until
    the kernel gave up (15 minutes and more), and an idle LISTEN connection that a NAT or a
    firewall forgot waited for notifications that could never come.

    ``connect_timeout`` and ``tcp_user_timeout`` (sent data unacknowledged that long) are
    ``patience``; keepalives probe an idle connection after ``patience`` too. A setting the DSN
    gives is kept, as is ``PGCONNECT_TIMEOUT``, and a DSN that names a service (or
    ``PGSERVICE``) is left to its service file. They apply to TCP only (not a Unix socket)."""
    try:
        given = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return {}  # a malformed DSN: connecting says what is wrong with it
    if "service" in given or os.environ.get("PGSERVICE"):
        return {}
    seconds = max(2, math.ceil(patience))  # libpq reads whole seconds, and 2 at the least
    settings: dict[str, Any] = {
        "connect_timeout": seconds,
        "tcp_user_timeout": seconds * 1000,
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": max(1, seconds // 3),
        "keepalives_count": 3,
    }
    if os.environ.get("PGCONNECT_TIMEOUT"):
        del settings["connect_timeout"]
    return {name: value for name, value in settings.items() if name not in given}


#: A connection lost sooner than this (seconds) after it was made counts as a connect that failed,
#: for the backoff of the loops that reconnect: behind a pooler the login succeeds while the
#: server behind it is away, and the first call fails at once (PgBouncer's
#: ``server_login_retry``). Reconnecting at once after each, a worker spun thousands of times a
#: second for as long as the server was down.
QUICK_LOSS_SECONDS = 1.0

#: psycopg's automatic prepared statements: off on every connection of the client. psycopg
#: prepares a statement on the server after its fifth use on a connection, and a statement
#: prepared on one server connection of a pooler in transaction mode is not there on the next:
#: PgBouncer before 1.21 (and after, unless ``max_prepared_statements`` is set) answers
#: ``prepared statement "_pg3_1" does not exist`` (26000), ``... already exists`` (42P05), or
#: runs another client's statement of that name. The client's statements are function calls
#: whose planning costs next to nothing (the PL/pgSQL inside keeps its own plans): a claim or a
#: complete_many call costs the same unprepared (docs/benchmarks.md). So they are off
#: everywhere, direct connections too, rather than only behind a pooler the client would have
#: to recognise.
PREPARE_THRESHOLD: int | None = None


def connect(
    dsn: str, application_name: str, *, patience: float = PATIENCE
) -> psycopg.Connection[Any]:
    """An autocommit connection, as every loop of the client (worker, relay, listener) uses,
    bounded on the network by ``patience`` (see :func:`network_settings`), with no prepared
    statements (see PREPARE_THRESHOLD). A failure to connect is raised with the DSN's password
    redacted from its message."""
    try:
        return psycopg.connect(dsn, **pool_kwargs(dsn, application_name, patience=patience))
    except psycopg.Error as err:
        redact_error(err)
        raise


def pool_kwargs(dsn: str, application_name: str, *, patience: float = PATIENCE) -> dict[str, Any]:
    """The same, for the connections of a psycopg_pool.ConnectionPool."""
    return {
        "autocommit": True,
        "prepare_threshold": PREPARE_THRESHOLD,
        "application_name": application_name,
        "client_encoding": CLIENT_ENCODING,
        **network_settings(dsn, patience),
    }
