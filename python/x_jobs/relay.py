"""The outbox relay: claim messages with ``x_jobs.relay_outbox``, hand each to its topic's sink,
settle with ``x_jobs.outbox_ack`` (in batches) or ``x_jobs.outbox_nack``.

Up to ``concurrency`` deliveries run at once on a thread pool; the relay claims again as soon as
half of that room is free, so a slow endpoint holds its own messages, not the others'. Order per
key is the database's doing: ``relay_outbox`` hands out a key's next message only once the one
before it is acked (or dead), so the relay acks as soon as deliveries finish.

Delivery is at least once. A relay that dies after a delivery and before its ack leaves the
message in flight until its lease lapses; then a relay delivers it again. Keep ``lease`` well
above the sinks' timeouts (it is checked at start), or a slow delivery is sent twice.

Stopping: the first SIGTERM or SIGINT claims nothing more, lets the deliveries in flight finish
(within ``grace``), acks them and exits; a second one exits at once (their leases will lapse).
"""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any, LiteralString

import psycopg

from x_jobs._conn import connect
from x_jobs._listen import DB_GONE, listen
from x_jobs.app import App, Seconds, interval, seconds
from x_jobs.errors import storable
from x_jobs.outbox import BatchSink, DeliveryError, OutboxMessage

logger = logging.getLogger(__name__)

CLAIM: LiteralString = """
    SELECT id, topic, key, payload, headers, attempt
    FROM x_jobs.relay_outbox(relay => %s, qty => %s, lease => %s, topics => %s)
"""
ACK: LiteralString = "SELECT a FROM x_jobs.outbox_ack(ids => %s, relay => %s) AS a"
NACK: LiteralString = """
    SELECT x_jobs.outbox_nack(id => %s, relay => %s, error => %s, retry_at => %s,
                              retryable => %s)::text
"""


@dataclass
class _Result:
    message: OutboxMessage
    ok: bool
    error: str = ""
    retryable: bool = True
    retry_at: datetime | None = None


def _failed(message: OutboxMessage, err: BaseException) -> _Result:
    if isinstance(err, DeliveryError):
        return _Result(
            message, ok=False, error=str(err), retryable=err.retryable, retry_at=err.retry_at
        )
    # Any other failure of a sink is worth another try, with the outbox's backoff.
    return _Result(message, ok=False, error=f"{type(err).__name__}: {err}")


def default_relay_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}:relay"


