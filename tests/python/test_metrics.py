"""Metrics as Prometheus reads them: the exposition of workers and relays parsed by
prometheus_client's parser and linted by ``promtool check metrics``, the queue gauges against what
the database holds, how often the database counts for many workers, where the metrics listen
(``--metrics-host``), and the PromQL of docs/operations.md evaluated by a real Prometheus server
(Debian's ``prometheus``, which scripts/ensure-deps installs) scraping two workers and a relay."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import (
    DEADLINE_SECONDS,
    Conn,
    Connect,
    exposition,
    free_port,
    scrape,
    scrape_families,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from test_cli import _ends_with_one_line_and_hint, _start
from test_readme import page_blocks

import x_jobs
from x_jobs.metrics import MetricsPortUnavailable
from x_jobs.outbox import DeliveryError, OutboxMessage
from x_jobs.relay import Relay

#: The labels Prometheus gives every series of a target: none of ours may be named so.
TARGET_LABELS = {"job", "instance"}

Loop = x_jobs.Worker | Relay


@contextmanager
def running(*loops: Loop) -> Iterator[None]:
    """Workers and relays running on threads of this process until the block ends."""
    threads = [
        threading.Thread(target=loop.run, kwargs={"install_signals": False}) for loop in loops
    ]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for loop in loops:
            loop.stop()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in threads)


def label_names(text: str) -> set[str]:
    """Every label name of an exposition's samples."""
    return {n for f in text_string_to_metric_families(text) for s in f.samples for n in s.labels}


def promtool_check(text: str) -> None:
    """``promtool check metrics``: the exposition parses, and passes Prometheus' own lint."""
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def gauges(port: int) -> dict[str, dict[str, float]]:
    """The queue gauges of a metrics page, per queue: each state's count, paused, demand."""
    found: dict[str, dict[str, float]] = {}
    for family in scrape_families(port):
        for s in family.samples:
            if s.name == "x_jobs_queue_jobs":
                found.setdefault(s.labels["queue"], {})[s.labels["state"]] = s.value
            elif s.name in ("x_jobs_queue_paused", "x_jobs_queue_demand"):
                key = s.name.removeprefix("x_jobs_queue_")
                found.setdefault(s.labels["queue"], {})[key] = s.value
    return found


def stats_of(conn: Conn, own: Sequence[str] = ()) -> dict[str, dict[str, float]]:
    """What the database holds, as the gauges show it: x_jobs.queue_stats(), with the queues a
    worker serves at 0 when it lists them not."""
    rows = conn.execute(
        "SELECT queue, ready, delayed, suspended, running, paused, demand FROM x_jobs.queue_stats()"
    ).fetchall()
    held = {
        queue: {
            "ready": float(ready),
            "delayed": float(delayed),
            "suspended": float(suspended),
            "running": float(running),
            "paused": 1.0 if paused else 0.0,
            "demand": float(demand),
        }
        for queue, ready, delayed, suspended, running, paused, demand in rows
    }
    zero = dict.fromkeys(("ready", "delayed", "suspended", "running", "paused", "demand"), 0.0)
    return {**{queue: dict(zero) for queue in own}, **held}


# --- a worker's exposition and its queue gauges ------------------------------------------------


