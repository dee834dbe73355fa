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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, LiteralString, Protocol, runtime_checkable

import psycopg
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from x_jobs.errors import DeliveryError as DeliveryError  # noqa: PLC0414 - re-exported here
from x_jobs.errors import InputInvalid, InvalidArgument, MessageInvalid, unstorable_as

if TYPE_CHECKING:
    from x_jobs.app import App, Job

# key as text: an int key (an order id) went as a smallint, and no outbox_put takes one.
PUT: LiteralString = """
    SELECT x_jobs.outbox_put(topic => %s, payload => %s, key => %s::text, headers => %s,
                             max_attempts => %s)
"""
PUT_MANY: LiteralString = "SELECT id FROM x_jobs.outbox_put_many(messages => %s) ORDER BY ord"


@dataclass(frozen=True)
class OutboxMessage:
    """A message as a relay hands it to a sink."""

    id: int
    topic: str
    key: str | None
    payload: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Which delivery this is, from 1: a sink sees a message again after a failure or a crash.
    attempt: int = 1
    #: The payload as jsonb wrote it, every number with all its digits (``payload`` reads them
    #: as floats); set by the relay, None for a message made by hand.
    payload_json: str | None = None


class Sink(Protocol):
    """Delivers one message; returns when it was delivered, raises when it was not."""

    def deliver(self, message: OutboxMessage) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchSink(Protocol):
    """A sink that delivers many messages in one call (one round trip, one commit): answers,
    per message and in order, None when it was delivered or the exception it failed with."""

    def deliver_batch(self, messages: Sequence[OutboxMessage]) -> list[Exception | None]: ...

    def deliver(self, message: OutboxMessage) -> None: ...

    def close(self) -> None: ...


class FunctionSink:
    """A plain function as a sink."""

    def __init__(self, fn: Callable[[OutboxMessage], Any]) -> None:
        self.fn = fn

    def deliver(self, message: OutboxMessage) -> None:
        self.fn(message)

    def close(self) -> None:
        pass


class JobSink:
    """Enqueues ``job`` with the message's payload as input. The idempotency key is the message
    id, so a redelivery while the job is live answers the same job instead of a second one."""

    def __init__(self, app: App, job: Job[Any] | str, *, queue: str | None = None) -> None:
        self.app = app
        self.job = job
        self.queue = queue

    def deliver(self, message: OutboxMessage) -> None:
        error = self.deliver_batch([message])[0]
        if error is not None:
            raise error

    def deliver_batch(self, messages: Sequence[OutboxMessage]) -> list[Exception | None]:
        """All the messages in one ``enqueue_many`` (one commit). A message whose job cannot be
        made fails alone, for good: a payload that is not a valid input, a tenant or key function
        that raises on it, or a job the database refuses (an empty tenant derived from it, say).
        Any other failure (the database away) fails the messages not enqueued, to be retried."""
        job = self.app.lookup(self.job) if isinstance(self.job, str) else self.job
        errors: list[Exception | None] = []
        requests: list[tuple[int, dict[str, Any]]] = []
        for message in messages:
            options: dict[str, Any] = {"idempotency_key": f"outbox:{message.id}"}
            if self.queue is not None:
                options["queue"] = self.queue
            try:
                requests.append((len(errors), job.request(message.payload, **options)))
                errors.append(None)
            except InputInvalid as err:
                errors.append(DeliveryError(str(err), retryable=False))
            except Exception as err:  # the job's own tenant/key/dump functions, on this payload
                errors.append(
                    DeliveryError(
                        f"the job's request could not be made: {self._described(err)}",
                        retryable=False,
                    )
                )
        if not requests:
            return errors
        try:
            self.app.enqueue_requests([request for _, request in requests])
        except InvalidArgument as err:
            if len(requests) == 1:
                errors[requests[0][0]] = self._refused(err)
                return errors
            # enqueue_many is one statement: one job the database refuses fails them all. One
            # by one, so that only the refused ones fail (each with its idempotency key, so a
            # job enqueued twice is one job).
            for index, request in requests:
                try:
                    self.app.enqueue_requests([request])
                except InvalidArgument as refusal:
                    errors[index] = self._refused(refusal)
                except Exception as failure:  # retried, as any sink failure
                    errors[index] = failure
        return errors

    @staticmethod
    def _refused(err: InvalidArgument) -> DeliveryError:
        """A job the database (or the client) refused for what it holds: enqueueing it again
        would be refused again, so its message fails for good, naming the refusal."""
        return DeliveryError(f"its job was refused: {err}", retryable=False)

    @staticmethod
    def _described(err: BaseException) -> str:
        try:
            text = str(err)
        except Exception:  # an exception's own __str__ may fail: its type still says something
            text = ""
        return f"{type(err).__name__}: {text}" if text else type(err).__name__

    def close(self) -> None:
        pass


#: What a payload jsonb refuses (NaN, infinity, a NUL character) is called, and the fix.
_UNSTORABLE = (
    "the message",
    "Leave out NaN, infinity and NUL characters (send such values encoded).",
)


class Outbox:
    """``app.outbox``: put messages, and register the sinks a relay delivers them to."""

    def __init__(self, app: App) -> None:
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