class Relay:
    """Delivers the outbox messages of the topics ``app.outbox`` has sinks for."""

    def __init__(
        self,
        app: App,
        *,
        concurrency: int = 16,
        lease: Seconds = 60,
        poll_interval: Seconds = 1.0,
        grace: Seconds = 30,
        relay_id: str | None = None,
        check_version: bool = True,
    ) -> None:
        if not app.outbox.sinks:
            raise ValueError("the relay has no sink: register one with app.outbox.webhook/...")
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, not {concurrency}")
        self.app = app
        self.concurrency = concurrency
        self.lease = seconds(lease)
        slowest = max(float(getattr(s, "timeout", 0.0)) for s in app.outbox.sinks.values())
        if self.lease <= slowest:
            raise ValueError(
                f"lease {self.lease:g} s must exceed the slowest sink's timeout ({slowest:g} s), "
                "or a slow delivery would be sent twice"
            )
        self.poll_interval = seconds(poll_interval)
        self.grace = seconds(grace)
        self.relay_id = relay_id or default_relay_id()
        self.check_version = check_version
        self.topics = app.outbox.topics
        self._conn: psycopg.Connection[Any] | None = None
        self._results: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._notified = threading.Event()
        self._stop_requests = 0
        self._in_flight = 0
        self._stopped = threading.Event()
        #: How many messages this relay delivered and failed: for logs and tests.
        self.delivered = 0
        self.failed = 0

    # --- public -------------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> None:
        """Relay until stopped (``stop()`` or a signal); blocks the calling thread."""
        if install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        logger.info(
            "relay starting",
            extra={"relay": self.relay_id, "topics": self.topics or "*", "lease_s": self.lease},
        )
        self._connect(first=True)
        listener = threading.Thread(target=self._listen, name="x_jobs-relay-listen", daemon=True)
        listener.start()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="x_jobs-deliver")
        try:
            self._loop(pool)
        finally:
            # Deliveries still running past the grace are not acked: their leases lapse and
            # another relay sends them again.
            pool.shutdown(wait=False, cancel_futures=True)
            for sink in self.app.outbox.sinks.values():
                sink.close()
            if self._conn is not None:
                self._conn.close()
            self._stopped.set()
            logger.info(
                "relay stopped",
                extra={"relay": self.relay_id, "delivered": self.delivered, "failed": self.failed},
            )

    def stop(self) -> None:
        self._stop_requests += 1
        self._wake.set()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # --- the loop -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # A handler runs in the main thread between two bytecodes, maybe while that thread holds
        # the lock inside self._wake (in its wait or clear): setting the event from here could
        # wait for itself forever (two quick signals did). Count the request here and set the
        # event from a thread of its own, which waits for the lock like any other thread.
        self._stop_requests += 1
        threading.Thread(target=self._wake.set, name="x_jobs-signal", daemon=True).start()
        logger.info("signal received", extra={"signal": signal.Signals(signum).name})

    def _loop(self, pool: ThreadPoolExecutor) -> None:
        next_poll = 0.0
        claim_now = True
        drain_deadline: float | None = None
        pending: list[_Result] = []
        while True:
            if self._stop_requests >= 2:
                return
            pending.extend(self._collect())
            if pending and not self._settle(pending):
                continue
            pending = []
            now = time.monotonic()
            if self._stop_requests == 1:
                if drain_deadline is None:
                    drain_deadline = now + self.grace
                    logger.info(
                        "draining: claiming nothing more", extra={"in_flight": self._in_flight}
                    )
                if self._in_flight == 0 or now >= drain_deadline:
                    return
                # Only the deliveries in flight matter now: each one that ends sets _wake.
                wait = min(drain_deadline - now, 1.0)
            else:
                if self._notified.is_set():
                    self._notified.clear()
                    claim_now = True
                if now >= next_poll:
                    claim_now = True
                room = self.concurrency - self._in_flight
                if claim_now and room * 2 >= self.concurrency:
                    got = self._claim(pool, room)
                    if got is None:
                        continue
                    claim_now = got == room
                    next_poll = time.monotonic() + self.poll_interval
                # Due to claim but without room: wait for a delivery to end (it sets _wake), not
                # for the poll time, which has passed (waiting for it would spin). Else until
                # the next poll, or sooner on a notification or an ended delivery.
                wait = 1.0 if claim_now else max(0.0, min(next_poll - time.monotonic(), 1.0))
            if self._wake.wait(timeout=wait):
                self._wake.clear()

    def _claim(self, pool: ThreadPoolExecutor, room: int) -> int | None:
        conn = self._ensure_connection()
        if conn is None:
            return None
        try:
            rows = conn.execute(
                CLAIM, [self.relay_id, room, interval(self.lease), self.topics]
            ).fetchall()
        except DB_GONE as err:
            self._lost_connection(err)
            return None
        # A sink that takes batches (the job sink) gets this claim's messages of its topics in
        # one call; the others one message per call, each on a thread of the pool.
        batches: dict[int, tuple[BatchSink, list[OutboxMessage]]] = {}
        for msg_id, topic, key, payload, headers, attempt in rows:
            message = OutboxMessage(
                id=msg_id,
                topic=topic,
                key=key,
                payload=payload,
                headers=headers or {},
                attempt=attempt,
            )
            self._in_flight += 1
            sink = self.app.outbox.sink_for(topic)
            if isinstance(sink, BatchSink):
                batches.setdefault(id(sink), (sink, []))[1].append(message)
            else:
                pool.submit(self._deliver, message)
        for sink, messages in batches.values():
            pool.submit(self._deliver_batch, sink, messages)
        return len(rows)

    def _deliver(self, message: OutboxMessage) -> None:
        sink = self.app.outbox.sink_for(message.topic)
        try:
            if sink is None:
                raise DeliveryError(f"no sink for topic {message.topic!r}", retryable=False)
            sink.deliver(message)
            result = _Result(message, ok=True)
        except Exception as err:
            result = _failed(message, err)
        self._results.put(result)
        self._wake.set()

    def _deliver_batch(self, sink: BatchSink, messages: list[OutboxMessage]) -> None:
        try:
            errors = sink.deliver_batch(messages)
            results = [
                _Result(m, ok=True) if e is None else _failed(m, e)
                for m, e in zip(messages, errors, strict=True)
            ]
        except Exception as err:
            results = [_failed(m, err) for m in messages]
        for result in results:
            self._results.put(result)
        self._wake.set()

    def _collect(self) -> list[_Result]:
        done: list[_Result] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                return done

    def _settle(self, results: list[_Result]) -> bool:
        """Ack the delivered messages in one call, nack the others. False (results kept by the
        caller) when the database is away."""
        conn = self._ensure_connection()
        if conn is None:
            return False
        delivered = [r.message.id for r in results if r.ok]
        try:
            if delivered:
                acked = {row[0] for row in conn.execute(ACK, [delivered, self.relay_id])}
                lost = [i for i in delivered if i not in acked]
                if lost:
                    logger.warning(
                        "delivered after the lease lapsed: another relay delivers them again",
                        extra={"ids": lost},
                    )
            for result in results:
                if result.ok:
                    continue
                try:
                    row = conn.execute(
                        NACK,
                        [
                            result.message.id,
                            self.relay_id,
                            storable(result.error or "delivery failed"),
                            result.retry_at,
                            result.retryable,
                        ],
                    ).fetchone()
                except DB_GONE:
                    raise
                except psycopg.Error as err:
                    # One refused nack must not stop the relay: the message's lease lapses and
                    # it goes out again.
                    logger.error(
                        "could not record a failed delivery; its lease will lapse",
                        extra={"message_id": result.message.id, "error": str(err).strip()},
                    )
                    continue
                state = row[0] if row else None
                logger.warning(
                    "delivery failed",
                    extra={
                        "message_id": result.message.id,
                        "topic": result.message.topic,
                        "attempt": result.message.attempt,
                        "state": state,
                        "error": result.error,
                    },
                )
        except DB_GONE as err:
            self._lost_connection(err)
            return False
        self._in_flight -= len(results)
        self.delivered += len(delivered)
        self.failed += len(results) - len(delivered)
        return True

    # --- the database connection -------------------------------------------------------------

    def _connect(self, *, first: bool = False) -> None:
        conn = connect(self.app.dsn, "x_jobs relay")
        if first and self.check_version:
            try:
                self.app.check_version(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn

    def _ensure_connection(self) -> psycopg.Connection[Any] | None:
        """The connection, reconnecting with backoff while the database is away; None when a
        second stop came meanwhile."""
        delay = 0.1
        while self._conn is None:
            if self._stop_requests >= 2:
                return None
            try:
                self._connect()
                logger.info("database connection back")
            except DB_GONE as err:
                logger.warning(
                    "database unreachable; retrying",
                    extra={"retry_in_s": round(delay, 2), "error": str(err).strip()},
                )
                self._wake.wait(delay)
                self._wake.clear()
                delay = min(delay * 2, 5.0)
        return self._conn

    def _lost_connection(self, err: Exception) -> None:
        logger.warning("database connection lost", extra={"error": str(err).strip()})
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def _listen(self) -> None:
        """LISTEN x_jobs_outbox: a put of one of our topics claims at once (a hint: the relay
        polls as well)."""
        listen(
            self.app.dsn,
            "x_jobs_outbox",
            application_name="x_jobs relay listener",
            wanted=None if self.topics is None else set(self.topics),
            notified=self._notified,
            wake=self._wake,
            running=lambda: not self._stopped.is_set() and self._stop_requests == 0,
        )