def test_a_workers_gauges_are_what_the_database_holds(dsn: str, conn: Conn) -> None:
    """ready/delayed/running per queue after enqueues and a claim, a paused queue, a served
    queue with no row at 0; labels Prometheus does not take; promtool finds nothing."""
    app = x_jobs.App(dsn)
    started, release = threading.Event(), threading.Event()

    @app.job(name="held", queue="mq")
    def held(input: dict[str, int], ctx: x_jobs.JobContext) -> None:
        started.set()
        release.wait(30)

    held.enqueue_many([{"n": n} for n in range(3)])
    held.enqueue_many([{"n": n} for n in range(2)], delay=3600)
    held.enqueue({"n": 9}, queue="mq-paused")
    conn.execute("SELECT x_jobs.pause_queue('mq-paused')")
    own = ["mq", "mq-idle", "mq-paused"]
    port = free_port()
    # One slot and no prefetch: the claim takes one job, which runs until released.
    worker = x_jobs.Worker(
        app,
        queues=own,
        concurrency=1,
        prefetch=0,
        poll_interval=0.05,
        metrics_port=port,
        gauge_interval=0.2,
    )
    try:
        with running(worker):
            assert started.wait(30)
            expected = {
                "mq": {"ready": 2, "delayed": 2, "suspended": 0, "running": 1, "demand": 3},
                "mq-idle": {"ready": 0, "delayed": 0, "suspended": 0, "running": 0, "demand": 0},
                "mq-paused": {"ready": 1, "delayed": 0, "suspended": 0, "running": 0, "demand": 0},
            }
            held_now = stats_of(conn, own)
            assert {
                q: {k: v for k, v in c.items() if k != "paused"} for q, c in held_now.items()
            } == (expected)
            # The gauges show what the database holds, once a read after the claim came.
            wait_for(lambda: gauges(port) == stats_of(conn, own), "the gauges to match")
            page = gauges(port)
            assert page["mq-paused"]["paused"] == 1.0 and page["mq"]["paused"] == 0.0
            samples = scrape(port)
            assert samples['x_jobs_claimed_total{job_name="held"}'] == 1
            assert samples["x_jobs_held"] == 1
            row = conn.execute(
                "SELECT extract(epoch FROM pg_catalog.now())::float8,"
                " extract(epoch FROM taken_at)::float8 FROM x_jobs.queue_snapshot"
            ).fetchone()
            assert row is not None
            assert 0 < samples["x_jobs_queue_snapshot_timestamp_seconds"] <= row[0]
            text = exposition(port)
            names = label_names(text)
            release.set()
    finally:
        release.set()
        app.close()
    # (le: the histogram's buckets, once a run ended; none has yet.)
    assert {"job_name", "queue", "state"} <= names <= {"job_name", "queue", "state", "le"}, names
    assert not names & TARGET_LABELS
    promtool_check(text)


def test_a_blocked_gauge_read_holds_up_no_claim_and_gives_up_at_its_timeout(
    dsn: str, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """The snapshot locked away (ACCESS EXCLUSIVE, by the test): the gauges' read waits on the
    lock, the worker claims and completes jobs meanwhile, the read is cancelled by its own
    statement timeout (the interval, 1 s here) and tried again, and reads resume once the lock
    is gone. A lost gauges session is reconnected the same way."""
    caplog.set_level(logging.WARNING, logger="x_jobs.metrics")
    app = x_jobs.App(dsn)

    @app.job(name="quick", queue="bq")
    def quick(input: dict[str, int]) -> int:
        return input["n"]

    watcher, locker = connect(), connect(autocommit=False)
    worker = x_jobs.Worker(app, poll_interval=0.05, metrics_port=free_port(), gauge_interval=1)
    assert worker.metrics.gauges is not None
    gauge_reads = worker.metrics.gauges

    def gauges_waiting_on_a_lock() -> bool:
        row = watcher.execute(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity"
            " WHERE application_name = 'x_jobs gauges' AND wait_event_type = 'Lock'"
        ).fetchone()
        return row == (1,)

    def done() -> int:
        row = watcher.execute("SELECT count(*) FROM x_jobs.job WHERE state = 'done'").fetchone()
        return int(row[0]) if row else -1

    try:
        with running(worker):
            wait_for(lambda: gauge_reads.reads >= 1, "a first read")
            locker.execute("LOCK TABLE x_jobs.queue_snapshot IN ACCESS EXCLUSIVE MODE")
            wait_for(gauges_waiting_on_a_lock, "the gauges' read to wait on the lock")
            reads = gauge_reads.reads
            quick.enqueue_many([{"n": n} for n in range(5)])
            wait_for(lambda: done() == 5, "the jobs to be done while the read waits")
            wait_for(
                lambda: any(
                    "canceling statement due to statement timeout" in getattr(r, "error", "")
                    for r in caplog.records
                ),
                "the read to give up at its statement timeout",
            )
            assert gauge_reads.reads == reads
            locker.rollback()
            wait_for(lambda: gauge_reads.reads > reads, "the reads to resume")
            # A gauges session that is lost: the next read reconnects.
            reads = gauge_reads.reads
            watcher.execute(
                "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
                " WHERE application_name = 'x_jobs gauges'"
            )
            wait_for(lambda: gauge_reads.reads >= reads + 2, "the reads to go on")
    finally:
        app.close()


# --- how often the database counts ------------------------------------------------------------


def _function_calls(conn: Conn, dbname: str) -> dict[str, int]:
    """Calls of queue_gauges and queue_stats, as the server counted them (track_functions),
    once the gauges' sessions ended (a session reports its counts by then at the latest)."""
    wait_for(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM pg_catalog.pg_stat_activity"
                " WHERE datname = %s AND application_name = 'x_jobs gauges'",
                [dbname],
            ).fetchone()
            == (0,)
        ),
        "the gauges' sessions to end",
    )
    conn.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
    rows = conn.execute(
        "SELECT funcname::text, calls FROM pg_catalog.pg_stat_user_functions"
        " WHERE schemaname = 'x_jobs' AND funcname IN ('queue_gauges', 'queue_stats')"
    ).fetchall()
    return {str(name): int(calls) for name, calls in rows}


