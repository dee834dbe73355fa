"""Real worker processes for the tests, and what their handlers recorded.

A :class:`Fleet` belongs to one test and its database: it creates the tables the test apps
record in (``apps.basic.SCHEMA``), starts ``python -m x_jobs worker apps.<module>:app``
processes with ``PGDATABASE`` set to that database, keeps each one's output in a log file, notes
when each process is seen to exit (``worker_exit``), and kills whatever still runs when the test
ends. Its own connection reconnects, so a test can go on reading after a server restart.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, wait_for
from psycopg.conninfo import conninfo_to_dict

from apps.basic import SCHEMA

logger = logging.getLogger(__name__)

#: tests/python: the worker's working directory and PYTHONPATH, so that ``apps.*`` imports.
TESTS_DIR = Path(__file__).resolve().parents[1]

RUNS: LiteralString = """
    SELECT run, job_id, job, attempt, pid, worker, started, finished, outcome
    FROM public.run_log ORDER BY started, run
"""
# Two runs of one job overlap when each starts before the other ends. A run ends when its body
# recorded the end or, if it never did, when its process was seen dead; a run of a live process
# that has not ended yet overlaps everything after its start.
OVERLAPS: LiteralString = """
    SELECT a.job_id, a.attempt, a.pid, b.attempt, b.pid
    FROM public.run_log AS a
    JOIN public.run_log AS b ON b.job_id = a.job_id AND b.run > a.run
    LEFT JOIN public.worker_exit AS ea ON ea.pid = a.pid
    LEFT JOIN public.worker_exit AS eb ON eb.pid = b.pid
    WHERE a.started < coalesce(b.finished, eb.exited, 'infinity')
        AND b.started < coalesce(a.finished, ea.exited, 'infinity')
    ORDER BY a.job_id
"""
EXITED: LiteralString = """
    INSERT INTO public.worker_exit (pid, exited) VALUES (%s, pg_catalog.clock_timestamp())
    ON CONFLICT (pid) DO UPDATE SET exited = excluded.exited
"""


@dataclass(frozen=True)
class RunRow:
    """One row of run_log: one run of a handler."""

    run: uuid.UUID
    job_id: int
    job: str
    attempt: int
    pid: int
    worker: str
    started: datetime
    finished: datetime | None
    outcome: str | None


class WorkerProcess:
    """One ``x-jobs worker`` process of a fleet."""

    def __init__(self, fleet: Fleet, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.fleet = fleet
        self.proc = proc
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        """kill -9, and wait until the process is gone."""
        self.signal(signal.SIGKILL)
        self.wait()

    def wait(self, timeout: float = DEADLINE_SECONDS) -> int:
        """Wait for the process to exit; answer its exit status (negative: killed by a signal)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"worker {self.pid} still runs after {timeout:.0f} s; its log:\n{self.log()}"
            )
        self.fleet.execute(EXITED, [self.pid])
        return code


class Fleet:
    """The worker processes of one test, on the test's database."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn = dsn
        self.dbname = str(conninfo_to_dict(dsn)["dbname"])
        self.logs = logs
        self.workers: list[WorkerProcess] = []
        self._conn: Conn | None = None

    def __enter__(self) -> Fleet:
        self.execute(SCHEMA)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for worker in self.workers:
            if worker.alive():
                os.kill(worker.pid, signal.SIGKILL)
                worker.proc.wait()
        if self._conn is not None:
            self._conn.close()

    # --- processes ----------------------------------------------------------------------------

    def start(
        self,
        *,
        concurrency: int = 4,
        lease: float = 2.0,
        poll: float = 0.2,
        grace: float = 10.0,
        target: str = "apps.basic:app",
        dbname: str | None = None,
        via: str | None = None,
        extra: Sequence[str] = (),
    ) -> WorkerProcess:
        """Start ``python -m x_jobs worker TARGET`` on this test's database (or ``dbname``);
        ``via``: the DSN the worker reaches it by (its handlers record over the usual way)."""
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env["PGDATABASE"] = dbname or self.dbname
        if via is not None:
            env["X_JOBS_TEST_RECORD_DSN"] = self.dsn
            extra = ["--dsn", via, *extra]
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        log = self.logs / f"worker-{len(self.workers) + 1}.log"
        command = [
            sys.executable,
            "-m",
            "x_jobs",
            "worker",
            target,
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
            "--poll",
            str(poll),
            "--grace",
            str(grace),
            *extra,
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, cwd=TESTS_DIR, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        worker = WorkerProcess(self, proc, log)
        self.workers.append(worker)
        return worker

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """conftest's wait_for, failing with the workers' logs (what a test needs to see why)."""
        try:
            wait_for(condition, what)
        except pytest.fail.Exception as err:
            pytest.fail(f"{err}\n{self.report()}")

    def report(self) -> str:
        parts = []
        for worker in self.workers:
            status = "running" if worker.alive() else f"exited {worker.proc.returncode}"
            parts.append(f"--- worker {worker.pid} ({status}):\n{worker.log()[-4000:]}")
        return "\n".join(parts)

    # --- the database -------------------------------------------------------------------------

    def execute(self, query: LiteralString, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on the fleet's own connection; reconnect while the server is away
        (a restart) until the deadline."""
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(
                        self.dsn, autocommit=True, application_name="x_jobs_test_fleet"
                    )
                cur = self._conn.execute(query, params)
                return cur.fetchall() if cur.description is not None else []
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def scalar(self, query: LiteralString, params: Sequence[Any] = ()) -> Any:
        rows = self.execute(query, params)
        assert len(rows) == 1 and len(rows[0]) == 1, rows
        return rows[0][0]

    def runs(self) -> list[RunRow]:
        """Every recorded run, in the order they started."""
        return [RunRow(*row) for row in self.execute(RUNS)]

    def overlaps(self) -> list[tuple[Any, ...]]:
        """(job id, attempt, pid, other attempt, other pid) of every two runs of one job that
        overlapped in time; empty when no job ever ran twice at once."""
        return self.execute(OVERLAPS)

    def open_gate(self, name: str = "gate") -> None:
        self.execute(
            "INSERT INTO public.gate (name, open) VALUES (%s, true)"
            " ON CONFLICT (name) DO UPDATE SET open = true",
            [name],
        )

    def states(self, ids: Sequence[int]) -> dict[int, str]:
        """The state of each job of ``ids``."""
        rows = self.execute(
            "SELECT id, state::text FROM x_jobs.job WHERE id = ANY (%s)", [list(ids)]
        )
        return {int(job_id): str(state) for job_id, state in rows}

    def all_in(self, ids: Sequence[int], *states: str) -> bool:
        found = self.states(ids)
        return len(found) == len(ids) and all(state in states for state in found.values())

    def worker_id(self, worker: WorkerProcess) -> str:
        """The worker id a process claims with, read from the runs it recorded."""
        ids = {run.worker for run in self.runs() if run.pid == worker.pid}
        assert len(ids) == 1, f"worker {worker.pid} recorded runs under ids {ids}"
        return ids.pop()
