"""NOTIFY x_jobs: work due now wakes its queue (payload: the queue's tag, never its name);
nothing else does. Any login may LISTEN: one of no x_jobs role hears tags only.

To show that an action sent no notification without sleeping, the producer sends a sentinel
notification after it: notifications reach a listener in commit order, so once the sentinel
arrives everything the action sent has arrived before it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, Connect, fresh_database, notify_names, wait_for
from psycopg import sql
from psycopg.types.json import Jsonb

import x_jobs
from x_jobs._listen import _payloads

logger = logging.getLogger(__name__)


class Listener:
    """LISTEN x_jobs on an autocommit connection of its own."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.name = notify_names(conn, "x_jobs", QUEUES)
        conn.execute("LISTEN x_jobs")

    def after(self, producer: Conn, action: Callable[[], object]) -> list[tuple[str, int]]:
        """Run ``action``; answer the (queue, pid) of every x_jobs notification it caused."""
        action()
        sentinel = f"sentinel-{uuid.uuid4()}"
        producer.execute("SELECT pg_notify('x_jobs', %s)", [sentinel])
        got: list[tuple[str, int]] = []
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            for note in self.conn.notifies(timeout=1.0):
                assert note.channel == "x_jobs"
                if note.payload == sentinel:
                    return got
                got.append((self.name(note.payload), note.pid))
        pytest.fail(f"the sentinel notification never arrived (got {got})")


#: The queues of this module's tests: the listener tells their tags from other payloads.
QUEUES = (
    "default", "mail", "later", "undone", "outbox", "qa", "qb", "qc", "qd", "qe", "retry",
    "held", "flows", "other",
)  # fmt: skip


@pytest.fixture
def listener(connect: Connect) -> Iterator[Listener]:
    yield Listener(connect(name="listener"))


