"""The client behind Debian's pgbouncer (1.18), in transaction and in session mode: workers drain,
survive a kill -9 of one of them and a server restart, App.enqueue and the CLI work, and a job
enqueued through pgbouncer wakes a worker that listens where notifications can arrive.

Behind pgbouncer in transaction mode the worker used to settle succeeded jobs as dead ("its
output was refused: prepared statement "_pg3_1" does not exist"), then die; App.enqueue failed
with DuplicatePreparedStatement; and, prepared statements off, the NOTIFY wake was lost without
a word (docs/poolers.md).

The workers are real processes (``apps.workers.Fleet``) that reach the database through
pgbouncer, their handlers recording their runs directly; no assertion reads a clock.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from apps import basic, poolers
from apps.workers import Fleet, WorkerProcess
from conftest import Conn, needs_pg_ctl, restart_server, wait_for
from pgbouncer import Bouncer, bouncer_fixture
from typer.testing import CliRunner

import x_jobs
from x_jobs._conn import connect
from x_jobs._listen import listen
from x_jobs.cli import cli
from x_jobs.outbox import OutboxMessage
from x_jobs.relay import Relay

logger = logging.getLogger(__name__)

TARGET = "apps.poolers:app"
#: So long that only a notification can explain a job that starts within a test's deadline.
NO_POLL = 120.0
#: What the listener logs when notifications cannot reach it.
NOT_REACHED = "notifications do not reach the worker's listener"
RELAY_NOT_REACHED = "notifications do not reach the relay's listener"

MODES = ["transaction", "session"]

bouncer_transaction = bouncer_fixture("transaction")
bouncer_session = bouncer_fixture("session")


@pytest.fixture(params=MODES)
def bouncer(request: pytest.FixtureRequest) -> Bouncer:
    """The module's pgbouncer of each mode in turn."""
    found: Bouncer = request.getfixturevalue(f"bouncer_{request.param}")
    return found


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


@pytest.fixture
def client(bouncer: Bouncer, dsn: str) -> Iterator[x_jobs.App]:
    """An App whose pool goes through the test's pgbouncer."""
    app = x_jobs.App(bouncer.dsn(dsn))
    yield app
    app.close()


def _runs_per_job(fleet: Fleet, ids: list[int]) -> dict[int, list[tuple[int, str | None]]]:
    found: dict[int, list[tuple[int, str | None]]] = {job_id: [] for job_id in ids}
    for run in fleet.runs():
        if run.job_id in found:
            found[run.job_id].append((run.attempt, run.outcome))
    return found


def _outputs(conn: Conn, ids: list[int]) -> dict[int, tuple[str, object]]:
    rows = conn.execute(
        "SELECT id, state::text, output FROM x_jobs.job WHERE id = ANY(%s)", [ids]
    ).fetchall()
    return {int(job_id): (str(state), output) for job_id, state, output in rows}


def _listening(fleet: Fleet, application_name: str = "x_jobs listener") -> bool:
    """Whether a listener of this test's database runs its LISTEN on the channel of jobs."""
    return bool(
        fleet.scalar(
            "SELECT count(*) > 0 FROM pg_catalog.pg_stat_activity"
            " WHERE datname = pg_catalog.current_database() AND application_name = %s"
            " AND query = 'LISTEN \"x_jobs\"'",
            [application_name],
        )
    )


# --- the connections --------------------------------------------------------------------------


def test_no_connection_of_the_client_prepares_a_statement(bouncer: Bouncer, dsn: str) -> None:
    """psycopg prepares a statement after its fifth use on a connection, which a pooler in
    transaction mode hands to another server connection: the client's connections, pooled or
    not, direct or through pgbouncer, prepare none."""
    app = x_jobs.App(bouncer.dsn(dsn))
    try:
        with (
            connect(bouncer.dsn(dsn), "x_jobs_test") as through,
            connect(dsn, "x_jobs_test") as direct,
            app.connection() as pooled,
        ):
            for each in (through, direct, pooled):
                assert each.prepare_threshold is None
                for n in range(10):
                    assert each.execute("SELECT %s::int", [n]).fetchone() == (n,)
            prepared = direct.execute("SELECT count(*) FROM pg_catalog.pg_prepared_statements")
            assert prepared.fetchone() == (0,)
    finally:
        app.close()


