"""How the client opens its connections: autocommit, named, and in UTF-8."""

from __future__ import annotations

from typing import Any

import psycopg

#: Every connection asks for UTF-8. On a SQL_ASCII database psycopg answers text as bytes unless
#: the client encoding names a codec (PostgreSQL converts nothing there either way), and then
#: nothing compares equal: the version check read b'0.3.4' and refused to start.
CLIENT_ENCODING = "utf8"


def connect(dsn: str, application_name: str) -> psycopg.Connection[Any]:
    """An autocommit connection, as every loop of the client (worker, relay, listener) uses."""
    return psycopg.connect(
        dsn, autocommit=True, application_name=application_name, client_encoding=CLIENT_ENCODING
    )


def pool_kwargs(application_name: str) -> dict[str, Any]:
    """The same, for the connections of a psycopg_pool.ConnectionPool."""
    return {
        "autocommit": True,
        "application_name": application_name,
        "client_encoding": CLIENT_ENCODING,
    }
