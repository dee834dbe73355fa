"""The app that a worker of the previous release runs in test_upgrade_in_place.py:
``python -m x_jobs worker apps.upgrade:app`` with PYTHONPATH naming that release's client.

It is imported by that older client, so it uses only what every released client has: ``App``,
``App.job`` with a name and a queue, a handler taking its input, ``x_jobs.__version__`` and
psycopg. Every run inserts one row into ``public.upgrade_run`` (``SCHEMA``; the test creates it):
the job's ``n`` (each job of the test has its own), the worker's pid and the client's version.
A job run twice leaves two rows, one never run none. The row is written over a connection of
the handler's thread, never the worker's.

``hold`` records its start, then runs until the test opens its gate (a row of apps.basic's
``gate`` table): a job claimed before the update and settled after it.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, LiteralString

import psycopg

import x_jobs

app = x_jobs.App()

QUEUE = "upgrade"
#: The gate (apps.basic's gate table) that ends ``hold``.
GATE = "upgrade"

SCHEMA: LiteralString = """
    CREATE TABLE public.upgrade_run (
        n integer NOT NULL,
        pid integer NOT NULL,
        client text NOT NULL,
        at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
    )
"""
RECORD: LiteralString = "INSERT INTO public.upgrade_run (n, pid, client) VALUES (%s, %s, %s)"
GATE_OPEN: LiteralString = "SELECT open FROM public.gate WHERE name = %s"

#: A job's work: long enough that a few thousand jobs take the worker seconds to drain (the
#: update lands in the middle), short enough to keep the test lean.
WORK_SECONDS = 0.002
#: How long ``hold`` waits for its gate before it gives up (a test that forgot to open it).
GATE_DEADLINE_SECONDS = 60.0

_local = threading.local()


def _execute(query: LiteralString, params: list[Any]) -> list[tuple[Any, ...]]:
    """One statement over this thread's own autocommit connection (libpq's environment names
    the test's database)."""
    conn: psycopg.Connection[tuple[Any, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(autocommit=True, application_name="upgrade_run")
        _local.conn = conn
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description is not None else []


def _record(n: int) -> None:
    _execute(RECORD, [n, os.getpid(), x_jobs.__version__])


@app.job(name="record", queue=QUEUE)
def record(input: dict[str, Any]) -> None:
    """Does a moment's work, then records the run."""
    time.sleep(WORK_SECONDS)
    _record(int(input["n"]))


@app.job(name="hold", queue=QUEUE)
def hold(input: dict[str, Any]) -> None:
    """Records its start, then waits for the gate."""
    _record(int(input["n"]))
    deadline = time.monotonic() + GATE_DEADLINE_SECONDS
    while _execute(GATE_OPEN, [GATE]) != [(True,)]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the gate {GATE!r} was not opened")
        time.sleep(0.02)