def _fleet(dsn: str, n: int, interval: float) -> tuple[x_jobs.App, list[x_jobs.Worker], list[int]]:
    """``n`` workers of one queue, serving metrics and reading the gauges every ``interval``."""
    app = x_jobs.App(dsn)

    @app.job(name="idle", queue="fleet")
    def idle(input: dict[str, int]) -> None:
        pass

    ports = [free_port() for _ in range(n)]
    workers = [
        x_jobs.Worker(app, poll_interval=0.5, metrics_port=port, gauge_interval=interval)
        for port in ports
    ]
    return app, workers, ports


def _reads(workers: Sequence[x_jobs.Worker]) -> list[int]:
    return [w.metrics.gauges.reads if w.metrics.gauges else 0 for w in workers]


def test_workers_share_one_count_while_the_clock_stands(dsn: str, conn: Conn) -> None:
    """Five workers reading often, on a database whose clock stands still (x_jobs.fake_now
    for every session): the snapshot never ages, so the database counts once, whoever reads."""
    dbname = conn.info.dbname
    db = sql.Identifier(dbname)
    conn.execute(sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(db))
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET x_jobs.fake_now = '2030-01-01 00:00:00+00'").format(db)
    )
    app, workers, ports = _fleet(dsn, 5, 0.05)
    try:
        with running(*workers):
            wait_for(lambda: min(_reads(workers)) >= 5, "every worker to read 5 times")
            values = [gauges(port) for port in ports]
    finally:
        app.close()
    calls = _function_calls(conn, dbname)
    assert calls["queue_gauges"] >= 25, calls
    assert calls["queue_stats"] == 1, calls
    # Every worker shows the same snapshot.
    assert all(v == values[0] for v in values), values


def test_workers_count_once_per_interval(dsn: str, conn: Conn) -> None:
    """Four workers reading every 0.25 s on the real clock: the database counts at most once
    per interval (max_age), not once per read. A count needs the last one to be max_age old, so
    over a run of T seconds there are at most T / 0.25 + 1; the run goes on until the workers
    read three times as often as that (a count per read would break the bound)."""
    interval = 0.25
    dbname = conn.info.dbname
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET track_functions = 'all'").format(sql.Identifier(dbname))
    )
    app, workers, _ports = _fleet(dsn, 4, interval)
    began = _clock()
    try:
        with running(*workers):
            wait_for(
                lambda: sum(_reads(workers)) >= 3 * ((_clock() - began) / interval + 2),
                "the workers to read three times as often as the database may count",
            )
            for w in workers:
                assert w.metrics.gauges is not None
                w.metrics.gauges.stop()
            calls = _function_calls(conn, dbname)
            ran = _clock() - began
    finally:
        app.close()
    bound = ran / interval + 2
    assert calls["queue_stats"] <= bound, (calls, ran)
    assert calls["queue_gauges"] >= 2 * bound, (calls, ran)


def _clock() -> float:
    # The wall clock, as the database's now() is one: a monotonic clock could drift from it.
    return datetime.now(UTC).timestamp()


