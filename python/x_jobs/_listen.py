"""The LISTEN loop a worker and a relay each run in a thread of their own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection

import psycopg
from psycopg import sql

from x_jobs._conn import connect

#: What a lost connection raises: a dropped socket, a server restart, a closed connection.
DB_GONE = (psycopg.OperationalError, psycopg.InterfaceError)


def listen(
    dsn: str,
    channel: str,
    *,
    application_name: str,
    wanted: Collection[str] | None,
    notified: threading.Event,
    wake: threading.Event,
    running: Callable[[], bool],
) -> None:
    """LISTEN on ``channel`` while ``running()``; a notification whose payload is in ``wanted``
    (any payload when None) sets ``notified`` and ``wake``. A hint only: the loops poll as well,
    so a dropped connection here loses nothing; it reconnects with backoff."""
    delay = 0.1
    while running():
        try:
            with connect(dsn, application_name) as conn:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                delay = 0.1
                while running():
                    for note in conn.notifies(timeout=1.0):
                        if wanted is None or note.payload in wanted:
                            notified.set()
                            wake.set()
        except DB_GONE:
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
