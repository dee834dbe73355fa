"""What a worker and a relay expose in the Prometheus text format, at an optional host and port.

Each worker and relay has a registry of its own, so that several in one process (tests, an
embedding application) do not collide on metric names.

No label is named ``job`` or ``instance``: Prometheus attaches those to every series of a
target, and renames a scraped label of the same name to ``exported_job``; a job's name is the
label ``job_name``. The queue gauges are the same on every worker (each reads the same
snapshot, see :class:`QueueGauges`), so queries take ``max by (queue, state)`` over them and
``sum by (job_name)`` over the counters. docs/operations.md has the queries.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import timedelta
from itertools import accumulate
from typing import Any, LiteralString

import psycopg
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from x_jobs._conn import connect, redact
from x_jobs.errors import MetricsPortUnavailable as MetricsPortUnavailable  # noqa: PLC0414 - re-exported here

logger = logging.getLogger(__name__)

#: Where metrics are served unless told otherwise: every IPv4 interface, since Prometheus
#: scrapes from another host. 127.0.0.1 keeps them on this machine; ``::`` serves IPv6 too.
DEFAULT_HOST = "0.0.0.0"

#: How often a worker reads the queue gauges, seconds; the snapshot may be that old.
GAUGE_INTERVAL = 15.0

#: The settled states whose series a declared job shows at 0 from the start (see declare).
DECLARED_STATES = ("done", "dead", "failed")


def serve(registry: CollectorRegistry, port: int, host: str = DEFAULT_HOST) -> Any:
    """Serve ``registry`` at http://host:port/metrics from a daemon thread; the server, for
    :func:`shut_down`. A host or port that cannot be bound is MetricsPortUnavailable."""
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as err:  # a busy port, an address of no interface here, a name unknown
        raise MetricsPortUnavailable(
            f"X_METRICS_PORT_UNAVAILABLE: cannot serve metrics on port {port} of {host}:"
            f" {err.strerror or err}",
            hint=f"Nothing could listen on {host} port {port}: pass a --metrics-port that no"
            " other process listens on and a --metrics-host that is an address of this machine"
            " (0.0.0.0: every interface; 127.0.0.1: this machine only).",
        ) from err
    logger.info("metrics served", extra={"host": host, "port": port})
    return server


def shut_down(server: Any) -> None:
    if server is not None:
        server.shutdown()
        server.server_close()


class _Children:
    """Labelled children of metrics, looked up once per label values: a labels() call per job
    cost a tenth of the dispatcher's time on no-op jobs."""

    def __init__(self) -> None:
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


class WorkerMetrics:
    """x_jobs_claimed_total{job_name}, x_jobs_settled_total{job_name,state},
    x_jobs_run_seconds{job_name}, x_jobs_held; and, served with a ``dsn``, the queue gauges
    (:class:`QueueGauges`) once :meth:`start` is called."""

    def __init__(
        self,
        port: int | None = None,
        host: str = DEFAULT_HOST,
        *,
        dsn: str | None = None,
        queues: Sequence[str] = (),
        gauge_interval: float = GAUGE_INTERVAL,
    ) -> None:
        self.registry = CollectorRegistry()
        self._claimed = Counter(
            "x_jobs_claimed", "Jobs claimed", ["job_name"], registry=self.registry
        )
        self._settled = Counter(
            "x_jobs_settled",
            "Jobs settled, by the state the row is in afterwards (done, delayed/ready for a retry, "
            "dead, failed), or cancelled, lost, released or suspended",
            ["job_name", "state"],
            registry=self.registry,
        )
        self._seconds = _RunSeconds()
        self.registry.register(self._seconds)
        self._running = Gauge(
            "x_jobs_held", "Jobs held now, running or waiting to run", registry=self.registry
        )
        self._child = _Children()
        #: Read only where metrics are served: nobody would see them otherwise.
        self.gauges: QueueGauges | None = None
        if port is not None and dsn is not None:
            self.gauges = QueueGauges(dsn, queues, gauge_interval)
            self.registry.register(self.gauges)
        self._server: Any = None
        if port is not None:
            self._server = serve(self.registry, port, host)

    def start(self) -> None:
        """Start reading the queue gauges (the worker connected: the database is there)."""
        if self.gauges is not None:
            self.gauges.start()

    def declare(self, jobs: Iterable[str]) -> None:
        """Show the series of these job names at 0 before anything happens to them (claimed,
        done, dead, failed, the run times): a series that first appears at 1 has no increase
        for rate() and increase() to see, so the first job done, or the first dead one an alert
        waits for, would go unseen."""
        for job in jobs:
            self._child(self._claimed, job)
            for state in DECLARED_STATES:
                self._child(self._settled, job, state)
            self._seconds.observe(job, ())

    def claimed(self, job: str, n: int = 1) -> None:
        self._child(self._claimed, job).inc(n)
        self._running.inc(n)

    def settled(self, job: str, state: str, *, held: bool = True, n: int = 1) -> None:
        """``n`` jobs left this worker: settled in ``state``, lost, or released. ``held`` is
        False for a row the claim buried, which this worker never held."""
        self._child(self._settled, job, state).inc(n)
        if held:
            self._running.dec(n)

    def observe(self, job: str, seconds: Sequence[float]) -> None:
        """The run times (claim to settlement) of a settled batch of ``job``."""
        self._seconds.observe(job, seconds)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (tests read counters through this)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def close(self) -> None:
        if self.gauges is not None:
            self.gauges.stop()
        shut_down(self._server)
        self._server = None