def test_a_count_in_progress_leaves_the_other_callers_to_the_stored_snapshot(
    connect: Connect,
) -> None:
    """One session counts (its transaction open, holding the lock); another that finds the
    snapshot stale is answered the stored one at once, not a second count, and not after a
    wait."""
    first, second = connect(), connect()
    first.execute("SELECT x_jobs.enqueue('n', queue => 'lock-q')")
    (stored,) = first.execute("SELECT max(taken_at) FROM x_jobs.queue_gauges('0')").fetchone() or (
        None,
    )
    first.execute("SELECT x_jobs.enqueue('n', queue => 'lock-q')")
    with first.transaction():
        rows = first.execute(
            "SELECT ready, taken_at FROM x_jobs.queue_gauges('0') WHERE queue = 'lock-q'"
        ).fetchall()
        assert rows[0][0] == 2 and rows[0][1] > stored
        # The second caller would count (max_age 0): the lock is taken, so it is answered the
        # stored snapshot. A statement timeout makes a wait fail instead of hang.
        second.execute("SET statement_timeout = '5s'")
        answered = second.execute(
            "SELECT ready, taken_at FROM x_jobs.queue_gauges('0') WHERE queue = 'lock-q'"
        ).fetchall()
        assert answered == [(1, stored)]
    # Committed: the next caller reads the new count without counting.
    later = second.execute(
        "SELECT ready, taken_at FROM x_jobs.queue_gauges('1 day') WHERE queue = 'lock-q'"
    ).fetchall()
    assert later == [(2, rows[0][1])]


def test_a_repeatable_read_caller_is_answered_after_another_stored_a_snapshot(
    connect: Connect,
) -> None:
    """A caller in REPEATABLE READ (a monitoring tool's) whose snapshot predates another
    caller's store may count once more than needed, as queue_gauges says, but is answered:
    its store must not fail on the row the other one updated (40001)."""
    first, second = connect(), connect()
    first.execute("SELECT x_jobs.enqueue('n', queue => 'rr-q')")
    first.execute("SELECT count(*) FROM x_jobs.queue_gauges('0')")  # a stored snapshot
    with first.transaction():
        first.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        first.execute("SELECT 1")  # its snapshot, taken now
        second.execute("SELECT count(*) FROM x_jobs.queue_gauges('0')")  # stores a new one
        rows = first.execute(
            "SELECT ready FROM x_jobs.queue_gauges('0') WHERE queue = 'rr-q'"
        ).fetchall()
    assert rows == [(1,)]


def test_queue_gauges_refuses_a_bad_max_age(conn: Conn) -> None:
    with pytest.raises(x_jobs.errors.MaxAgeInvalid, match="X_MAX_AGE_INVALID: max_age -00:00:01"):
        try:
            conn.execute("SELECT * FROM x_jobs.queue_gauges(max_age => '-1 second')")
        except psycopg.Error as err:
            raise x_jobs.errors.translate(err) from err


# --- the relay ----------------------------------------------------------------------------------


def _relay_app(dsn: str, gate: threading.Event, begun: threading.Event) -> x_jobs.App:
    """Sinks by topic: ``ok`` delivers, ``bad`` fails for good (dead), ``flaky`` fails its
    first attempt (retried at once) and then delivers, ``slow`` waits for ``gate``."""
    app = x_jobs.App(dsn)
    app.outbox.sink("ok")(lambda message: None)

    def bad(message: OutboxMessage) -> None:
        raise DeliveryError("refused for good", retryable=False)

    def flaky(message: OutboxMessage) -> None:
        if message.attempt == 1:
            raise DeliveryError("try again", retry_at=datetime.now(UTC))

    def slow(message: OutboxMessage) -> None:
        begun.set()
        gate.wait(30)

    app.outbox.sink("bad")(bad)
    app.outbox.sink("flaky")(flaky)
    app.outbox.sink("slow")(slow)
    return app


