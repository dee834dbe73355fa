"""The LISTEN loop a worker and a relay each run in a thread of their own.

A notification only wakes a loop early: both poll as well. But a LISTEN can be lost without an
error: through a pooler in transaction mode (PgBouncer's) the LISTEN holds on whichever server
connection ran it, which the pooler hands to other clients between transactions, and the
notifications that come to it are dropped (PgBouncer logs "got packet 'A' from server when not
linked"). The loop would then wait for the poll every time, saying nothing. So before it listens
on its channel, the listener proves that notifications reach its connection: it listens on a
channel of its own, sends itself a notification there from another connection (the one work is
enqueued by) and waits for it a bounded time. When it never comes, the listener warns once,
with the fix (a direct or session-mode DSN for the listener), listens on nothing, and tries
again a while later; the loop polls meanwhile. The proof is made again on every new connection.

What a notification carries is an opaque tag of a queue or topic (any login may LISTEN, so the
database never sends the names): on each connection, once, before it listens, the listener asks
x_jobs.notify_tags for the tags of the names it wants and matches payloads against those, so a
wake-up costs no round trip. A database of 0.4.1 has no notify_tags and sends the names: the
listener then matches the names.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from x_jobs._conn import connect

logger = logging.getLogger(__name__)

#: What a lost connection raises: a dropped socket, a server restart, a closed connection.
DB_GONE = (psycopg.OperationalError, psycopg.InterfaceError)

#: The environment variable naming the listener's DSN, when it is not the database's own.
LISTEN_DSN_ENV = "X_JOBS_LISTEN_DSN"

#: How long the listener waits for its own notification (direct, it takes milliseconds).
PROBE_SECONDS = 5.0
#: How long after a probe that found notifications lost the listener tries again (a pooler's
#: configuration may change under a long-running worker).
REPROBE_SECONDS = 300.0

NOTIFY: LiteralString = "SELECT pg_catalog.pg_notify(%s, %s)"
NOTIFY_TAGS: LiteralString = "SELECT x_jobs.notify_tags(channel => %s, names => %s)"


def listen(
    dsn: str,
    channel: str,
    *,
    notify_dsn: str,
    application_name: str,
    wanted: Collection[str] | None,
    notified: threading.Event,
    wake: threading.Event,
    running: Callable[[], bool],
    poll_interval: float,
    who: str = "worker",
    probe_seconds: float = PROBE_SECONDS,
    reprobe_seconds: float = REPROBE_SECONDS,
) -> None:
    """LISTEN on ``channel`` over ``dsn`` while ``running()``; a notification whose payload is
    for a name in ``wanted`` (any payload when None) sets ``notified`` and ``wake``; payloads
    are the names' tags (see the module), asked for on each connection. A hint only: the loops
    poll (every ``poll_interval``) as well, so a dropped connection here loses nothing; it
    reconnects with backoff. Each connection first proves that notifications reach it (see the
    module), the probe sent over ``notify_dsn``."""
    probe_channel = f"x_jobs_probe_{secrets.token_hex(8)}"
    warned = False
    delay = 0.1
    while running():
        try:
            with connect(dsn, application_name) as conn:
                conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(probe_channel)))
                arrived = _probe(conn, notify_dsn, probe_channel, probe_seconds, running)
                if arrived is None:
                    return  # stopping
                with contextlib.suppress(psycopg.Error):
                    conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(probe_channel)))
                delay = 0.1
                if arrived:
                    if warned:
                        logger.info(
                            "notifications reach the listener again: work is taken as it comes",
                            extra={"listener": application_name},
                        )
                        warned = False
                    payloads = _payloads(conn, channel, wanted, application_name)
                    conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
                    # What came while nothing listened (before a reconnect, during the probe)
                    # is taken now: one claim that may find nothing.
                    notified.set()
                    wake.set()
                    _serve(
                        conn,
                        channel,
                        wanted=payloads,
                        notified=notified,
                        wake=wake,
                        running=running,
                    )
                    continue
            if not warned:
                warned = True
                logger.warning(
                    f"notifications do not reach the {who}'s listener: its connection goes"
                    " through a pooler in transaction mode (PgBouncer's), which drops them. The"
                    f" {who} polls instead, every {poll_interval:g} s. Give the listener a"
                    " direct or session-mode DSN: --listen-dsn or X_JOBS_LISTEN_DSN (listen_dsn="
                    " in Python)",
                    extra={"listener": application_name, "poll_s": poll_interval},
                )
            else:
                logger.debug("notifications still do not reach the listener")
            _pause(reprobe_seconds, running)
        except psycopg.Error:
            # Away (a restart, a lost network), or refusing (a standby takes no LISTEN): again
            # later, on a new connection.
            _pause(delay, running)
            delay = min(delay * 2, 5.0)


def _payloads(
    conn: psycopg.Connection[Any],
    channel: str,
    wanted: Collection[str] | None,
    application_name: str,
) -> frozenset[str] | None:
    """The payloads on ``channel`` that stand for the names in ``wanted``: their tags, or the
    names themselves from a database of 0.4.1 (no notify_tags); None (any payload) stays None.
    A lost connection raises, for the caller to reconnect."""
    if wanted is None:
        return None
    names = sorted(set(wanted))
    try:
        row = conn.execute(NOTIFY_TAGS, [channel, names]).fetchone()
    except DB_GONE:
        raise
    except psycopg.errors.UndefinedFunction:
        return frozenset(names)  # 0.4.1 sends the names
    except psycopg.Error as err:
        # The listener's login may not ask (no x_jobs_worker, e.g. another --listen-dsn): no
        # notification will match, and the loop polls. Said once per connection.
        logger.warning(
            f"the listener cannot ask the tags of its notifications ({err.sqlstate}: {err}); it"
            " wakes at each poll only. Grant x_jobs_worker to the listener's login",
            extra={"listener": application_name},
        )
        return frozenset()
    tags = row[0] if row is not None else None
    return frozenset(tags or ())


def _probe(
    conn: psycopg.Connection[Any],
    notify_dsn: str,
    probe_channel: str,
    seconds: float,
    running: Callable[[], bool],
) -> bool | None:
    """Send a notification to ``probe_channel`` from another connection and wait ``seconds``
    for ``conn`` to get it: whether it came, or None when the loop stopped meanwhile."""
    token = secrets.token_hex(8)
    with connect(notify_dsn, "x_jobs listen probe") as other:
        other.execute(NOTIFY, [probe_channel, token])
    deadline = time.monotonic() + seconds
    while running():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        for note in conn.notifies(timeout=min(left, 1.0)):
            if note.channel == probe_channel and note.payload == token:
                return True
    return None


def _serve(
    conn: psycopg.Connection[Any],
    channel: str,
    *,
    wanted: Collection[str] | None,
    notified: threading.Event,
    wake: threading.Event,
    running: Callable[[], bool],
) -> None:
    while running():
        for note in conn.notifies(timeout=1.0):
            if note.channel == channel and (wanted is None or note.payload in wanted):
                notified.set()
                wake.set()


def _pause(seconds: float, running: Callable[[], bool]) -> None:
    """Sleep ``seconds``, in steps short enough to end soon once the loop stops."""
    deadline = time.monotonic() + seconds
    while running() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))
