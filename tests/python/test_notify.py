"""NOTIFY x_jobs: work due now wakes its queue (payload: the queue name); nothing else does.

To show that an action sent no notification without sleeping, the producer sends a sentinel
notification after it: notifications reach a listener in commit order, so once the sentinel
arrives everything the action sent has arrived before it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, Connect
from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)


class Listener:
    """LISTEN x_jobs on an autocommit connection of its own."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        conn.execute("LISTEN x_jobs")

    def after(self, producer: Conn, action: Callable[[], object]) -> list[tuple[str, int]]:
        """Run ``action``; answer the (payload, pid) of every x_jobs notification it caused."""
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
                got.append((note.payload, note.pid))
        pytest.fail(f"the sentinel notification never arrived (got {got})")


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