def test_app_enqueue_and_the_cli_work_through_pgbouncer(
    bouncer: Bouncer, dsn: str, conn: Conn
) -> None:
    """Two apps enqueueing in turn through one pgbouncer, whose server connections hold another
    client's "_pg3_0": with psycopg's prepared statements on, the fifth enqueue of each
    prepared its own (DuplicatePreparedStatement, 42P05), or found it gone (26000)."""
    via = bouncer.dsn(dsn)
    _seed_prepared_statements(via, 4)
    apps = [x_jobs.App(via), x_jobs.App(via)]
    try:
        ids = [apps[n % 2].enqueue(poolers.echo, {"n": n}).id for n in range(40)]
        ids += [e.id for e in apps[0].enqueue_many(poolers.echo, [{"n": n} for n in range(10)])]
    finally:
        for app in apps:
            app.close()
    assert conn.execute("SELECT count(*) FROM x_jobs.job WHERE id = ANY(%s)", [ids]).fetchone() == (
        50,
    )

    # A --run-at without an offset is read in the client's own TimeZone (PGTZ), not in that of
    # whichever server connection pgbouncer hands the command; what it shows is in UTC.
    runner = CliRunner(env={"COLUMNS": None, "PGTZ": "America/New_York"})
    run_at = ["--run-at", "2031-05-01T12:00:00"]
    enqueued = runner.invoke(cli, ["enqueue", "echo", "--input", "{}", *run_at, "--dsn", via])
    assert enqueued.exit_code == 0, enqueued.output
    shown = runner.invoke(cli, ["jobs", "list", "--json", "--dsn", via])
    assert shown.exit_code == 0, shown.output
    stored = conn.execute(
        "SELECT to_char(run_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') FROM x_jobs.job"
        " WHERE queue = 'default' AND run_at > now() + interval '1 year'"
    ).fetchall()
    assert stored == [("2031-05-01 16:00",)]
    assert '"run_at": "2031-05-01T16:00:00+00:00"' in shown.stdout, shown.stdout


# --- workers ------------------------------------------------------------------------------------


def test_a_drain_through_pgbouncer_completes_every_job_once(
    bouncer: Bouncer, fleet: Fleet, client: x_jobs.App, conn: Conn, dsn: str
) -> None:
    ids = [e.id for e in client.enqueue_many(poolers.echo, [{"n": n} for n in range(300)])]
    ids += [client.enqueue(poolers.echo, {"n": n}).id for n in range(300, 320)]
    via = bouncer.dsn(dsn)
    workers = [fleet.start(target=TARGET, via=via, concurrency=8) for _ in range(2)]
    fleet.wait_for(lambda: fleet.all_in(ids, "done", "dead", "failed"), "every job to settle")

    outputs = _outputs(conn, ids)
    assert outputs == {job_id: ("done", {"n": n}) for n, job_id in enumerate(ids)}
    assert _runs_per_job(fleet, ids) == {job_id: [(1, "returned")] for job_id in ids}
    assert all(worker.alive() for worker in workers), fleet.report()
    for worker in workers:
        assert "Traceback" not in worker.log(), worker.log()
        assert "refused" not in worker.log(), worker.log()


def test_a_worker_killed_behind_pgbouncer_leaves_its_jobs_to_another(
    bouncer: Bouncer, fleet: Fleet, client: x_jobs.App, dsn: str
) -> None:
    """kill -9 mid-drain: the jobs it held go to another worker once their leases lapse;
    nothing is lost and no job runs twice at once."""
    gated = [e.id for e in client.enqueue_many(basic.gated, [{}] * 3)]
    sleeping = [e.id for e in client.enqueue_many(basic.sleep, [{"seconds": 0.05}] * 60)]
    ids = gated + sleeping
    via = bouncer.dsn(dsn)
    a = fleet.start(via=via, concurrency=8, lease=2)

    def mid_run(worker: WorkerProcess) -> bool:
        return any(r.pid == worker.pid and r.finished is None for r in fleet.runs())

    fleet.wait_for(lambda: mid_run(a), "the first worker to be in the middle of a job")
    a.kill()
    b = fleet.start(via=via, concurrency=8, lease=2)
    fleet.open_gate()
    fleet.wait_for(lambda: fleet.all_in(ids, "done"), "every job to be done")

    assert fleet.overlaps() == []
    # Each ends with a run that returned; the gated ones the killed worker held ran again.
    runs = _runs_per_job(fleet, ids)
    assert all(mine and mine[-1][1] == "returned" for mine in runs.values()), runs
    again = {r.job_id for r in fleet.runs() if r.pid == b.pid}
    assert again >= {job_id for job_id in gated if runs[job_id][0][1] is None}, runs
    assert "Traceback" not in b.log(), b.log()


