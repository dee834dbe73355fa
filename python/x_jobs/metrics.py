"""Counters and gauges a worker exposes in the Prometheus text format, at an optional port.

Each worker has a registry of its own, so that several workers in one process (tests, an
embedding application) do not collide on metric names.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from x_jobs.errors import ClientError

logger = logging.getLogger(__name__)


class MetricsPortUnavailable(ClientError):
    """The metrics port could not be bound (another process listens there, say)."""

    code = "X_METRICS_PORT_UNAVAILABLE"


class WorkerMetrics:
    """x_jobs_claimed_total, x_jobs_settled_total{state}, x_jobs_run_seconds, x_jobs_held."""

    def __init__(self, port: int | None = None) -> None:
        self.registry = CollectorRegistry()
        self._claimed = Counter("x_jobs_claimed", "Jobs claimed", ["job"], registry=self.registry)
        self._settled = Counter(
            "x_jobs_settled",
            "Jobs settled, by the state the row is in afterwards (done, delayed/ready for a retry, "
            "dead, failed, lost)",
            ["job", "state"],
            registry=self.registry,
        )
        self._seconds = _RunSeconds()
        self.registry.register(self._seconds)
        self._running = Gauge(
            "x_jobs_held", "Jobs held now, running or waiting to run", registry=self.registry
        )
        # Labelled children, looked up once per job name: a labels() call per job cost a tenth
        # of the dispatcher's time on no-op jobs.
        self._children: dict[tuple[str, ...], Any] = {}
        self._server: Any = None
        if port is not None:
            try:
                self._server, _thread = start_http_server(port, registry=self.registry)
            except OSError as err:
                raise MetricsPortUnavailable(
                    f"X_METRICS_PORT_UNAVAILABLE: cannot serve metrics on port {port}:"
                    f" {err.strerror or err}",
                    hint="Pass a --metrics-port that no other process listens on.",
                ) from err
            logger.info("metrics served", extra={"port": port})

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (metric._name, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

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
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _RunSeconds(Collector):
    """x_jobs_run_seconds{job}, a histogram with prometheus_client's default buckets, observed a
    settled batch at a time under one lock. Histogram.observe takes two locks per job, a few
    percent of the dispatcher's time on no-op jobs."""

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
        return [HistogramMetricFamily(self.NAME, self.HELP, labels=["job"])]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            taken = [(job, list(counts), self._sums[job]) for job, counts in self._counts.items()]
        family = HistogramMetricFamily(self.NAME, self.HELP, labels=["job"])
        # As prometheus_client prints bounds: 1.0, not 1.
        labels = [repr(float(bound)) for bound in self._bounds] + ["+Inf"]
        for job, counts, total in taken:
            family.add_metric([job], list(zip(labels, accumulate(counts), strict=True)), total)
        yield family
