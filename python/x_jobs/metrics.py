"""Counters and gauges a worker exposes in the Prometheus text format, at an optional port.

Each worker has a registry of its own, so that several workers in one process (tests, an
embedding application) do not collide on metric names.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

logger = logging.getLogger(__name__)


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
        self._seconds = Histogram(
            "x_jobs_run_seconds", "Time from claim to settlement", ["job"], registry=self.registry
        )
        self._running = Gauge(
            "x_jobs_held", "Jobs held now, running or waiting to run", registry=self.registry
        )
        # Labelled children, looked up once per job name: a labels() call per job cost a tenth
        # of the dispatcher's time on no-op jobs.
        self._children: dict[tuple[str, ...], Any] = {}
        self._server: Any = None
        if port is not None:
            self._server, _thread = start_http_server(port, registry=self.registry)
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

    def settled(
        self, job: str, state: str, seconds: float | None = None, *, held: bool = True, n: int = 1
    ) -> None:
        """``n`` jobs left this worker: settled in ``state``, lost, or released. ``held`` is
        False for a row the claim buried, which this worker never held."""
        self._child(self._settled, job, state).inc(n)
        if held:
            self._running.dec(n)
        if seconds is not None:
            self._child(self._seconds, job).observe(seconds)

    def observe(self, job: str, seconds: float) -> None:
        self._child(self._seconds, job).observe(seconds)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (tests read counters through this)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