def test_the_relays_metrics_after_deliveries(dsn: str, conn: Conn) -> None:
    gate, begun = threading.Event(), threading.Event()
    app = _relay_app(dsn, gate, begun)
    port = free_port()
    relay = Relay(app, lease=5, poll_interval=0.05, metrics_port=port)
    for topic, n in (("ok", 3), ("bad", 1), ("flaky", 1)):
        for k in range(n):
            app.outbox.put(topic, {"k": k})
    try:
        with running(relay):
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FILTER (WHERE state IN ('delivered', 'dead'))"
                        " FROM x_jobs.outbox"
                    ).fetchone()
                    == (5,)
                ),
                "the five messages to be settled",
            )
            wait_for(lambda: relay._in_flight == 0, "the relay to settle them")
            settled = scrape(port)
            app.outbox.put("slow", {"k": 0})
            assert begun.wait(30)
            wait_for(lambda: scrape(port)["x_jobs_relay_in_flight"] == 1, "one in flight")
            text = exposition(port)
            gate.set()
            wait_for(lambda: scrape(port)["x_jobs_relay_in_flight"] == 0, "none in flight")
    finally:
        gate.set()
        app.close()
    states: dict[str, str] = dict(
        conn.execute(
            "SELECT topic, state::text FROM x_jobs.outbox WHERE topic <> 'slow'"
        ).fetchall()
    )
    assert states == {"ok": "delivered", "bad": "dead", "flaky": "delivered"}
    # (Every topic with a sink shows its series from the start, at 0 until something happens.)
    counted = {
        key: value
        for key, value in settled.items()
        if value
        and key.startswith(
            (
                "x_jobs_relay_claimed_total",
                "x_jobs_relay_settled_total",
                "x_jobs_relay_delivery_seconds_count",
            )
        )
    }
    assert settled['x_jobs_relay_settled_total{outcome="dead",topic="ok"}'] == 0
    assert counted == {
        'x_jobs_relay_claimed_total{topic="ok"}': 3,
        'x_jobs_relay_claimed_total{topic="bad"}': 1,
        'x_jobs_relay_claimed_total{topic="flaky"}': 2,
        'x_jobs_relay_settled_total{outcome="delivered",topic="ok"}': 3,
        'x_jobs_relay_settled_total{outcome="dead",topic="bad"}': 1,
        'x_jobs_relay_settled_total{outcome="retried",topic="flaky"}': 1,
        'x_jobs_relay_settled_total{outcome="delivered",topic="flaky"}': 1,
        'x_jobs_relay_delivery_seconds_count{topic="ok"}': 3,
        'x_jobs_relay_delivery_seconds_count{topic="bad"}': 1,
        'x_jobs_relay_delivery_seconds_count{topic="flaky"}': 2,
    }, counted
    assert settled["x_jobs_relay_in_flight"] == 0
    names = label_names(text)
    assert names == {"topic", "outcome", "le"}, names
    promtool_check(text)


# --- where the metrics listen --------------------------------------------------------------------


def _answers(host: str, port: int) -> bool:
    """Whether something accepts a TCP connection at host:port."""
    try:
        with socket.create_connection((host, port), timeout=5):
            return True
    except ConnectionRefusedError:
        return False


def test_metrics_host_chooses_the_address_the_metrics_listen_on(dsn: str) -> None:
    """127.0.0.1 answers on loopback and nowhere else (127.0.0.2 is this machine too, but not
    that address); the default listens on every interface. The worker and the relay alike."""
    app = x_jobs.App(dsn)

    @app.job(name="noop", queue="hq")
    def noop(input: dict[str, int]) -> None:
        pass

    app.outbox.sink("ok")(lambda message: None)
    local, everywhere = free_port(), free_port()
    # The metrics server starts with the worker's (the relay's) construction.
    worker = x_jobs.Worker(app, metrics_port=local, metrics_host="127.0.0.1")
    relay = Relay(app, metrics_port=everywhere)
    try:
        # A declared job's series show from the start, at 0: rate() sees the first increase.
        samples = scrape(local)
        assert samples['x_jobs_claimed_total{job_name="noop"}'] == 0
        assert samples['x_jobs_settled_total{job_name="noop",state="dead"}'] == 0
        assert samples['x_jobs_run_seconds_count{job_name="noop"}'] == 0
        assert _answers("127.0.0.1", local)
        assert not _answers("127.0.0.2", local)
        assert _answers("127.0.0.2", everywhere)
        assert "x_jobs_relay_in_flight" in {
            f.name for f in scrape_families(everywhere, "127.0.0.2")
        }
        relay_local = free_port()
        other = Relay(app, metrics_port=relay_local, metrics_host="127.0.0.1")
        try:
            assert _answers("127.0.0.1", relay_local)
            assert not _answers("127.0.0.2", relay_local)
        finally:
            other.metrics.close()
    finally:
        worker.metrics.close()
        relay.metrics.close()
        app.close()