@needs_pg_ctl
def test_a_drain_through_pgbouncer_rides_out_a_server_restart(
    bouncer: Bouncer, fleet: Fleet, client: x_jobs.App, admin: Conn, dsn: str
) -> None:
    inputs = [{"n": n, "seconds": 0.05} for n in range(400)]
    ids = [e.id for e in client.enqueue_many(poolers.echo, inputs)]
    client.close()  # its pooled connections would be dead after the restart
    via = bouncer.dsn(dsn)
    workers = [fleet.start(target=TARGET, via=via, concurrency=4) for _ in range(2)]
    fleet.wait_for(
        lambda: (
            {r.pid for r in fleet.runs()} == {w.pid for w in workers}
            and fleet.scalar("SELECT count(*) FROM x_jobs.job WHERE state = 'done'") >= 40
        ),
        "the drain to be under way in both workers",
    )
    restart_server(admin, "-m", "fast")
    fleet.wait_for(lambda: fleet.all_in(ids, "done", "dead", "failed"), "every job to settle")

    states = fleet.states(ids)
    assert set(states.values()) == {"done"}, states
    assert fleet.overlaps() == []
    runs = _runs_per_job(fleet, ids)
    assert all(mine and mine[-1][1] == "returned" for mine in runs.values()), runs
    assert all(worker.alive() for worker in workers), fleet.report()
    # PgBouncer takes a login while it cannot reach the server, and fails its first call: such a
    # connection counts as a failed connect, with backoff (it was retried thousands of times).
    for worker in workers:
        assert worker.log().count("database connection back") < 100, fleet.report()


# --- the wake -----------------------------------------------------------------------------------


def test_a_job_enqueued_through_pgbouncer_wakes_the_worker_at_once(
    bouncer: Bouncer, fleet: Fleet, client: x_jobs.App, dsn: str
) -> None:
    """With a poll of two minutes, only the notification can start a job within the deadline.
    In transaction mode the listener must go to the server directly (--listen-dsn); in session
    mode it listens through pgbouncer, which carries notifications."""
    via = bouncer.dsn(dsn)
    extra = ["--listen-dsn", dsn] if bouncer.pool_mode == "transaction" else []
    worker = fleet.start(target=TARGET, via=via, poll=NO_POLL, extra=extra)
    fleet.wait_for(lambda: _listening(fleet), "the listener to LISTEN")
    # The first one may be taken by the claim the listener asks for once it listens; the
    # second can only be taken on its notification.
    for n in range(2):
        ids = [client.enqueue(poolers.echo, {"n": n}).id]
        fleet.wait_for(functools.partial(fleet.all_in, ids, "done"), f"job {n} to be done")
    assert NOT_REACHED not in worker.log(), worker.log()


def test_in_transaction_mode_without_a_listen_dsn_the_worker_warns_once_and_polls(
    bouncer_transaction: Bouncer, fleet: Fleet, dsn: str, conn: Conn
) -> None:
    """The notifications a LISTEN through pgbouncer in transaction mode should get are dropped
    by pgbouncer: the worker says so once, with the fix, and its jobs start at the poll."""
    via = bouncer_transaction.dsn(dsn)
    worker = fleet.start(target=TARGET, via=via, poll=2.0)
    fleet.wait_for(lambda: NOT_REACHED in worker.log(), "the listener's warning")
    job_id = poolers.app.enqueue(poolers.echo, {"n": 1}, conn=conn).id
    fleet.wait_for(lambda: fleet.all_in([job_id], "done"), "the job to be done at the poll")
    log = worker.log()
    assert log.count(NOT_REACHED) == 1, log
    assert "every 2 s" in log and "--listen-dsn or X_JOBS_LISTEN_DSN" in log, log
    assert not _listening(fleet)


