"""Fixtures for the x_jobs tests: real PostgreSQL databases, a fresh one per test.

The server is the one scripts/throwaway-pg (or ``make test``) starts: the tests read PGHOST,
PGPORT, PGUSER and PGDATABASE from the environment, as libpq does. A session template database
gets ``CREATE EXTENSION x_jobs`` once; every test then runs in a copy of it
(``CREATE DATABASE ... TEMPLATE ...``), dropped afterwards, so tests never see each other's rows.

Helpers the test modules share live here too (``from conftest import ...``).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeAlias

import psycopg
import pytest
from netcut import Proxy
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg.conninfo import make_conninfo

import x_jobs

logger = logging.getLogger(__name__)

#: A connection whose rows are plain tuples (psycopg's default row factory).
Conn: TypeAlias = psycopg.Connection[tuple[Any, ...]]

#: How long a test waits for something that should happen within milliseconds.
DEADLINE_SECONDS = 30.0

_NO_SERVER = (
    "PGHOST is not set: the x_jobs tests need a real PostgreSQL server with the extension staged "
    "from this checkout. Run them through the throwaway server:\n"
    "    scripts/throwaway-pg -- .venv/bin/pytest -q tests/python\n"
    "or `make test`."
)


class Connect(Protocol):
    """Opens one more connection to the test's database; the fixture closes it afterwards."""

    def __call__(self, *, autocommit: bool = True, name: str = "x_jobs_test") -> Conn: ...