def test_a_host_that_is_no_address_here_is_refused_with_its_name_and_port(dsn: str) -> None:
    app = x_jobs.App(dsn)
    app.outbox.sink("ok")(lambda message: None)
    port = free_port()
    try:
        with pytest.raises(MetricsPortUnavailable) as refused:
            Relay(app, metrics_port=port, metrics_host="192.0.2.1")
    finally:
        app.close()
    assert refused.value.message.startswith(
        f"X_METRICS_PORT_UNAVAILABLE: cannot serve metrics on port {port} of 192.0.2.1: "
    ), refused.value.message
    assert refused.value.hint is not None and f"192.0.2.1 port {port}" in refused.value.hint


@pytest.mark.parametrize(
    ("command", "app", "by_env"),
    [
        ("worker", "apps.basic:app", False),
        ("relay", "apps.relays:app", False),
        ("relay", "apps.relays:app", True),
    ],
)
def test_the_commands_refuse_a_host_they_cannot_bind_in_one_line(
    dsn: str, monkeypatch: pytest.MonkeyPatch, command: str, app: str, by_env: bool
) -> None:
    """--metrics-host (or X_JOBS_METRICS_HOST) that is no address of this machine: exit 2,
    X_METRICS_PORT_UNAVAILABLE naming the host and the port, as for a busy port."""
    port = free_port()
    args = ["--metrics-port", str(port), "--dsn", dsn]
    if by_env:
        monkeypatch.setenv("X_JOBS_METRICS_HOST", "192.0.2.1")
    else:
        args += ["--metrics-host", "192.0.2.1"]
    line, hint = _ends_with_one_line_and_hint(_start(command, app, *args))
    assert line.startswith(
        f"x-jobs: X_METRICS_PORT_UNAVAILABLE: cannot serve metrics on port {port} of 192.0.2.1"
    ), line
    assert f"192.0.2.1 port {port}" in hint and "--metrics-host" in hint, hint


# --- the queries of docs/operations.md through a real Prometheus -------------------------------