def test_the_listener_probes_each_new_connection_and_warns_only_once(
    bouncer_transaction: Bouncer, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each (re)connection proves again that notifications arrive; a listener that keeps
    finding them lost says so once, not at every try."""
    caplog.set_level(logging.DEBUG, logger="x_jobs._listen")
    via = bouncer_transaction.dsn(dsn)
    stop = threading.Event()
    notified, wake = threading.Event(), threading.Event()
    thread = threading.Thread(
        target=listen,
        args=(via, "x_jobs"),
        kwargs={
            "notify_dsn": via,
            "application_name": "x_jobs listener",
            "wanted": None,
            "notified": notified,
            "wake": wake,
            "running": lambda: not stop.is_set(),
            "poll_interval": 1.0,
            "probe_seconds": 0.5,
            "reprobe_seconds": 0.1,
        },
    )
    thread.start()
    try:
        wait_for(
            lambda: caplog.text.count("notifications still do not reach the listener") >= 3,
            "three probes after the first",
        )
    finally:
        stop.set()
        thread.join(30)
    assert caplog.text.count(NOT_REACHED) == 1, caplog.text
    assert not notified.is_set()


def test_a_relay_behind_pgbouncer_delivers_every_message_once(
    bouncer: Bouncer, dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """Claims, acks and nacks through pgbouncer; in transaction mode the relay's listener warns
    once and the relay polls."""
    app = x_jobs.App(bouncer.dsn(dsn))
    seen: list[int] = []
    lock = threading.Lock()

    @app.outbox.sink("note")
    def note(message: OutboxMessage) -> None:
        with lock:
            seen.append(message.id)
        if message.payload.get("fail") and message.attempt == 1:
            raise RuntimeError("once")

    with conn.transaction():
        ids = [app.outbox.put("note", {"n": n, "fail": n % 10 == 0}, conn=conn) for n in range(60)]
    relay = Relay(app, lease=5, poll_interval=0.2)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM x_jobs.outbox WHERE id = ANY(%s) AND state = 'delivered'",
                    [ids],
                ).fetchone()
                == (len(ids),)
            ),
            "every message to be delivered",
        )
        if bouncer.pool_mode == "transaction":
            wait_for(lambda: RELAY_NOT_REACHED in caplog.text, "the relay's listener to warn")
        else:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM pg_catalog.pg_stat_activity"
                        " WHERE application_name = 'x_jobs relay listener'"
                        " AND query = 'LISTEN \"x_jobs_outbox\"'"
                    ).fetchone()
                    == (1,)
                ),
                "the relay's listener to LISTEN",
            )
    finally:
        relay.stop()
        thread.join(30)
        app.close()
    assert sorted(seen) == sorted(ids + [i for n, i in enumerate(ids) if n % 10 == 0])
    assert "refused" not in caplog.text, caplog.text
    expected = 1 if bouncer.pool_mode == "transaction" else 0
    assert caplog.text.count(RELAY_NOT_REACHED) == expected


def test_the_settler_retries_a_pooler_error_and_never_fails_the_job_for_it(
    bouncer_transaction: Bouncer,
    dsn: str,
    conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """psycopg's prepared statements put back on (as the client had them) through pgbouncer in
    transaction mode, every server connection holding another client's "_pg3_0": the settler's
    calls meet 42P05 (already exists), 26000 (does not exist) and 08P01 (the other statement's
    parameters), none of which says anything of the outputs. Taken for refusals they failed the
    jobs as dead; the settler sends them again on a new connection instead, and every job is
    done with its output."""
    via = bouncer_transaction.dsn(dsn)
    _seed_prepared_statements(via, 8)
    monkeypatch.setattr(x_jobs._conn, "PREPARE_THRESHOLD", 1)
    app = x_jobs.App(via)

    @app.job(name="echo")
    def echo(input: dict[str, int]) -> dict[str, int]:
        return input

    ids = [e.id for e in app.enqueue_many(echo, [{"n": n} for n in range(200)], conn=conn)]
    worker = x_jobs.Worker(app, concurrency=4, poll_interval=0.05, settle_delay=0.02)
    # Only the settler goes through pgbouncer: the dispatcher claims over a direct connection.
    monkeypatch.setattr(worker, "_connect", _direct_dispatcher(worker, dsn))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM x_jobs.job WHERE id = ANY(%s) AND state NOT IN"
                    " ('running', 'ready')",
                    [ids],
                ).fetchone()
                == (len(ids),)
            ),
            "every job to settle",
        )
    finally:
        worker.stop()
        thread.join(30)
        app.close()
    assert _outputs(conn, ids) == {job_id: ("done", {"n": n}) for n, job_id in enumerate(ids)}
    assert "retrying on a new connection" in caplog.text, "no pooler error was met"
    assert "output was refused" not in caplog.text


def _seed_prepared_statements(via: str, servers: int) -> None:
    """Leave a prepared statement named "_pg3_0" (psycopg's first) on ``servers`` server
    connections of pgbouncer: as many clients, each in a transaction at once (so each on a
    server connection of its own), prepare one and leave. In transaction mode pgbouncer resets
    nothing when a client leaves."""
    clients = [psycopg.connect(via, autocommit=True) for _ in range(servers)]
    try:
        for client in clients:
            client.execute("BEGIN")
            client.execute("SELECT %s::text", ["seed"], prepare=True)
        for client in clients:
            client.execute("COMMIT")
    finally:
        for client in clients:
            client.close()


def _direct_dispatcher(worker: x_jobs.Worker, dsn: str) -> Callable[..., None]:
    def connect_direct(*, first: bool = False) -> None:
        worker._conn = psycopg.connect(dsn, autocommit=True)
        worker._watch.silent = False

    return connect_direct
