"""The app the relay process tests run: ``python -m x_jobs relay apps.relays:app``.

Its sinks, by topic:

- ``record``: records each delivery in the test database's ``delivery`` table (``SCHEMA``
  below; the tests create it), one row per delivery, with the message, the attempt and the
  relay's pid. ``seq`` is drawn when the row is written, which is before the relay acks, so two
  deliveries of one key in ``seq`` order are the order they happened in;
- ``gated``: records that it began (``begun``), waits until the test opens the gate named by
  the payload (a row of ``gate``), then records the delivery: a delivery whose end the test
  decides, without a sleep to guess;
- ``jobs``: ``to_job``, one ``relayed`` job per message with the payload as input;
- ``jobs.lost``: the ``jobs`` sink, then a failure on the first attempt, as if the relay had
  lost the answer: the relay sends the message again, to the same sink;
- ``hooks``: a signed webhook to ``X_JOBS_TEST_HOOK_URL`` with ``X_JOBS_TEST_HOOK_SECRET``, only
  when the test sets them (the relay's lease must exceed its 1 s timeout).

Sinks write over a connection of their own, one per delivery thread, never the relay's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.types.json import Jsonb

import x_jobs
from x_jobs.outbox import DeliveryError, OutboxMessage

logger = logging.getLogger(__name__)

app = x_jobs.App()

#: What the tests create in their database before a relay starts.
SCHEMA: LiteralString = """
    CREATE TABLE public.delivery (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        message_id bigint NOT NULL,
        topic text NOT NULL,
        key text,
        payload jsonb NOT NULL,
        attempt integer NOT NULL,
        pid integer NOT NULL,
        at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
    );
    CREATE TABLE public.begun (
        message_id bigint NOT NULL,
        pid integer NOT NULL,
        at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
    );
    CREATE TABLE public.gate (name text PRIMARY KEY, open boolean NOT NULL);
"""

RECORD: LiteralString = """
    INSERT INTO public.delivery (message_id, topic, key, payload, attempt, pid)
    VALUES (%s, %s, %s, %s, %s, %s)
"""
BEGIN: LiteralString = "INSERT INTO public.begun (message_id, pid) VALUES (%s, %s)"
GATE_OPEN: LiteralString = "SELECT open FROM public.gate WHERE name = %s"

#: How long a gated delivery waits for its gate before it fails (a test that forgot to open it).
GATE_DEADLINE_SECONDS = 60.0
#: The webhook sink's timeout: the tests' relays run with a 2 s lease, which must exceed it.
HOOK_TIMEOUT_SECONDS = 1.0

#: Where the sinks record when the relay's own way to the database is not theirs (a test that
#: cuts the relay's network): Relays.start(via=...) sets it.
RECORD_DSN = os.environ.get("X_JOBS_TEST_RECORD_DSN", "")

_local = threading.local()


def _db(query: LiteralString, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one statement over this thread's own autocommit connection."""
    conn: psycopg.Connection[tuple[Any, ...]] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = psycopg.connect(
            RECORD_DSN or app.dsn, autocommit=True, application_name="relay sink"
        )
        _local.conn = conn
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description is not None else []


def _record(message: OutboxMessage) -> None:
    _db(
        RECORD,
        [
            message.id,
            message.topic,
            message.key,
            Jsonb(message.payload),
            message.attempt,
            os.getpid(),
        ],
    )


@app.outbox.sink("record")
def record(message: OutboxMessage) -> None:
    _record(message)


@app.outbox.sink("gated")
def gated(message: OutboxMessage) -> None:
    _db(BEGIN, [message.id, os.getpid()])
    gate = str(message.payload.get("gate", "gate"))
    deadline = time.monotonic() + GATE_DEADLINE_SECONDS
    while not (rows := _db(GATE_OPEN, [gate])) or not rows[0][0]:
        if time.monotonic() > deadline:
            raise DeliveryError(f"gate {gate!r} never opened")
        time.sleep(0.05)
    _record(message)


@app.job(name="relayed", queue="relayed")
def relayed(input: dict[str, Any]) -> None:
    """Enqueued by the ``jobs`` sink; no worker runs it in these tests."""


jobs = app.outbox.to_job("jobs", relayed)


@app.outbox.sink("jobs.lost")
def jobs_lost(message: OutboxMessage) -> None:
    jobs.deliver(message)
    _record(message)
    if message.attempt == 1:
        raise DeliveryError("the job was enqueued, then the answer was lost")


if os.environ.get("X_JOBS_TEST_HOOK_URL"):
    app.outbox.webhook(
        "hooks",
        os.environ["X_JOBS_TEST_HOOK_URL"],
        secret=os.environ["X_JOBS_TEST_HOOK_SECRET"],
        timeout=HOOK_TIMEOUT_SECONDS,
    )
