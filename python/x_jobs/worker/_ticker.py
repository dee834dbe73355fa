"""The worker's part in schedules: at its start, write the schedules its App declares (after
the job declarations, so that a schedule's trial enqueue sees them); then, unless told not to,
tick (``x_jobs.tick_schedules``) on a thread and a connection of its own, at once and then at
each whole minute of the database's clock, when cron instants come.

The clock is the database's, read in the tick's own statement (``x_jobs.now()``), not this
machine's: the instants are due by it, and the machines' clocks may drift apart. A jitter of
50 to 250 ms after the minute spreads the workers' ticks; they share the work anyway (SKIP
LOCKED), and whichever comes first fires what is due, so a fire is late by about one tick's own
time. A tick that fails (the database away, a refusal) is logged and tried again at the next
minute; it never stops the worker.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from x_jobs import schedules
from x_jobs._conn import connect
from x_jobs._refusal import described
from x_jobs.app import App
from x_jobs.errors import VersionUnsupported, XJobsError

# The worker's log, whichever part writes it (see _handlers).
logger = logging.getLogger(__package__)

#: After the whole minute, a tick waits this much more (seconds, uniformly drawn).
JITTER = (0.05, 0.25)


def start(conn: psycopg.Connection[Any], app: App, *, worker: str) -> bool:
    """On the worker's first connection, after its job declarations: write the app's schedules
    (create or update, never prune: a worker of an older build must not drop a newer one's).
    Answers whether the database has schedules at all. An app that declares schedules on a
    database without them is refused (VersionUnsupported): they would never fire."""
    speaks = schedules.speaks_schedules(conn)
    if not app.schedules:
        return speaks
    if not speaks:
        raise VersionUnsupported(
            "X_VERSION_UNSUPPORTED: the app declares schedules "
            f"({', '.join(sorted(app.schedules))}), and this database has none (x_jobs 0.4.2)",
            hint="Update the database (ALTER EXTENSION x_jobs UPDATE, or x-jobs install where it "
            "was installed that way), or start the worker from a build without the schedules.",
        )
    synced = schedules.sync_schedules(conn, app, declared_by=worker)
    logger.info(
        "schedules declared",
        extra={"worker": worker, "schedules": [s.name for s in synced.schedules]},
    )
    return True


def until_next_minute(now: float) -> float:
    """Seconds from ``now`` (seconds into a minute, or an epoch) to the next whole minute: a
    full minute from one that is whole already."""
    return 60.0 - now % 60.0


class Ticker:
    """Ticks schedules for a worker (see the module's doc) while ``running()`` holds."""

    def __init__(
        self,
        dsn: str,
        *,
        worker: str,
        patience: float,
        running: Callable[[], bool],
        max_rows: int = schedules.TICK_MAX_ROWS,
    ) -> None:
        self.dsn = dsn
        self.worker = worker
        self.patience = patience
        self.max_rows = max_rows
        self._running = running
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None
        self._in_call = False
        #: The ticks the database answered, and the last one's answer (for logs and tests).
        self.ticks = 0
        self.last: schedules.Ticked | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="x_jobs-tick", daemon=True)
        self._thread.start()

    def stop(self, wait: float = 2.0) -> None:
        """End the thread: a tick in progress is cancelled (it rolls back whole, so nothing is
        fired twice or lost: the next ticker fires it), and the connection closed."""
        self._stop.set()
        conn = self._conn
        if conn is not None and self._in_call:
            with contextlib.suppress(psycopg.Error):  # it ends on its own: a cancel only hurries
                conn.cancel_safe(timeout=wait)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(wait)

    def _run(self) -> None:
        failing = False
        try:
            while not self._stop.is_set() and self._running():
                wait, failed = self._tick(failing)
                failing = failed
                self._stop.wait(wait + random.uniform(*JITTER))
        except Exception:
            # A bug here must not go unseen, nor stop the worker's jobs.
            logger.exception("the schedule ticker stopped", extra={"worker": self.worker})
        finally:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def _tick(self, failing: bool) -> tuple[float, bool]:
        """One tick (calls while they come back full); answers how long to wait for the next
        whole minute, and whether it failed."""
        sent = time.monotonic()
        try:
            if self._conn is None:
                self._conn = connect(self.dsn, "x_jobs ticker", patience=self.patience)
            self._in_call = True
            try:
                ticked = schedules.tick(self._conn, self.max_rows)
            finally:
                self._in_call = False
        except (psycopg.Error, XJobsError) as err:
            if self._stop.is_set():
                return 0.0, failing
            # Once per streak of failures, not every minute.
            (logger.debug if failing else logger.warning)(
                "could not tick schedules; trying again at the next minute",
                extra={"worker": self.worker, "error": described(err)},
            )
            if self._conn is not None and (self._conn.broken or isinstance(err, psycopg.Error)):
                self._conn.close()
                self._conn = None
            return until_next_minute(time.time()), True
        self.ticks += 1
        self.last = ticked
        if failing:
            logger.info("schedules ticked again", extra={"worker": self.worker})
        if ticked.enqueued or ticked.skipped:
            logger.info(
                "schedules fired",
                extra={
                    "worker": self.worker,
                    "schedules": ticked.schedules,
                    "enqueued": ticked.enqueued,
                    "skipped": ticked.skipped,
                },
            )
        into_minute = ticked.now.second + ticked.now.microsecond / 1e6
        return max(0.0, until_next_minute(into_minute) - (time.monotonic() - sent)), False
