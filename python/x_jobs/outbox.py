"""The transactional outbox: ``app.outbox.put(...)`` in the application's transaction, and the
sinks a relay (``x-jobs relay``) delivers each topic's messages to.

A message is written by ``x_jobs.outbox_put`` in the caller's transaction (pass ``conn=``): a
rollback leaves nothing, a commit makes it deliverable. A relay claims messages with
``x_jobs.relay_outbox`` (at most one message per key in flight, so each key is delivered in put
order), hands each to the sink registered for its topic, and settles it with
``x_jobs.outbox_ack`` or ``x_jobs.outbox_nack``. Delivery is at least once: a relay that dies
after delivering and before acking delivers again, so sinks (and the services behind them)
dedupe by the message id.

Sinks, per topic (``"*"`` matches every topic without a sink of its own):

- ``app.outbox.webhook(topic, url, secret=...)``: an HTTP POST signed with the Standard Webhooks
  headers (:class:`x_jobs.webhooks.WebhookSink`);
- ``app.outbox.to_job(topic, job)``: enqueues a job with the message's payload as input, once
  per message (its idempotency key is the message id), a relay's batch in one ``enqueue_many``;
- ``@app.outbox.sink(topic)`` over ``def deliver(message: OutboxMessage) -> None``: anything
  else. Raise :class:`DeliveryError` to say whether and when to retry; any other exception is
  retried with backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, LiteralString

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from x_jobs.errors import DeliveryError as DeliveryError  # noqa: PLC0414 - re-exported here
from x_jobs.errors import MessageInvalid, unstorable_as
from x_jobs.jobs import Job, JobsApp

# What a relay delivers and to what, importable from here as well.
from x_jobs.sinks import BatchSink as BatchSink  # noqa: PLC0414
from x_jobs.sinks import FunctionSink as FunctionSink  # noqa: PLC0414
from x_jobs.sinks import JobSink as JobSink  # noqa: PLC0414
from x_jobs.sinks import OutboxMessage as OutboxMessage  # noqa: PLC0414
from x_jobs.sinks import Sink as Sink  # noqa: PLC0414

# key as text: psycopg sends an int key (an order id) as a smallint, which no outbox_put takes.
PUT: LiteralString = """
    SELECT x_jobs.outbox_put(topic => %s, payload => %s, key => %s::text, headers => %s,
                             max_attempts => %s)
"""
PUT_MANY: LiteralString = "SELECT id FROM x_jobs.outbox_put_many(messages => %s) ORDER BY ord"


_UNSTORABLE = (
    "the message",
    "Leave out NaN, infinity and NUL characters (send such values encoded).",
)


class Outbox:
    """``app.outbox``: put messages, and register the sinks a relay delivers them to."""

    def __init__(self, app: JobsApp) -> None:
        self.app = app
        self.sinks: dict[str, Sink] = {}

    # --- put ----------------------------------------------------------------------------------

    def put(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | int | None = None,
        headers: Mapping[str, str] | None = None,
        max_attempts: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        """Write one message; with ``conn=`` it is part of the caller's transaction. Answers
        its id. Messages of one ``key`` are delivered one at a time, in put order."""
        with self.app.connection(conn) as db, unstorable_as(MessageInvalid, *_UNSTORABLE):
            # Rows as tuples whatever row_factory the caller's connection has (dict_row...).
            row = (
                db.cursor(row_factory=tuple_row)
                .execute(
                    PUT,
                    [
                        topic,
                        Jsonb(payload),
                        key,
                        None if headers is None else Jsonb(dict(headers)),
                        max_attempts,
                    ],
                )
                .fetchone()
            )
        assert row is not None
        return int(row[0])

    def put_many(
        self,
        messages: Iterable[Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[int]:
        """Write many messages in one statement (dicts with topic, payload, and optionally key,
        headers, max_attempts); answers their ids in order."""
        batch = [dict(m) for m in messages]
        if not batch:
            return []
        with self.app.connection(conn) as db, unstorable_as(MessageInvalid, *_UNSTORABLE):
            rows = db.cursor(row_factory=tuple_row).execute(PUT_MANY, [Jsonb(batch)]).fetchall()
        return [int(r[0]) for r in rows]

    # --- sinks --------------------------------------------------------------------------------

    def add_sink(self, topic: str, sink: Sink) -> Sink:
        if topic in self.sinks:
            raise ValueError(f"topic {topic!r} has a sink already")
        self.sinks[topic] = sink
        return sink

    def sink(self, topic: str) -> Callable[[Callable[[OutboxMessage], Any]], FunctionSink]:
        """``@app.outbox.sink("orders.created")`` over ``def deliver(message)``."""

        def register(fn: Callable[[OutboxMessage], Any]) -> FunctionSink:
            sink = FunctionSink(fn)
            self.add_sink(topic, sink)
            return sink

        return register

    def to_job(self, topic: str, job: Job[Any] | str, *, queue: str | None = None) -> JobSink:
        """Deliver ``topic`` by enqueueing ``job`` with the payload as input."""
        sink = JobSink(self.app, job, queue=queue)
        self.add_sink(topic, sink)
        return sink

    def webhook(
        self,
        topic: str,
        url: str,
        *,
        secret: str,
        timeout: float = 10.0,
        max_concurrent: int = 8,
        headers: Mapping[str, str] | None = None,
    ) -> Sink:
        """Deliver ``topic`` as signed HTTP POSTs to ``url`` (see x_jobs.webhooks.WebhookSink)."""
        from x_jobs.webhooks import WebhookSink  # noqa: PLC0415 - httpx only when used

        sink = WebhookSink(
            url, secret=secret, timeout=timeout, max_concurrent=max_concurrent, headers=headers
        )
        self.add_sink(topic, sink)
        return sink

    def sink_for(self, topic: str) -> Sink | None:
        return self.sinks.get(topic) or self.sinks.get("*")

    @property
    def topics(self) -> list[str] | None:
        """The topics a relay of this app claims: None (all) when a ``"*"`` sink exists."""
        if "*" in self.sinks:
            return None
        return sorted(self.sinks)