class Prometheus:
    """A Prometheus server of the test's own (Debian's ``prometheus``), on a free port of
    127.0.0.1, scraping ``targets`` every second; run as its ``prometheus`` user when the tests
    run as root."""

    def __init__(self, targets: Sequence[int]) -> None:
        self.home = Path(tempfile.mkdtemp(prefix="xjobs-prom-", dir="/tmp"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        listed = ", ".join(f"'127.0.0.1:{port}'" for port in targets)
        (self.home / "prometheus.yml").write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: x_jobs\n"
            "    static_configs:\n"
            f"      - targets: [{listed}]\n"
        )
        (self.home / "data").mkdir()
        self.log = self.home / "prometheus.log"
        as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            for path in (self.home, self.home / "data"):
                shutil.chown(path, "prometheus", "prometheus")
            as_user = {"user": "prometheus", "group": "prometheus", "extra_groups": []}
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [
                    shutil.which("prometheus") or "/usr/bin/prometheus",
                    f"--config.file={self.home / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.home / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                cwd=self.home,
                stdout=log,
                stderr=subprocess.STDOUT,
                **as_user,
            )

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as page:
            return json.load(page)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"prometheus exited {self.proc.returncode}: {self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as page:
                return bool(page.status == 200)
        except OSError:
            return False

    def query(self, promql: str) -> dict[frozenset[tuple[str, str]], float]:
        """An instant query's vector: each series' labels and its value."""
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        assert answer["data"]["resultType"] == "vector", answer
        return {
            frozenset(series["metric"].items()): float(series["value"][1])
            for series in answer["data"]["result"]
        }

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        shutil.rmtree(self.home, ignore_errors=True)


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def _one_per(answer: dict[frozenset[tuple[str, str]], float], *keys: str) -> dict[str, float]:
    """A vector whose series are labelled by ``keys`` alone, by their values joined by /."""
    out: dict[str, float] = {}
    for labels, value in answer.items():
        named = dict(labels)
        assert set(named) == set(keys), named
        out["/".join(named[key] for key in keys)] = value
    return out


def test_the_docs_queries_answer_through_prometheus(dsn: str, conn: Conn) -> None:
    """Two workers and a relay, scraped by a real Prometheus; every PromQL line of
    docs/operations.md is evaluated through its HTTP API and its answer checked against what was
    done."""
    app = x_jobs.App(dsn)

    @app.job(name="ping", queue="pq")
    def ping(input: dict[str, int]) -> int:
        return input["n"]

    own = ["pq", "pq-later", "pq-paused"]
    ping.enqueue_many([{"n": n} for n in range(2)], queue="pq-later", delay=3600)
    ping.enqueue({"n": 0}, queue="pq-paused")
    conn.execute("SELECT x_jobs.pause_queue('pq-paused')")
    ping.enqueue_many([{"n": n} for n in range(3)], queue="pq-other")  # served by no worker
    gate, begun = threading.Event(), threading.Event()
    relay_app = _relay_app(dsn, gate, begun)
    ports = [free_port() for _ in range(3)]
    workers = [
        x_jobs.Worker(app, queues=own, poll_interval=0.05, metrics_port=port, gauge_interval=0.5)
        for port in ports[:2]
    ]
    relay = Relay(relay_app, lease=5, poll_interval=0.05, metrics_port=ports[2])
    prometheus = Prometheus(ports)

    def done() -> int:
        row = conn.execute("SELECT count(*) FROM x_jobs.job WHERE state = 'done'").fetchone()
        return int(row[0]) if row else -1

    def outbox_settled() -> int:
        row = conn.execute(
            "SELECT count(*) FROM x_jobs.outbox WHERE state IN ('delivered', 'dead')"
        ).fetchone()
        return int(row[0]) if row else -1

    def seen(promql: str, expected: dict[str, float], *keys: str) -> Callable[[], bool]:
        return lambda: _one_per(prometheus.query(promql), *keys) == expected

    settled = "sum by (job_name, state) (x_jobs_settled_total)"
    relayed = "sum by (topic, outcome) (x_jobs_relay_settled_total)"

    def one_round(n: int) -> None:
        """Ten jobs and three messages (and, first, a dead one and a retried one), done and
        scraped: the counters rise between samples, which is what rate() and the quantiles
        need."""
        ping.enqueue_many([{"n": k} for k in range(10)])
        for topic in ["ok", "ok", "ok"] + (["bad", "flaky"] if n == 0 else []):
            relay_app.outbox.put(topic, {"round": n})
        wait_for(lambda: done() == 10 * (n + 1), "the round's jobs to be done")
        wait_for(lambda: outbox_settled() == 5 + 3 * n, "the round's messages to be settled")
        wait_for(
            seen(settled, {**ZERO_STATES, "ping/done": 10.0 * (n + 1)}, "job_name", "state"),
            "prometheus to see the round's jobs",
        )
        wait_for(
            lambda: (
                _one_per(prometheus.query(relayed), "topic", "outcome").get("ok/delivered")
                == 3.0 * (n + 1)
            ),
            "prometheus to see the round's messages",
        )

    try:
        with running(*workers, relay):
            wait_for(prometheus.ready, "prometheus to be ready")
            wait_for(
                lambda: (
                    _one_per(prometheus.query("sum by (job, instance) (up)"), "job", "instance")
                    == {f"x_jobs/127.0.0.1:{port}": 1.0 for port in ports}
                ),
                "prometheus to scrape the two workers and the relay",
            )
            for round_ in range(2):
                one_round(round_)
            depth = {
                f"{queue}/{state}": value
                for queue, values in stats_of(conn, own).items()
                for state, value in values.items()
                if state in ("ready", "delayed", "suspended", "running")
            }
            wait_for(
                seen("max by (queue, state) (x_jobs_queue_jobs)", depth, "queue", "state"),
                "prometheus to see the queue gauges as the database counts",
            )
            checks = readme_checks(depth)
            queries = readme_queries()
            assert set(queries) == set(checks), "the docs' queries and this test's checks differ"
            for promql in queries:
                _answers_as_checked(prometheus, promql, checks[promql])
            # The raw series: Prometheus' own job label, ours beside it, no exported_job.
            raw = prometheus.query("x_jobs_settled_total")
            doubled = _one_per(
                prometheus.query("sum by (queue, state) (x_jobs_queue_jobs)"), "queue", "state"
            )
    finally:
        prometheus.close()
        gate.set()
        app.close()
        relay_app.close()

    assert raw and all(
        dict(labels)["job"] == "x_jobs"
        and dict(labels)["job_name"] == "ping"
        and "exported_job" not in dict(labels)
        for labels in raw
    ), raw
    # Every worker shows the same gauges: a sum counts them once per worker.
    assert doubled == {key: 2 * value for key, value in depth.items()}


Answer = dict[frozenset[tuple[str, str]], float]

#: The settled states a declared job shows at 0 before any of its jobs ends so.
ZERO_STATES = {"ping/dead": 0.0, "ping/failed": 0.0}


def readme_checks(depth: dict[str, float]) -> dict[str, Callable[[Answer], None]]:
    """What each query of docs/operations.md must answer after the two rounds of
    test_the_readme_queries_answer_through_prometheus; ``depth``: the live jobs by queue/state
    as the database counts them."""

    def only(answer: Answer, key: str, *labels: str) -> dict[str, float]:
        return {k: v for k, v in _one_per(answer, *labels).items() if k == key}

    return {
        'sum by (job_name) (rate(x_jobs_settled_total{state="done"}[5m]))': lambda a: _positive(
            _one_per(a, "job_name"), {"ping"}
        ),
        "sum by (job_name, state) (x_jobs_settled_total)": lambda a: _equal(
            _one_per(a, "job_name", "state"), {**ZERO_STATES, "ping/done": 20.0}
        ),
        "histogram_quantile(0.95, sum by (job_name, le) (rate(x_jobs_run_seconds_bucket[5m])))": (
            lambda a: _finite(_one_per(a, "job_name"), {"ping"})
        ),
        "sum(x_jobs_held)": lambda a: _equal(a, {_labels(): 0.0}),
        "max by (queue, state) (x_jobs_queue_jobs)": lambda a: _equal(
            _one_per(a, "queue", "state"), depth
        ),
        "max by (queue) (x_jobs_queue_demand)": lambda a: _equal(
            _one_per(a, "queue"), {"pq": 0.0, "pq-later": 0.0, "pq-paused": 0.0, "pq-other": 3.0}
        ),
        "max by (queue) (x_jobs_queue_paused) == 1": lambda a: _equal(
            _one_per(a, "queue"), {"pq-paused": 1.0}
        ),
        "time() - max(x_jobs_queue_snapshot_timestamp_seconds)": _age,
        # Only ok rose in the second round: the other outcomes' rates may be 0.
        "sum by (topic, outcome) (rate(x_jobs_relay_settled_total[5m]))": lambda a: _positive(
            only(a, "ok/delivered", "topic", "outcome"), {"ok/delivered"}
        ),
        "sum by (topic, outcome) (x_jobs_relay_settled_total)": lambda a: _equal(
            {k: v for k, v in _one_per(a, "topic", "outcome").items() if v},
            {"ok/delivered": 6.0, "bad/dead": 1.0, "flaky/retried": 1.0, "flaky/delivered": 1.0},
        ),
        "histogram_quantile(0.99, sum by (topic, le)"
        " (rate(x_jobs_relay_delivery_seconds_bucket[5m])))": lambda a: _finite(
            only(a, "ok", "topic"), {"ok"}
        ),
        "sum(x_jobs_relay_in_flight)": lambda a: _equal(a, {_labels(): 0.0}),
    }


def _answers_as_checked(
    prometheus: Prometheus,
    promql: str,
    check: Callable[[Answer], None],
) -> None:
    """Evaluate ``promql`` until its answer passes ``check`` (a scrape may still be on its
    way); fail with the last answer."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        answer = prometheus.query(promql)
        try:
            check(answer)
            return
        except AssertionError as err:
            if time.monotonic() > deadline:
                raise AssertionError(f"{promql}: {answer}") from err
        time.sleep(0.2)


def readme_queries() -> list[str]:
    """The PromQL of docs/operations.md: every line of its ```promql blocks but the comments."""
    return [
        line.strip()
        for block in page_blocks("docs/operations.md", "promql")
        for line in block.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def _equal(got: Any, expected: Any) -> None:
    assert got == expected, got


def _positive(got: dict[str, float], keys: set[str]) -> None:
    assert set(got) == keys and all(value > 0 for value in got.values()), got


def _finite(got: dict[str, float], keys: set[str]) -> None:
    assert set(got) == keys and all(math.isfinite(v) and v >= 0 for v in got.values()), got


def _age(answer: dict[frozenset[tuple[str, str]], float]) -> None:
    assert set(answer) == {_labels()}, answer
    (age,) = answer.values()
    assert math.isfinite(age) and age >= 0, age