class _RunSeconds(Collector):
    """x_jobs_run_seconds{job_name}, a histogram with prometheus_client's default buckets,
    observed a settled batch at a time under one lock. Histogram.observe takes two locks per
    job, a few percent of the dispatcher's time on no-op jobs."""

    NAME = "x_jobs_run_seconds"
    HELP = "Run time of settled jobs: from the handler's start to the settlement"

    def __init__(self) -> None:
        self._bounds = [bound for bound in Histogram.DEFAULT_BUCKETS if bound != float("inf")]
        self._lock = threading.Lock()
        #: Per job name: how many runs fell in each bucket (not cumulative), the last one +Inf.
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, job: str, seconds: Sequence[float]) -> None:
        # A run of exactly a bound's length counts in that bound's bucket (le: less or equal).
        slots = [bisect_left(self._bounds, value) for value in seconds]
        total = sum(seconds)
        with self._lock:
            counts = self._counts.get(job)
            if counts is None:
                counts = self._counts[job] = [0] * (len(self._bounds) + 1)
                self._sums[job] = 0.0
            for slot in slots:
                counts[slot] += 1
            self._sums[job] += total

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.NAME, self.HELP, labels=["job_name"])]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            taken = [(job, list(counts), self._sums[job]) for job, counts in self._counts.items()]
        family = HistogramMetricFamily(self.NAME, self.HELP, labels=["job_name"])
        # As prometheus_client prints bounds: 1.0, not 1.
        labels = [repr(float(bound)) for bound in self._bounds] + ["+Inf"]
        for job, counts, total in taken:
            family.add_metric([job], list(zip(labels, accumulate(counts), strict=True)), total)
        yield family


# --- the queue gauges ---------------------------------------------------------------------------

VERSION: LiteralString = "SELECT x_jobs.version()"
#: Bounds the read on the server (SET LOCAL: it ends with the transaction, as a pooler in
#: transaction mode needs).
READ_TIMEOUT: LiteralString = "SELECT pg_catalog.set_config('statement_timeout', %s, true)"
GAUGES: LiteralString = """
    SELECT queue, ready, delayed, suspended, running, paused, demand,
           extract(epoch FROM taken_at)::float8
    FROM x_jobs.queue_gauges(max_age => %s, queues => %s)
"""
#: The live states, in the order x_jobs.queue_gauges answers them.
STATES = ("ready", "delayed", "suspended", "running")
#: queue_gauges came with this version; an older database has no gauges to read.
GAUGES_SINCE = (0, 4, 0)


