"""The outbox relay: claim messages with ``x_jobs.relay_outbox``, hand each to its topic's sink,
extend the leases of those in flight with ``x_jobs.outbox_extend_lease``, and settle them with
``x_jobs.outbox_ack`` (in batches) or ``x_jobs.outbox_nack``.

Up to ``concurrency`` deliveries run at once, each on a delivery thread of the relay's own; the
relay claims again as soon as half of that room is free, so a slow endpoint holds its own
messages, not the others'. Order per key is the database's doing: ``relay_outbox`` hands out a
key's next message only once the one before it is acked (or dead), so the relay acks as soon as
deliveries finish.

Leases: every ``lease / 3`` (5 s at most) the relay extends the lease of every message it
holds, so that a delivery may take longer than the lease without being claimed and sent again
meanwhile; the lease only has to outlast a few missed heartbeats (a slow or lost database). A
message found no longer held (its lease lapsed while the database was away, and another relay
took it) is logged; its delivery's ack finds it gone.

Delivery is at least once. A relay that dies after a delivery and before its ack leaves the
message in flight until its lease lapses; then a relay delivers it again.

A lost connection is reconnected with backoff; any other refusal of the database (a read-only
session during a failover, a privilege revoked) is logged, and claiming, extending and settling
pause with backoff on a fresh session; what is to be settled is kept meanwhile.

Stopping: the first SIGTERM or SIGINT claims nothing more, lets the deliveries in flight finish
(within ``grace``), acks them and exits; a second one exits at once. What is still in flight
then (a sink that hangs, a database away) is left to its lease: another relay delivers it once
the lease lapses. The delivery threads are daemon threads, so a sink that never returns does not
keep the process alive.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from types import FrameType
from typing import Any, LiteralString

import psycopg

from x_jobs import _leased as leased
from x_jobs._conn import connect
from x_jobs._leased import (
    MAX_BACKOFF_SECONDS,
    ClaimPacer,
    Link,
    Reconnect,
    Stopping,
    default_id,
)
from x_jobs._listen import DB_GONE, LISTEN_DSN_ENV, listen
from x_jobs._refusal import refuses_value
from x_jobs._watch import for_leases, patience
from x_jobs.app import App
from x_jobs.errors import DeliveryError, PermissionDenied, storable
from x_jobs.jobs import Seconds, interval, seconds
from x_jobs.metrics import DEAD, DEFAULT_HOST, DELIVERED, LOST, RETRIED, RelayMetrics
from x_jobs.sinks import BatchSink, OutboxMessage

logger = logging.getLogger(__name__)

CLAIM: LiteralString = """
    SELECT id, topic, key, payload::text, headers, attempt
    FROM x_jobs.relay_outbox(relay => %s, qty => %s, lease => %s, topics => %s)
"""
EXTEND: LiteralString = """
    SELECT e FROM x_jobs.outbox_extend_lease(ids => %s, relay => %s, lease => %s) AS e
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


def _described(err: BaseException) -> str:
    """``Type: message``; the type alone when the exception's ``str()`` itself fails (it is the
    sink's code, and may)."""
    name = type(err).__name__
    try:
        text = str(err)
    except BaseException:  # whatever it raises, the failure is still recorded
        return f"{name} (its message could not be read)"
    return f"{name}: {text}" if text else name


def _failed(message: OutboxMessage, err: BaseException) -> _Result:
    if isinstance(err, DeliveryError):
        try:
            retry_at = err.retry_at if isinstance(err.retry_at, datetime) else None
            return _Result(
                message,
                ok=False,
                error=str(err),
                retryable=bool(err.retryable),
                retry_at=retry_at,
            )
        except BaseException:  # a subclass's str() or attributes: as any exception, below
            pass
    # Any other failure of a sink is worth another try, with the outbox's backoff.
    return _Result(message, ok=False, error=_described(err))