def wait_for(condition: Callable[[], bool], what: str, timeout: float = DEADLINE_SECONDS) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` once ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.01)


def wait_for_lock_waiters(observer: Conn, pids: Sequence[int]) -> None:
    """Wait until every backend in ``pids`` is blocked on a lock (pg_stat_activity says so)."""

    def all_blocked() -> bool:
        row = observer.execute(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity"
            " WHERE pid = ANY (%s) AND wait_event_type = 'Lock'",
            [list(pids)],
        ).fetchone()
        assert row is not None
        return int(row[0]) == len(pids)

    wait_for(all_blocked, f"{len(pids)} backends to wait on a lock")


def free_port() -> int:
    """A TCP port free on this machine now, for a worker's --metrics-port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def exposition(port: int, host: str = "127.0.0.1") -> str:
    """The text of a worker's or a relay's metrics page."""
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as page:
        return str(page.read().decode())


def scrape_families(port: int, host: str = "127.0.0.1") -> list[Metric]:
    """A metrics page as prometheus_client's parser reads it (as Prometheus would)."""
    return list(text_string_to_metric_families(exposition(port, host)))


def scrape(port: int) -> dict[str, float]:
    """The samples of a metrics page, parsed by prometheus_client, keyed by their name and
    labels as printed (``name{label="value",...}``, labels in the page's order)."""
    samples: dict[str, float] = {}
    for family in scrape_families(port):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sample.labels.items())
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def _drop_database(admin: Conn, name: str) -> None:
    admin.execute(
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
        " WHERE datname = %s AND pid <> pg_catalog.pg_backend_pid()",
        [name],
    )
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def fresh_database(admin: Conn, template: str, prefix: str = "x_jobs_test") -> Iterator[str]:
    """A new database cloned from ``template``; yields its conninfo and drops it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin.execute(
        sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    )
    try:
        yield make_conninfo("", dbname=name)
    finally:
        _drop_database(admin, name)


#: For the tests that stop or restart the server: scripts/throwaway-pg (so `make test`) always
#: provides X_JOBS_PG_CTL; only a run against a server of one's own lacks it.
needs_pg_ctl = pytest.mark.skipif(
    "X_JOBS_PG_CTL" not in os.environ, reason="needs scripts/throwaway-pg"
)


def pg_ctl(*args: str) -> subprocess.CompletedProcess[str]:
    """Run pg_ctl on the test server as its owner (X_JOBS_PG_CTL)."""
    command = [*shlex.split(os.environ["X_JOBS_PG_CTL"]), *args]
    return subprocess.run(command, cwd="/", capture_output=True, text=True, check=False)


def _reconnect(admin: Conn) -> None:
    """The session's admin connection, reconnected in place after a restart: the fixtures still
    need it to drop this test's database and to make the next tests'."""
    admin.pgconn.reset()
    # psycopg forgets the statements it prepared before. Not prepared itself: run five times
    # (five restarts in a session) it would be, and its prepared name would die with the reset.
    admin.execute("DISCARD ALL", prepare=False)


def restart_server(admin: Conn, *mode: str) -> None:
    """pg_ctl restart (``"-m", "fast"`` or another mode, else pg_ctl's default)."""
    done = pg_ctl("restart", *mode)
    assert done.returncode == 0, done.stdout + done.stderr
    _reconnect(admin)


def crash_backend(admin: Conn, victim: Conn) -> None:
    """kill -9 the server process of ``victim``: the postmaster ends every session, recovers
    from the WAL and takes connections again, without starting anew (its start time stays)."""
    pid = victim.info.backend_pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE_SECONDS
    # Until the postmaster has reaped it, it has not begun to end the other sessions: a probe
    # let in before then, and the admin's reset after it, would be ended in their turn.
    while os.path.exists(f"/proc/{pid}"):
        if time.monotonic() > deadline:
            pytest.fail(f"the server process {pid} outlived its SIGKILL")
        time.sleep(0.01)
    while True:
        try:
            with psycopg.connect(autocommit=True) as probe:
                probe.execute("SELECT 1")
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    _reconnect(admin)


@contextmanager
def server_stopped(admin: Conn) -> Iterator[None]:
    """The server stopped (fast mode) for the block; started again after it, however it ends."""
    done = pg_ctl("stop", "-m", "fast")
    assert done.returncode == 0, done.stdout + done.stderr
    try:
        yield
    finally:
        done = pg_ctl("start")
        assert done.returncode == 0, done.stdout + done.stderr
        _reconnect(admin)


@contextmanager
def serving(app: x_jobs.App, concurrency: int = 4, **options: Any) -> Iterator[x_jobs.Worker]:
    """A Worker running ``app``'s jobs on a thread of this process until the block ends; the
    app is closed after it. ``options``: more of the Worker's."""
    worker = x_jobs.Worker(app, concurrency=concurrency, poll_interval=0.05, grace=1, **options)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()


def notify_names(conn: Conn, channel: str, names: Sequence[str]) -> Callable[[str], str]:
    """What a notification's payload on ``channel`` stands for: one of ``names`` (its tag, as
    x_jobs.notify_tags answers it), else ``untagged:<payload>``, so that a test comparing names
    fails on a payload that is a bare name."""
    row = conn.execute(
        "SELECT x_jobs.notify_tags(channel => %s, names => %s)", [channel, list(names)]
    ).fetchone()
    assert row is not None
    by_tag = dict(zip(row[0], names, strict=True))
    return lambda payload: by_tag.get(payload, f"untagged:{payload}")


@contextmanager
def connections(dsn: str) -> Iterator[Connect]:
    """A ``Connect`` for ``dsn`` that closes every connection it opened on exit."""
    opened: list[Conn] = []

    def connect(*, autocommit: bool = True, name: str = "x_jobs_test") -> Conn:
        conn = psycopg.connect(dsn, autocommit=autocommit, application_name=name)
        opened.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in opened:
            conn.close()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """The root logger's level as it was before the test, and none of the handlers the test
    added: `x-jobs worker` and `relay` run in this process (test_cli) configure logging with
    basicConfig(force=True), and a level of theirs left at critical hid every warning from the
    tests after them (caplog). pytest's own capturing handlers come and go with each phase."""
    root = logging.getLogger()
    level, before = root.level, set(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in list(root.handlers):
            if handler not in before and not type(handler).__module__.startswith("_pytest"):
                root.removeHandler(handler)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    """A TCP way to the test server that the test can cut without a reset (see netcut)."""
    directory = os.environ.get("PGHOST", "/var/run/postgresql")
    port = os.environ.get("PGPORT", "5432")
    with Proxy(f"{directory}/.s.PGSQL.{port}") as way:
        yield way


@pytest.fixture(scope="session")
def admin() -> Iterator[Conn]:
    """An autocommit superuser connection to the server's maintenance database."""
    if not os.environ.get("PGHOST"):
        # One clear message and a failing exit status, not one error per test.
        pytest.exit(_NO_SERVER, returncode=pytest.ExitCode.USAGE_ERROR)
    with psycopg.connect(autocommit=True, application_name="x_jobs_test_admin") as conn:
        yield conn


@pytest.fixture(scope="session")
def template_db(admin: Conn) -> Iterator[str]:
    """The name of a database holding a fresh ``CREATE EXTENSION x_jobs``, for cloning."""
    name = f"x_jobs_template_{uuid.uuid4().hex[:12]}"
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with psycopg.connect(dbname=name, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION x_jobs")
        yield name
    finally:
        _drop_database(admin, name)


@pytest.fixture
def dsn(admin: Conn, template_db: str) -> Iterator[str]:
    """The conninfo of a database of this test's own, with x_jobs installed."""
    with fresh_database(admin, template_db) as conninfo:
        yield conninfo


@pytest.fixture
def connect(dsn: str) -> Iterator[Connect]:
    """Opens more connections to the test's database (closed after the test)."""
    with connections(dsn) as opener:
        yield opener


@pytest.fixture
def conn(connect: Connect) -> Conn:
    """An autocommit connection to the test's database."""
    return connect()