def _version(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return ()


class QueueGauges(Collector):
    """x_jobs_queue_jobs{queue,state} (the live rows: ready, delayed, suspended, running),
    x_jobs_queue_paused{queue}, x_jobs_queue_demand{queue} and
    x_jobs_queue_snapshot_timestamp_seconds (when the database counted them).

    A thread of its own reads ``x_jobs.queue_gauges(max_age => interval)`` once per
    ``interval``, on a connection of its own and within a statement timeout of its own, so a
    slow count never holds up a claim; a scrape answers what the last read found. The database
    counts at most once per interval whatever the number of workers: the others are answered
    its stored snapshot. The queues this worker serves are asked for by name, so that they show
    at 0 when they hold no live row (and the snapshot's time comes with them). A read that
    fails is logged and tried again an interval later; values not read again for three
    intervals are dropped rather than shown stale.
    """

    def __init__(self, dsn: str, queues: Sequence[str], interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"gauge_interval must be positive, not {interval:g}")
        self.dsn = dsn
        self.queues = list(queues)
        self.interval = interval
        #: The server gives a read this long (and a connect as long, see _conn.connect).
        self.timeout = max(1.0, min(interval, 10.0))
        self._lock = threading.Lock()
        self._rows: list[tuple[Any, ...]] = []
        self._taken_at: float | None = None
        self._read_at: float | None = None
        #: How many reads the database answered: for logs and tests.
        self.reads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="x_jobs-gauges", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The thread ends after its read in progress, if any (it waits for nobody)."""
        self._stop.set()

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    if conn is None:
                        conn = connect(self.dsn, "x_jobs gauges", patience=self.timeout)
                        if not self._supported(conn):
                            return
                    self._read(conn)
                    if failing:
                        logger.info("queue gauges read again")
                    failing = False
                except psycopg.Error as err:
                    if not failing:  # once per streak of failures, not every interval
                        logger.warning(
                            "could not read the queue gauges; trying again",
                            extra={"error": redact(str(err).strip()), "retry_in_s": self.interval},
                        )
                    failing = True
                    if conn is not None:
                        conn.close()
                    conn = None
                self._stop.wait(self.interval)
        except Exception:
            # A bug here must not go unseen, nor take anything else down.
            logger.exception("the queue gauges stopped")
        finally:
            if conn is not None:
                conn.close()

    def _supported(self, conn: psycopg.Connection[Any]) -> bool:
        row = conn.execute(VERSION).fetchone()
        version = str(row[0]) if row else "?"
        if _version(version) >= GAUGES_SINCE:
            return True
        logger.info("no queue gauges: they need x_jobs 0.4.0 or later", extra={"version": version})
        return False

    def _read(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            conn.execute(READ_TIMEOUT, [f"{int(self.timeout * 1000)}ms"])
            rows = conn.execute(GAUGES, [timedelta(seconds=self.interval), self.queues]).fetchall()
        taken = rows[0][7] if rows else None
        with self._lock:
            self._rows = rows
            self._taken_at = taken
            self._read_at = time.monotonic()
            self.reads += 1

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows, taken_at, read_at = self._rows, self._taken_at, self._read_at
        fresh = read_at is not None and time.monotonic() - read_at <= 3 * self.interval
        yield from self._families(rows if fresh else None, taken_at if fresh else None)

    def _families(
        self, rows: list[tuple[Any, ...]] | None = None, taken_at: float | None = None
    ) -> Iterator[Metric]:
        jobs = GaugeMetricFamily(
            "x_jobs_queue_jobs",
            "Live jobs per queue and state (ready, delayed, suspended, running), as the database "
            "counted them at x_jobs_queue_snapshot_timestamp_seconds; the same on every worker",
            labels=["queue", "state"],
        )
        paused = GaugeMetricFamily(
            "x_jobs_queue_paused", "1 when the queue is paused, else 0", labels=["queue"]
        )
        demand = GaugeMetricFamily(
            "x_jobs_queue_demand",
            "Jobs a serving worker must hold per queue, as x_jobs.queue_demand() counts them",
            labels=["queue"],
        )
        snapshot = GaugeMetricFamily(
            "x_jobs_queue_snapshot_timestamp_seconds",
            "When the database took the queue gauges' snapshot (Unix time)",
        )
        if rows is not None:
            for queue, *counts, is_paused, wanted, _taken in rows:
                for state, count in zip(STATES, counts, strict=True):
                    jobs.add_metric([queue, state], float(count))
                paused.add_metric([queue], 1.0 if is_paused else 0.0)
                demand.add_metric([queue], float(wanted))
            if taken_at is not None:
                snapshot.add_metric([], taken_at)
        yield from (jobs, paused, demand, snapshot)


# --- the relay ------------------------------------------------------------------------------------

#: How a settled message ended, the ``outcome`` label of x_jobs_relay_settled_total.
DELIVERED, RETRIED, DEAD, LOST = "delivered", "retried", "dead", "lost"


class RelayMetrics:
    """x_jobs_relay_claimed_total{topic}, x_jobs_relay_settled_total{topic,outcome},
    x_jobs_relay_delivery_seconds{topic} and x_jobs_relay_in_flight. The ``topics`` named (those
    with a sink of their own) show at 0 from the start, as a worker's declared jobs do."""

    def __init__(
        self,
        port: int | None = None,
        host: str = DEFAULT_HOST,
        *,
        in_flight: Callable[[], float] | None = None,
        topics: Iterable[str] = (),
    ) -> None:
        self.registry = CollectorRegistry()
        self._claimed = Counter(
            "x_jobs_relay_claimed", "Outbox messages claimed", ["topic"], registry=self.registry
        )
        self._settled = Counter(
            "x_jobs_relay_settled",
            "Outbox messages settled, by outcome: delivered (acked), retried (nacked, to be sent "
            "again), dead (nacked for good), lost (the lease lapsed before the ack or nack: "
            "another relay sends it again)",
            ["topic", "outcome"],
            registry=self.registry,
        )
        self._seconds = Histogram(
            "x_jobs_relay_delivery_seconds",
            "Time a sink took to deliver a message, failed deliveries included (a batch sink's "
            "call counts for each of its messages)",
            ["topic"],
            registry=self.registry,
        )
        gauge = Gauge(
            "x_jobs_relay_in_flight",
            "Messages claimed and not settled yet: delivering, or waiting for their ack or nack",
            registry=self.registry,
        )
        if in_flight is not None:
            gauge.set_function(in_flight)
        self._child = _Children()
        for topic in topics:
            self._child(self._claimed, topic)
            self._child(self._seconds, topic)
            for outcome in (DELIVERED, RETRIED, DEAD):
                self._child(self._settled, topic, outcome)
        self._server: Any = None
        if port is not None:
            self._server = serve(self.registry, port, host)

    def claimed(self, topic: str) -> None:
        self._child(self._claimed, topic).inc()

    def delivered(self, topic: str, seconds: float) -> None:
        """A delivery ended (well or not) after ``seconds``."""
        self._child(self._seconds, topic).observe(seconds)

    def settled(self, topic: str, outcome: str) -> None:
        self._child(self._settled, topic, outcome).inc()

    def value(self, name: str, **labels: str) -> float:
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def close(self) -> None:
        shut_down(self._server)
        self._server = None