def default_relay_id() -> str:
    return default_id(":relay")


class _DeliveryThreads:
    """The relay's delivery threads: daemon threads, started as the deliveries in flight need
    them (never more than the most that ran at once), each taking the next task when it is done.

    Not a ThreadPoolExecutor: the interpreter joins its threads at exit, so one sink that never
    returned kept a stopped relay's process alive for good, whatever the signals."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._busy = 0

    def submit(self, task: Callable[[], None]) -> None:
        with self._lock:
            self._busy += 1
            start = self._busy > self._threads
            if start:
                self._threads += 1
                name = f"x_jobs-deliver-{self._threads}"
        self._tasks.put(task)
        if start:
            threading.Thread(target=self._serve, name=name, daemon=True).start()

    def _serve(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except BaseException:  # a task reports its own outcome; the thread serves on
                logger.exception("a delivery task failed")
            finally:
                with self._lock:
                    self._busy -= 1

    def shutdown(self) -> None:
        """The idle threads end; those still delivering are left to end with the process."""
        with self._lock:
            threads = self._threads
        for _ in range(threads):
            self._tasks.put(None)


class Relay:
    """Delivers the outbox messages of the topics ``app.outbox`` has sinks for.

    ``metrics_port``: serve Prometheus metrics there, on ``metrics_host`` (default every IPv4
    interface; ``127.0.0.1`` keeps them on this machine): messages claimed and settled by topic
    and outcome, delivery times, messages in flight (see ``x_jobs.metrics.RelayMetrics``).

    ``listen_dsn`` (default ``X_JOBS_LISTEN_DSN``, else ``app.dsn``): where the relay LISTENs
    for the notifications of new messages, as the worker's (docs/poolers.md)."""

    def __init__(
        self,
        app: App,
        *,
        concurrency: int = 16,
        lease: Seconds = 60,
        poll_interval: Seconds = 1.0,
        heartbeat_interval: Seconds | None = None,
        grace: Seconds = 30,
        relay_id: str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = DEFAULT_HOST,
        check_version: bool = True,
        listen_dsn: str | None = None,
    ) -> None:
        if not app.outbox.sinks:
            raise ValueError("the relay has no sink: register one with app.outbox.webhook/...")
        if concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more, not {concurrency}")
        self.app = app
        self.concurrency = concurrency
        # The lease is not checked against the sinks' timeouts: the heartbeat extends the lease
        # of a delivery however long it runs, so the lease only has to outlast a few heartbeats
        # (lease / 3 apart), whatever the sinks' timeouts.
        self.lease = seconds(lease)
        self.heartbeat_interval = leased.heartbeat_interval(
            self.lease, None if heartbeat_interval is None else seconds(heartbeat_interval)
        )
        if not 0 < self.heartbeat_interval < self.lease:
            raise ValueError(
                f"heartbeat interval {self.heartbeat_interval:g} s must be positive and shorter"
                f" than the lease ({self.lease:g} s)"
            )
        self.poll_interval = seconds(poll_interval)
        self.grace = seconds(grace)
        self.relay_id = relay_id or default_relay_id()
        self.check_version = check_version
        #: Where the listener LISTENs, when not at app.dsn (None), as the worker's.
        self.listen_dsn = listen_dsn or os.environ.get(LISTEN_DSN_ENV) or None
        self.topics = app.outbox.topics
        # As the worker's: patience on a silent network, and a watch of its calls.
        self._patience = patience(self.lease)
        self._watch = for_leases(
            "x_jobs-relay-watch",
            app.dsn,
            lease=self.lease,
            heartbeat_interval=self.heartbeat_interval,
        )
        self._link = Link(self._watch, "relay", logger)
        self._results: queue.SimpleQueue[_Result] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._notified = threading.Event()
        self._stopping = Stopping(self._wake, logger)
        #: Messages claimed and not settled yet: delivering, or their outcome to be settled.
        self._in_flight = 0
        #: The ids of those messages; True while this relay still holds the message's lease
        #: (the heartbeat extends it), False once the heartbeat found it lost.
        self._held: dict[int, bool] = {}
        #: Outcomes of ended deliveries waiting for their ack or nack.
        self._pending: list[_Result] = []
        self._next_heartbeat = 0.0
        #: After a refusal of the database, no claim, heartbeat or settlement before this.
        self._paused_until = 0.0
        self._pause = 0.1
        self._reconnect = Reconnect(cap=MAX_BACKOFF_SECONDS)
        self._drain_deadline: float | None = None
        self._stopped = threading.Event()
        #: How many messages this relay delivered and failed: for logs and tests.
        self.delivered = 0
        self.failed = 0
        #: Served at metrics_host:metrics_port when a port is given (see x_jobs.metrics).
        self.metrics = RelayMetrics(
            metrics_port,
            metrics_host,
            in_flight=lambda: float(self._in_flight),
            topics=[topic for topic in app.outbox.sinks if topic != "*"],
        )

    # --- public -------------------------------------------------------------------------------

    def run(self, *, install_signals: bool = True) -> None:
        """Relay until stopped (``stop()`` or a signal); blocks the calling thread."""
        if install_signals:
            self._stopping.install_signals()
        logger.info(
            "relay starting",
            extra={"relay": self.relay_id, "topics": self.topics or "*", "lease_s": self.lease},
        )
        self._connect(first=True)
        listener = threading.Thread(target=self._listen, name="x_jobs-relay-listen", daemon=True)
        listener.start()
        self._watch.start()
        threads = _DeliveryThreads()
        try:
            self._loop(threads)
        finally:
            self._watch.stop()
            threads.shutdown()
            if self._in_flight:
                # A sink still running past the grace (or a second signal), or outcomes the
                # database was not there to take: not acked. Their leases lapse and another
                # relay sends them again.
                logger.warning(
                    "stopping with messages in flight: left to their leases",
                    extra={
                        "in_flight": self._in_flight,
                        "unsettled": len(self._pending),
                        "ids": sorted(self._held),
                    },
                )
            for sink in self.app.outbox.sinks.values():
                sink.close()
            self._link.close()
            self.metrics.close()
            self._stopped.set()
            logger.info(
                "relay stopped",
                extra={"relay": self.relay_id, "delivered": self.delivered, "failed": self.failed},
            )

    def stop(self) -> None:
        self._stopping.stop()

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # --- the loop -----------------------------------------------------------------------------

    @property
    def _conn(self) -> psycopg.Connection[Any] | None:
        """The relay's connection, None while lost."""
        return self._link.conn

    @_conn.setter
    def _conn(self, conn: psycopg.Connection[Any] | None) -> None:
        self._link.conn = conn

    @property
    def _stop_requests(self) -> int:
        return self._stopping.requests

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping.on_signal(signum, frame)

    def _must_stop(self) -> bool:
        """Whether the loop ends now: a second stop came, or the drain's grace ran out. The first
        stop begins the drain (wherever the loop is: reconnecting too)."""
        if self._stop_requests >= 2:
            return True
        if self._stop_requests == 1:
            now = time.monotonic()
            if self._drain_deadline is None:
                self._drain_deadline = now + self.grace
                logger.info("draining: claiming nothing more", extra={"in_flight": self._in_flight})
            return now >= self._drain_deadline
        return False

    def _loop(self, threads: _DeliveryThreads) -> None:
        pacer = ClaimPacer(self.poll_interval, self._notified)
        while True:
            if self._must_stop():
                return
            paused = time.monotonic() < self._paused_until
            if self._conn is None and not paused and self._ensure_connection() is None:
                continue  # gave up: stopping
            self._pending.extend(self._collect())
            if self._conn is not None and not paused:
                if self._pending:
                    self._settle()
                if self._conn is not None and time.monotonic() >= self._next_heartbeat:
                    self._heartbeat()
            now = time.monotonic()
            paused = now < self._paused_until
            if self._drain_deadline is not None:
                if self._in_flight == 0:
                    return
                # Only the deliveries in flight matter now: each one that ends sets _wake.
                wait = 1.0
            else:
                room = self.concurrency - self._in_flight
                can_claim = self._conn is not None and not paused
                holding = self._in_flight > 0
                if pacer.due(now) and can_claim and pacer.room_for(room, self.concurrency, holding):
                    got = self._claim(threads, room)
                    if got is None:
                        continue  # lost (the top reconnects) or refused (a pause began)
                    pacer.claimed(got, room)
                # Due to claim but without room: wait for a delivery to end (it sets _wake), not
                # for the poll time, which has passed (waiting for it would spin). Else until
                # the next poll, or sooner on a notification or an ended delivery.
                wait = 1.0 if pacer.claim_now else min(pacer.next_poll - time.monotonic(), 1.0)
            # Never past the next heartbeat, the end of a pause or the drain's deadline.
            now = time.monotonic()
            if paused:
                wait = min(wait, self._paused_until - now)
            elif self._conn is not None:
                wait = min(wait, self._next_heartbeat - now)
            if self._drain_deadline is not None:
                wait = min(wait, self._drain_deadline - now)
            if self._wake.wait(timeout=max(0.0, wait)):
                self._wake.clear()

    def _claim(self, threads: _DeliveryThreads, room: int) -> int | None:
        """Claim up to ``room`` messages and start their deliveries; None when the database is
        away or refused (then claiming pauses)."""
        assert self._conn is not None
        try:
            rows = self._link.query(CLAIM, [self.relay_id, room, interval(self.lease), self.topics])
        except DB_GONE as err:
            self._lost_connection(err)
            return None
        except psycopg.errors.InsufficientPrivilege as err:
            # A login without x_jobs_worker: no retry will be granted it. Fatal, as the
            # worker's first claim is (x-jobs relay exits 2 with X_PERMISSION_DENIED).
            raise PermissionDenied.of(err) from err
        except psycopg.Error as err:
            self._refused("claiming", err)
            return None
        self._pause = 0.1
        # A sink that takes batches (the job sink) gets this claim's messages of its topics in
        # one call; the others one message per call, each on a delivery thread.
        batches: dict[int, tuple[BatchSink, list[OutboxMessage]]] = {}
        for msg_id, topic, key, payload, headers, attempt in rows:
            message = OutboxMessage(
                id=msg_id,
                topic=topic,
                key=key,
                # As text, parsed here as psycopg would: the webhook sink sends the text's
                # numbers as they are, not as floats made of them.
                payload=json.loads(payload),
                headers=headers or {},
                attempt=attempt,
                payload_json=payload,
            )
            self._in_flight += 1
            self._held[msg_id] = True
            self.metrics.claimed(topic)
            sink = self.app.outbox.sink_for(topic)
            if isinstance(sink, BatchSink):
                batches.setdefault(id(sink), (sink, []))[1].append(message)
            else:
                threads.submit(functools.partial(self._deliver, message))
        for sink, messages in batches.values():
            threads.submit(functools.partial(self._deliver_batch, sink, messages))
        return len(rows)

    def _deliver(self, message: OutboxMessage) -> None:
        # Every delivery reports an outcome, whatever the sink raises: without one the message
        # would count as in flight for good, its room never freed. A BaseException that is no
        # Exception (SystemExit, asyncio.CancelledError, a library's own) too, and even a
        # KeyboardInterrupt: Python raises that one in the main thread only, so here a sink
        # raised it itself. None is raised on: in a delivery thread it would only end the
        # thread.
        result = _Result(message, ok=False, error="the delivery ended without an outcome")
        started = time.monotonic()
        try:
            sink = self.app.outbox.sink_for(message.topic)
            if sink is None:
                raise DeliveryError(f"no sink for topic {message.topic!r}", retryable=False)
            sink.deliver(message)
            result = _Result(message, ok=True)
        except BaseException as err:  # see above
            result = _failed(message, err)
        finally:
            self._report([result], time.monotonic() - started)

    def _deliver_batch(self, sink: BatchSink, messages: list[OutboxMessage]) -> None:
        # As _deliver: an outcome per message whatever happens.
        results = [
            _Result(m, ok=False, error="the delivery ended without an outcome") for m in messages
        ]
        started = time.monotonic()
        try:
            errors = sink.deliver_batch(messages)
            results = [
                _Result(m, ok=True) if e is None else _failed(m, e)
                for m, e in zip(messages, errors, strict=True)
            ]
        except BaseException as err:  # see _deliver
            results = [_failed(m, err) for m in messages]
        finally:
            self._report(results, time.monotonic() - started)

    def _report(self, results: list[_Result], seconds: float) -> None:
        for result in results:
            self.metrics.delivered(result.message.topic, seconds)
            self._results.put(result)
        self._wake.set()

    def _collect(self) -> list[_Result]:
        done: list[_Result] = []
        while True:
            try:
                done.append(self._results.get_nowait())
            except queue.Empty:
                return done

    def _heartbeat(self) -> None:
        """Extend the leases of the messages this relay holds; log those it no longer holds."""
        assert self._conn is not None
        self._next_heartbeat = time.monotonic() + self.heartbeat_interval
        ids = [msg_id for msg_id, held in self._held.items() if held]
        if not ids:
            return
        try:
            rows = self._link.query(EXTEND, [ids, self.relay_id, interval(self.lease)])
        except DB_GONE as err:
            self._lost_connection(err)
            return
        except psycopg.Error as err:
            self._refused("extending the leases", err)
            return
        self._pause = 0.1
        kept = {row[0] for row in rows}
        lost = [msg_id for msg_id in ids if msg_id not in kept]
        for msg_id in lost:
            self._held[msg_id] = False
        if lost:
            logger.warning(
                "lost the lease of messages in flight (it lapsed, and another relay may deliver"
                " them again): their acks will find them gone",
                extra={"ids": lost},
            )

    def _settle(self) -> None:
        """Ack the delivered messages of ``self._pending`` in one call, nack the others. What the
        database did not take (away, or refusing) stays in ``self._pending`` for a later turn."""
        assert self._conn is not None
        conn = self._conn
        delivered = [r for r in self._pending if r.ok]
        results = delivered + [r for r in self._pending if not r.ok]
        settled = 0
        try:
            with self._link.calling():
                if delivered:
                    ids = [r.message.id for r in delivered]
                    acked = {row[0] for row in conn.execute(ACK, [ids, self.relay_id])}
                    lost = [i for i in ids if i not in acked]
                    if lost:
                        logger.warning(
                            "delivered after the lease lapsed: another relay delivers them again",
                            extra={"ids": lost},
                        )
                    for r in delivered:
                        outcome = DELIVERED if r.message.id in acked else LOST
                        self.metrics.settled(r.message.topic, outcome)
                    settled = len(delivered)
                for result in results[settled:]:
                    self.metrics.settled(result.message.topic, self._nack(conn, result))
                    settled += 1
        except DB_GONE as err:
            self._lost_connection(err)
        except psycopg.Error as err:
            self._refused("settling", err)
        else:
            self._pause = 0.1
        finally:
            done, self._pending = results[:settled], results[settled:]
            for result in done:
                self._held.pop(result.message.id, None)
            self._in_flight -= len(done)
            self.delivered += sum(1 for r in done if r.ok)
            self.failed += sum(1 for r in done if not r.ok)

    def _nack(self, conn: psycopg.Connection[Any], result: _Result) -> str:
        """Record a failed delivery; answers its outcome (RETRIED, DEAD, or LOST when the
        message was no longer this relay's or its failure could not be recorded). Raises when
        the database is away or refuses for a reason of its own (the caller keeps the outcome and
        tries again later)."""
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
        except Exception as err:
            # Anything but a refusal of a value (see x_jobs._refusal: the session's state, a
            # read-only one say, or the way to the database) is raised, the outcome kept.
            if not refuses_value(err):
                raise
            # Refused for what it says (a value the database cannot store): trying again would
            # be refused again, and must not stop the relay. The message's lease lapses and it
            # goes out again.
            logger.error(
                "could not record a failed delivery; its lease will lapse",
                extra={"message_id": result.message.id, "error": str(err).strip()},
            )
            return LOST
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
        return DEAD if state == "dead" else RETRIED if state == "pending" else LOST

    # --- the database connection -------------------------------------------------------------

    def _connect(self, *, first: bool = False) -> None:
        conn = connect(self.app.dsn, "x_jobs relay", patience=self._patience)
        if first and self.check_version:
            try:
                self.app.check_version(conn)
            except BaseException:
                conn.close()
                raise
        self._conn = conn

    def _ensure_connection(self) -> psycopg.Connection[Any] | None:
        """The connection, reconnecting with backoff while the database is away; None when the
        relay must stop meanwhile (a second stop, or the drain's grace ran out)."""
        wait, delay = self._reconnect.start()
        if wait:
            self._wait_to_reconnect(wait)
        while self._conn is None:
            if self._must_stop():
                return None
            try:
                self._connect()
                self._reconnect.connected(delay)
                logger.info("database connection back")
                # Extend the leases before anything else: one that lapsed meanwhile is still
                # this relay's unless another relay took it.
                self._next_heartbeat = 0.0
            except DB_GONE as err:
                logger.warning(
                    "database unreachable; retrying",
                    extra={"retry_in_s": round(delay, 2), "error": str(err).strip()},
                )
                self._wait_to_reconnect(delay)
                delay = self._reconnect.after(delay)
        return self._conn

    def _wait_to_reconnect(self, delay: float) -> None:
        """Wait ``delay`` before a reconnect, no later than the drain's deadline; a delivery
        that ends meanwhile ends the wait (its outcome is collected)."""
        if self._drain_deadline is not None:
            delay = min(delay, max(0.0, self._drain_deadline - time.monotonic()))
        if self._wake.wait(delay):
            self._wake.clear()

    def _lost_connection(self, err: Exception) -> None:
        self._link.lost(err)

    def _refused(self, what: str, err: psycopg.Error) -> None:
        """The database refused a statement of the loop's own, the connection still up: a
        read-only session during a failover (a claim refused for want of a privilege is fatal
        instead, see _claim). Log it, and pause claiming,
        extending and settling with backoff; then go on on a new session (a session keeps
        what it started with, a read-only default say, so the old one might never recover)."""
        logger.error(
            f"{what} was refused; retrying",
            extra={"retry_in_s": round(self._pause, 2), "error": str(err).strip()},
        )
        self._paused_until = time.monotonic() + self._pause
        self._pause = min(self._pause * 2, MAX_BACKOFF_SECONDS)
        self._link.close()

    def _listen(self) -> None:
        """LISTEN x_jobs_outbox: a put of one of our topics claims at once (a hint: the relay
        polls as well, and the listener warns once if notifications cannot arrive)."""
        listen(
            self.listen_dsn or self.app.dsn,
            "x_jobs_outbox",
            notify_dsn=self.app.dsn,
            application_name="x_jobs relay listener",
            wanted=None if self.topics is None else set(self.topics),
            notified=self._notified,
            wake=self._wake,
            running=lambda: not self._stopped.is_set() and self._stop_requests == 0,
            poll_interval=self.poll_interval,
            who="relay",
        )