def _claim_one(conn: Conn, queue: str = "default") -> int:
    row = conn.execute(
        "SELECT id FROM x_jobs.claim(ARRAY[%s], 'w1', '30 seconds', 1)", [queue]
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_enqueue_wakes_its_queue(conn: Conn, listener: Listener) -> None:
    pid = conn.info.backend_pid
    got = listener.after(conn, lambda: conn.execute("SELECT x_jobs.enqueue('a')"))
    assert got == [("default", pid)]
    got = listener.after(conn, lambda: conn.execute("SELECT x_jobs.enqueue('a', queue => 'mail')"))
    assert got == [("mail", pid)]


def test_delayed_enqueue_wakes_nobody(conn: Conn, listener: Listener) -> None:
    got = listener.after(
        conn,
        lambda: conn.execute(
            "SELECT x_jobs.enqueue('a', run_at => now() + interval '1 hour', queue => 'later')"
        ),
    )
    assert got == []
    state = conn.execute("SELECT state::text FROM x_jobs.job").fetchone()
    assert state == ("delayed",)


def test_rolled_back_enqueue_wakes_nobody(conn: Conn, listener: Listener) -> None:
    def enqueue_and_roll_back() -> None:
        with conn.transaction():
            conn.execute("SELECT x_jobs.enqueue('a', queue => 'undone')")
            raise psycopg.Rollback()

    assert listener.after(conn, enqueue_and_roll_back) == []
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_an_uncommitted_enqueue_wakes_its_queue_at_commit(
    conn: Conn, connect: Connect, listener: Listener
) -> None:
    producer = connect(name="producer")
    with producer.transaction():
        producer.execute("SELECT x_jobs.enqueue('a', queue => 'outbox')")
        # Not yet: the listener sees only what committed before this sentinel.
        assert listener.after(conn, lambda: None) == []
    assert listener.after(conn, lambda: None) == [("outbox", producer.info.backend_pid)]


def test_enqueue_many_wakes_each_queue_once(conn: Conn, listener: Listener) -> None:
    requests = [{"name": "a", "queue": "qa" if n % 2 else "qb"} for n in range(100)]
    # Rows due later wake nobody, even in the same call.
    requests += [{"name": "a", "queue": "qc", "run_at": "2999-01-01T00:00:00Z"}] * 10
    got = listener.after(
        conn, lambda: conn.execute("SELECT x_jobs.enqueue_many(%s)", [Jsonb(requests)])
    )
    assert sorted(payload for payload, _ in got) == ["qa", "qb"]


def test_a_keyed_enqueue_many_wakes_only_the_queues_it_inserted_into(
    conn: Conn, listener: Listener
) -> None:
    """A batch with idempotency keys takes enqueue's general path: a request that deduped onto a
    live row inserted nothing, so its queue is not woken for it."""
    taken = "SELECT x_jobs.enqueue('a', queue => 'qd', idempotency_key => 'taken')"
    assert [payload for payload, _ in listener.after(conn, lambda: conn.execute(taken))] == ["qd"]
    requests = [
        {"name": "a", "queue": "qd", "idempotency_key": "taken"},
        {"name": "a", "queue": "qe", "idempotency_key": "fresh"},
    ]
    got = listener.after(
        conn, lambda: conn.execute("SELECT x_jobs.enqueue_many(%s)", [Jsonb(requests)])
    )
    assert sorted(payload for payload, _ in got) == ["qe"]


def test_a_retry_due_now_wakes_its_queue(conn: Conn, listener: Listener) -> None:
    conn.execute("SELECT x_jobs.enqueue('a', queue => 'retry')")
    listener.after(conn, lambda: None)  # the enqueue's own notification
    job_id = _claim_one(conn, "retry")

    def fail(delay: str) -> None:
        row = conn.execute(
            "SELECT x_jobs.fail(%s, 'w1', 'boom', retry_delay => %s::interval)", [job_id, delay]
        ).fetchone()
        assert row == ("ready" if delay == "0" else "delayed",)

    assert listener.after(conn, lambda: fail("0")) == [("retry", conn.info.backend_pid)]
    # Claimed again; a retry that waits out a delay wakes nobody now.
    assert _claim_one(conn, "retry") == job_id
    assert listener.after(conn, lambda: fail("1 hour")) == []


def test_resume_queue_wakes_it(conn: Conn, listener: Listener) -> None:
    paused = listener.after(
        conn, lambda: conn.execute("SELECT x_jobs.pause_queue('held')").fetchone()
    )
    assert paused == []

    def resume() -> None:
        assert conn.execute("SELECT x_jobs.resume_queue('held')").fetchone() == (True,)

    assert listener.after(conn, resume) == [("held", conn.info.backend_pid)]

    def resume_again() -> None:
        assert conn.execute("SELECT x_jobs.resume_queue('held')").fetchone() == (False,)

    # Resuming a queue that is not paused changes nothing and wakes nobody.
    assert listener.after(conn, resume_again) == []


def test_a_producer_with_x_jobs_notify_off_sends_nothing(
    conn: Conn, connect: Connect, listener: Listener
) -> None:
    """SET x_jobs.notify = off: enqueue, enqueue_many, publish and outbox puts stay silent (the
    workers and relays find the work at their next poll); the default still notifies."""
    quiet = connect(name="quiet-producer")
    quiet.execute("SET x_jobs.notify = off")
    # A run waiting on 'go', set up by the default session (its notification drained here).
    listener.after(
        conn, lambda: conn.execute("SELECT x_jobs.enqueue(name => 'f', queue => 'flows')")
    )
    flow = _claim_one(conn, "flows")
    conn.execute(
        "SELECT x_jobs.step_wait(id => %s, worker => 'w1', step => 'go', event => 'go')", [flow]
    )

    def quietly() -> None:
        quiet.execute("SELECT x_jobs.enqueue(name => 'a', queue => 'default')")
        quiet.execute("""SELECT x_jobs.enqueue_many('[{"name": "b", "queue": "other"}]')""")
        quiet.execute("SELECT x_jobs.outbox_put('orders', '{}', 'k')")
        quiet.execute("""SELECT x_jobs.outbox_put_many('[{"topic": "t", "payload": 1}]')""")
        woken = quiet.execute("SELECT woken FROM x_jobs.publish('go')").fetchone()
        assert woken == (1,)

    assert listener.after(quiet, quietly) == []
    # The work is there all the same: a claim finds it.
    assert {_claim_one(conn, q) > 0 for q in ("default", "other", "flows")} == {True}
    # And a session with the default notifies.
    pid = conn.info.backend_pid
    got = listener.after(
        conn, lambda: conn.execute("SELECT x_jobs.enqueue(name => 'c', queue => 'default')")
    )
    assert got == [("default", pid)]


@contextmanager
def login(admin: Conn, *roles: str) -> Iterator[str]:
    """A LOGIN role that is a member of ``roles`` (none: of no x_jobs role); its name."""
    role = f"x_jobs_test_notify_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    for member_of in roles:
        admin.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(member_of), sql.Identifier(role))
        )
    try:
        yield role
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_login_of_no_x_jobs_role_hears_tags_only_while_a_worker_is_woken_at_once(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    """Any login may LISTEN: one granted nothing of x_jobs hears that something was enqueued
    or put, and when, but neither the queue nor the topic. A worker (a login of x_jobs_worker,
    which asks the tags of its queues) is still woken by the notification: it polls only every
    minute here, and takes each job within seconds."""
    with (
        login(admin) as nobody,
        login(admin, "x_jobs_worker") as worker_role,
        psycopg.connect(f"{dsn} user={nobody}", autocommit=True) as eavesdropper,
    ):
        eavesdropper.execute("LISTEN x_jobs")
        eavesdropper.execute("LISTEN x_jobs_outbox")
        app = x_jobs.App(f"{dsn} user={worker_role}")
        ran: queue.Queue[int] = queue.Queue()

        @app.job(name="payroll-run", queue="payroll-secret")
        def payroll(input: dict[str, int]) -> None:
            ran.put(input["n"])

        worker = x_jobs.Worker(app, concurrency=1, poll_interval=60, grace=1)
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
        thread.start()
        try:
            wait_for(lambda: _listening(conn), "the worker's listener to LISTEN")
            for n in range(3):
                conn.execute(
                    "SELECT x_jobs.enqueue('payroll-run', %s, queue => 'payroll-secret')",
                    [Jsonb({"n": n})],
                )
                # The first may be taken by the claim the listener makes once it listens;
                # the others only by a wake-up (the next poll is a minute away).
                assert ran.get(timeout=10) == n
            conn.execute("SELECT x_jobs.outbox_put('payroll.salaries-secret', '{}')")
        finally:
            worker.stop()
            thread.join(timeout=30)
            app.close()
        heard = _drain(eavesdropper, conn)
    assert len([h for h in heard if h[0] == "x_jobs"]) >= 3, heard
    assert [h for h in heard if h[0] == "x_jobs_outbox"], heard
    for channel, payload in heard:
        assert "payroll" not in payload and "secret" not in payload, heard
        assert len(payload) == 16 and set(payload) <= set("0123456789abcdef"), (channel, payload)


def _listening(conn: Conn) -> bool:
    return bool(
        conn.execute(
            "SELECT count(*) > 0 FROM pg_catalog.pg_stat_activity"
            " WHERE datname = pg_catalog.current_database()"
            " AND application_name = 'x_jobs listener' AND query = 'LISTEN \"x_jobs\"'"
        ).fetchone()
        == (True,)
    )


def _drain(listener: Conn, sender: Conn) -> list[tuple[str, str]]:
    """Every (channel, payload) ``listener`` heard before a sentinel on each channel."""
    sentinel = f"sentinel-{uuid.uuid4()}"
    for channel in ("x_jobs", "x_jobs_outbox"):
        sender.execute("SELECT pg_notify(%s, %s)", [channel, sentinel])
    heard: list[tuple[str, str]] = []
    seen = 0
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        for note in listener.notifies(timeout=1.0):
            if note.payload == sentinel:
                seen += 1
                if seen == 2:
                    return heard
            else:
                heard.append((note.channel, note.payload))
    pytest.fail(f"the sentinel notifications never arrived (heard {heard})")


def test_the_listener_matches_names_on_a_database_of_0_4_1(admin: Conn) -> None:
    """A database of 0.4.1 has no notify_tags and sends the names: the listener matches those;
    on 0.4.2 it matches the tags notify_tags answers."""
    with (
        fresh_database(admin, "template0", prefix="x_jobs_notify_041") as conninfo,
        psycopg.connect(conninfo, autocommit=True) as old,
    ):
        old.execute("CREATE EXTENSION x_jobs VERSION '0.4.1'")
        assert _payloads(old, "x_jobs", {"a", "b"}, "test") == frozenset({"a", "b"})
        assert _payloads(old, "x_jobs", None, "test") is None
        old.execute("ALTER EXTENSION x_jobs UPDATE TO '0.4.2'")
        tags = _payloads(old, "x_jobs", {"a", "b"}, "test")
        assert tags is not None and tags.isdisjoint({"a", "b"}) and len(tags) == 2
        name = notify_names(old, "x_jobs", ["a", "b"])
        assert sorted(name(tag) for tag in tags) == ["a", "b"]
