"""The worker loop at its edges: outcomes the settler cannot send as they are, an exception that
cannot be printed, a database whose encoding cannot hold an error text, a sync body that outlives
its timeout, and a settler whose connection drops in the middle of a batch.

Each of these once stopped a worker from settling (its settler thread died, or a job stayed
``running`` with its lease extended), ran one job twice at once, or failed one attempt with
another's error. The handlers are in ``apps.edges``; they record their runs in ``run_log``.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from apps import edges
from apps.workers import Fleet
from conftest import Conn, free_port, scrape, wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo

import x_jobs

logger = logging.getLogger(__name__)

TARGET = "apps.edges:app"

#: How long a test waits for what a sound worker does in well under a second: shorter than
#: conftest's deadline, so that a wedged worker fails the test in reasonable time.
SETTLE_SECONDS = 15.0


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        yield fleet


def settled(fleet: Fleet, condition: Callable[[], bool], what: str) -> None:
    """Wait SETTLE_SECONDS for ``condition``; fail with the workers' logs."""
    try:
        wait_for(condition, what, timeout=SETTLE_SECONDS)
        return
    except pytest.fail.Exception as err:
        failed = str(err)
    pytest.fail(f"{failed}\n{fleet.report()}")


def errors_of(conn: Conn, job_id: int) -> list[tuple[int, str]]:
    """(attempt, error) of each job_error row of the job, in attempt order."""
    rows = conn.execute(
        "SELECT attempt, error FROM x_jobs.job_error WHERE job_id = %s ORDER BY attempt, failed_at",
        [job_id],
    ).fetchall()
    return [(int(attempt), str(error)) for attempt, error in rows]


def test_an_output_python_cannot_print_fails_its_job_and_the_settling_goes_on(
    fleet: Fleet, conn: Conn
) -> None:
    """10**5000 is an int, so the handler's output passed for JSON; sending it raised ValueError
    (Python's int-to-str digit limit), not a psycopg.Error: the settler thread died with it, and
    the worker settled nothing ever again."""
    huge = edges.app.enqueue(edges.huge_int, {}, conn=conn).id
    before = [edges.app.enqueue(edges.noop, {}, conn=conn).id for _ in range(3)]
    fleet.start(concurrency=1, target=TARGET)
    settled(fleet, lambda: fleet.all_in([huge, *before], "dead", "done"), "every job to settle")

    row = conn.execute("SELECT state::text, last_error FROM x_jobs.job WHERE id = %s", [huge])
    state, error = row.fetchone() or (None, None)
    assert state == "dead"
    assert error is not None, huge
    assert ("X_OUTPUT_INVALID" in error and "not JSON" in error) or error.startswith(
        "its output was refused"
    ), error
    assert fleet.states(before) == {job_id: "done" for job_id in before}
    # The settler lives on: a job enqueued now is settled too.
    after = edges.app.enqueue(edges.noop, {}, conn=conn).id
    settled(fleet, lambda: fleet.all_in([after], "done"), "a later job to be settled")


def test_an_error_with_a_lone_surrogate_is_recorded_escaped_and_the_settling_goes_on(
    fleet: Fleet, conn: Conn
) -> None:
    """A message decoded with surrogateescape holds a lone surrogate, which no encoding takes:
    sending the fail raised UnicodeEncodeError, and the settler thread died with it."""
    bad = edges.app.enqueue(edges.surrogate_error, {}, conn=conn).id
    fleet.start(concurrency=1, target=TARGET)
    settled(fleet, lambda: fleet.all_in([bad], "dead"), "the job to fail")

    errors = errors_of(conn, bad)
    assert len(errors) == 1, errors
    attempt, error = errors[0]
    assert attempt == 1
    assert error.startswith("ValueError: upstream said "), error
    assert "\\udc80" in error, error
    after = [edges.app.enqueue(edges.noop, {}, conn=conn).id for _ in range(3)]
    settled(fleet, lambda: fleet.all_in(after, "done"), "later jobs to be settled")


@pytest.mark.parametrize("name", ["unprintable_async", "unprintable_sync"])
def test_an_exception_whose_str_raises_still_fails_its_job(
    fleet: Fleet, conn: Conn, name: str
) -> None:
    """The failure's text is f"{type}: {err}": an exception whose __str__ raises made that raise
    in turn. The async run's task died without an outcome (the job stayed running, its lease
    extended for ever); the sync one was failed as the RuntimeError, not as what it raised."""
    job_id = edges.app.enqueue(name, {}, conn=conn).id
    fleet.start(concurrency=1, target=TARGET)
    settled(fleet, lambda: fleet.all_in([job_id], "dead"), f"the {name} job to fail")

    errors = errors_of(conn, job_id)
    assert len(errors) == 1, errors
    assert errors[0][1].startswith("Unprintable"), errors
    after = edges.app.enqueue(edges.noop, {}, conn=conn).id
    settled(fleet, lambda: fleet.all_in([after], "done"), "a later job to be settled")


def test_a_batch_with_an_error_a_latin1_database_cannot_hold_is_settled(
    admin: Conn, tmp_path: Path
) -> None:
    """In a LATIN1 database "€" has no byte: the fail of a batch of four completions and one
    failure raised, after complete_many had committed the four. Settled one by one, the four
    were no longer held (counted lost) and the failure was refused again: its lease lapsed, and
    the job was buried as "lease lapsed" with no error recorded."""
    name = f"x_jobs_latin1_{uuid.uuid4().hex[:12]}"
    admin.execute(
        sql.SQL(
            "CREATE DATABASE {} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
        ).format(sql.Identifier(name))
    )
    try:
        dsn = make_conninfo("", dbname=name)
        with psycopg.connect(dsn, autocommit=True, client_encoding="utf8") as conn:
            conn.execute("CREATE EXTENSION x_jobs")
            _latin1_batch(conn, dsn)
    finally:
        admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def _latin1_batch(conn: Conn, dsn: str) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="latin", queue="latin1", max_attempts=1)
    def latin(input: dict[str, bool]) -> None:
        if input["fail"]:
            raise ValueError("the bill came to 5 € and nobody paid")

    ids = [job.id for job in latin.enqueue_many([{"fail": n == 4} for n in range(5)])]
    failing = ids[4]
    port = free_port()
    # Five slots and a long settle delay: the five outcomes are settled as one batch.
    worker = x_jobs.Worker(
        app, concurrency=5, lease=2, poll_interval=0.05, settle_delay=5, metrics_port=port
    )

    def states() -> dict[int, str]:
        rows = conn.execute(
            "SELECT id, state::text FROM x_jobs.job WHERE id = ANY (%s)", [ids]
        ).fetchall()
        return dict(rows)

    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(
            lambda: all(s in {"done", "dead"} for s in states().values()),
            "the five jobs to settle",
            timeout=SETTLE_SECONDS,
        )
        samples = scrape(port)
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()
    assert not thread.is_alive()

    assert states() == {**{job_id: "done" for job_id in ids[:4]}, failing: "dead"}
    errors = errors_of(conn, failing)
    assert len(errors) == 1, errors
    assert errors[0][0] == 1
    assert errors[0][1].startswith("ValueError: the bill came to 5 "), errors
    assert "\\u20ac" in errors[0][1], errors
    row = conn.execute("SELECT last_error FROM x_jobs.job WHERE id = %s", [failing]).fetchone()
    assert row is not None and "lease lapsed" not in str(row[0]), row
    settled_total = {
        key: value
        for key, value in samples.items()
        if key.startswith('x_jobs_settled_total{job_name="latin"')
    }
    done = settled_total.get('x_jobs_settled_total{job_name="latin",state="done"}')
    assert done == 4, settled_total
    assert settled_total.get('x_jobs_settled_total{job_name="latin",state="lost"}', 0) == 0, (
        settled_total
    )


def test_a_timed_out_body_still_running_is_not_run_again_beside_itself(
    fleet: Fleet, conn: Conn
) -> None:
    """A sync body cannot be killed: attempt 1 of ``stubborn`` ignores the stop and runs 4 s past
    its 1 s timeout. The worker failed the attempt at the timeout, and the retry was claimed by
    the other worker (or this one) while attempt 1 still ran: two runs of one job at once."""
    job_id = edges.app.enqueue(edges.stubborn, {}, conn=conn).id
    # The first worker takes attempt 1 and then polls seldom; the second, started once attempt 1
    # runs, polls often: it is the one that takes the retry as soon as the row is due. (Left to
    # chance, the first worker often claimed the retry itself, only to hold it unstarted behind
    # its one busy thread: test_a_slot_held_by_a_timed_out_body_is_not_claimed_for_another_job.)
    fleet.start(concurrency=1, poll=10.0, target=TARGET)
    settled(
        fleet,
        lambda: any(r.attempt == 1 for r in fleet.runs()),
        "attempt 1 to start",
    )
    fleet.start(concurrency=1, poll=0.05, target=TARGET)
    settled(fleet, lambda: fleet.all_in([job_id], "done"), "the job to be done")
    settled(
        fleet,
        lambda: all(r.finished is not None for r in fleet.runs()),
        "every run's body to return",
    )

    runs = {r.attempt: r for r in fleet.runs() if r.job_id == job_id}
    assert sorted(runs) == [1, 2], runs
    first, second = runs[1], runs[2]
    assert first.finished is not None, first
    assert second.started >= first.finished, (
        f"attempt 2 started at {second.started}, before attempt 1 returned at {first.finished}"
    )
    assert fleet.overlaps() == []
    assert errors_of(conn, job_id) == [(1, "timed out after 1 s")]


def test_a_slot_held_by_a_timed_out_body_is_not_claimed_for_another_job(
    fleet: Fleet, conn: Conn
) -> None:
    """One thread, no prefetch: while attempt 1 of ``stubborn`` runs on past its timeout, the
    worker has no thread to run anything else. Once it settled the timeout it claimed the next
    job all the same, which sat ``running`` (its lease extended) without starting."""
    stuck = edges.app.enqueue(edges.stubborn, {}, conn=conn, max_attempts=1).id
    fleet.start(concurrency=1, target=TARGET, extra=["--prefetch", "0"])
    settled(fleet, lambda: any(r.job_id == stuck for r in fleet.runs()), "the stuck job to start")
    other = edges.app.enqueue(edges.noop, {}, conn=conn).id

    # Watch until attempt 1's body returns: meanwhile the other job must stay ready. One query
    # reads both, so a claim the worker made once the body was done counts as made after it.
    def body_returned() -> bool:
        row = conn.execute(
            "SELECT (SELECT finished IS NOT NULL FROM public.run_log WHERE job_id = %s),"
            " (SELECT state::text FROM x_jobs.job WHERE id = %s)",
            [stuck, other],
        ).fetchone()
        assert row is not None
        returned, state = row
        assert returned or state == "ready", (
            f"job {other} is {state} while the only thread still runs the timed-out body"
        )
        return bool(returned)

    settled(fleet, body_returned, "the stuck body to return")
    settled(fleet, lambda: fleet.all_in([other], "done"), "the other job to run")
    assert fleet.states([stuck]) == {stuck: "dead"}
    assert errors_of(conn, stuck) == [(1, "timed out after 1 s")]
    runs = {r.job_id: r for r in fleet.runs()}
    returned = runs[stuck].finished
    assert returned is not None
    assert runs[other].started >= returned


# A job_error insert that sleeps, once: the second of the two first-attempt failures of the twin
# jobs (whichever the settler sends second), so that the test can drop the settler's connection
# while the first failure of the batch has committed and the second has not. The sequence is not
# rolled back with the dropped transaction: the failure sent again does not sleep. The trigger
# runs as the test's superuser: x_jobs.fail runs as x_jobs_owner, which may not use the sequence.
SLEEP_ONCE: LiteralString = """
    CREATE SEQUENCE public.sleep_once;
    CREATE FUNCTION public.sleep_once() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp AS $$
    BEGIN
        IF NEW.attempt = 1 AND NEW.job_id = ANY ({twins}::bigint[])
            AND EXISTS (
                SELECT FROM x_jobs.job_error AS e
                WHERE e.job_id = ANY ({twins}::bigint[]) AND e.job_id <> NEW.job_id
                    AND e.attempt = 1)
            AND pg_catalog.nextval('public.sleep_once') = 1
        THEN
            PERFORM pg_catalog.pg_sleep(20);
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE TRIGGER sleep_once AFTER INSERT ON x_jobs.job_error
        FOR EACH ROW EXECUTE FUNCTION public.sleep_once();
"""


def test_a_batch_sent_again_after_a_dropped_connection_fails_no_attempt_twice(
    fleet: Fleet, conn: Conn
) -> None:
    """A batch was settled in autocommit statements. The settler's connection dropped after the
    batch's first fail had committed; the retry sent the whole batch again, and that fail, of
    attempt 1, failed attempt 2 of the same job, which this worker had claimed meanwhile. Now
    the batch commits whole or not at all, and is sent again only for what is still held."""
    twins = [job.id for job in edges.app.enqueue_many(edges.twin_fail, [{}, {}], conn=conn)]
    literal = "{" + ",".join(map(str, twins)) + "}"
    conn.execute(sql.SQL(SLEEP_ONCE).format(twins=sql.Literal(literal)))
    fleet.start(concurrency=4, target=TARGET)

    def settler_asleep() -> list[Any]:
        return conn.execute(
            "SELECT pid FROM pg_catalog.pg_stat_activity"
            " WHERE datname = current_database() AND application_name = 'x_jobs settler'"
            " AND wait_event = 'PgSleep'"
        ).fetchall()

    settled(fleet, lambda: bool(settler_asleep()), "the settler to sleep in the second fail")
    # The batch is one transaction: its first failure is not settled (the job not due again)
    # while the second is being sent. Autocommit statements had committed it, and the job's
    # attempt 2 ran, to be failed by the batch sent again after the drop.
    first = conn.execute(
        "SELECT job_id FROM x_jobs.job_error WHERE job_id = ANY (%s) AND attempt = 1", [twins]
    ).fetchall()
    assert first == [], "a failure of the batch committed before the rest of it"
    for (pid,) in settler_asleep():
        conn.execute("SELECT pg_catalog.pg_terminate_backend(%s)", [pid])

    settled(fleet, lambda: fleet.all_in(twins, "dead"), "both jobs to run out of attempts")
    for job_id in twins:
        errors = errors_of(conn, job_id)
        assert errors == [(n, f"ValueError: attempt {n}") for n in (1, 2, 3)], (job_id, errors)
    assert fleet.overlaps() == []


def _job_row(conn: Conn, job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        "SELECT state::text, attempt, claimed_by FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_an_embedded_drain_keeps_a_job_whose_handler_outlives_the_grace(
    dsn: str, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``Worker.run()`` in a process that lives on cannot end a handler that runs past the
    drain's grace. It handed the job back all the same, due at once while its handler ran on:
    another worker could run it beside it. It keeps the job (its lease extended) until the
    handler returns, and settles what the handler answers."""
    app = x_jobs.App(dsn)
    started, gate = threading.Event(), threading.Event()

    @app.job(name="stubborn", queue="outlast")
    def stubborn(input: dict[str, Any]) -> dict[str, bool]:
        started.set()
        gate.wait(SETTLE_SECONDS)  # deaf to ctx.cancelled
        return {"finished": True}

    job_id = stubborn.enqueue({}).id
    worker = x_jobs.Worker(app, concurrency=1, lease=1, poll_interval=0.05, grace=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    caplog.set_level(logging.WARNING, logger="x_jobs.worker")
    thread.start()
    try:
        assert started.wait(SETTLE_SECONDS)
        worker.stop()
        wait_for(
            lambda: "grace ran out" in caplog.text, "the grace to run out", timeout=SETTLE_SECONDS
        )
        # Past the grace and past a lease (1 s): still this worker's, and no one else's.
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT x_jobs.now() > visible_at - interval '0.5 seconds' FROM x_jobs.job"
                    " WHERE id = %s",
                    [job_id],
                ).fetchone()
                == (False,)
            ),
            "a heartbeat after the grace",
            timeout=SETTLE_SECONDS,
        )
        assert _job_row(conn, job_id) == ("running", 1, worker.worker_id)
        assert (
            conn.execute(
                "SELECT id FROM x_jobs.claim(ARRAY['outlast'], 'another', '30 seconds', 10)"
            ).fetchall()
            == []
        )
        assert thread.is_alive()
        gate.set()
        thread.join(SETTLE_SECONDS)
        assert not thread.is_alive()
    finally:
        gate.set()
        worker.stop()
        thread.join(timeout=30)
        app.close()
    assert _job_row(conn, job_id) == ("done", 1, worker.worker_id)


def drain_once_started(app: x_jobs.App, started: threading.Event) -> None:
    """Run an embedded worker (grace 0.2 s), stop it once its one job has started, and wait
    for run() to return; fail if it does not within SETTLE_SECONDS."""
    worker = x_jobs.Worker(app, concurrency=1, poll_interval=0.05, grace=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        assert started.wait(SETTLE_SECONDS)
        worker.stop()
        thread.join(SETTLE_SECONDS)
        assert not thread.is_alive()
    finally:
        worker.stop()
        thread.join(timeout=30)
        app.close()


def test_an_embedded_drain_hands_back_a_job_whose_handler_stops_when_told_after_the_grace(
    dsn: str, conn: Conn
) -> None:
    """A handler still running when the grace runs out is told to stop; once it has, its job
    is handed back as a drain does (due at once, the attempt not counted, no error kept)."""
    app = x_jobs.App(dsn)
    started = threading.Event()

    @app.job(name="polite", queue="outlast")
    def polite(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
        started.set()
        ctx.cancelled.wait(SETTLE_SECONDS)
        ctx.raise_if_cancelled()

    job_id = polite.enqueue({}).id
    drain_once_started(app, started)
    assert _job_row(conn, job_id) == ("ready", 0, None)
    assert errors_of(conn, job_id) == []


def test_an_embedded_drain_fails_as_timed_out_a_handler_whose_timeout_comes_after_the_grace(
    dsn: str, conn: Conn
) -> None:
    """A handler kept past the drain's grace is handed back if it fails; but if its timeout came
    meanwhile, the attempt fails as timed out, as it would have without the drain (handed back,
    a job that always times out would never use up its attempts)."""
    app = x_jobs.App(dsn)
    started = threading.Event()

    @app.job(name="slow", queue="outlast", timeout=0.6)
    def slow(input: dict[str, Any]) -> None:
        started.set()
        threading.Event().wait(1.5)  # deaf to ctx.cancelled, past both the grace and the timeout

    job_id = slow.enqueue({}).id
    drain_once_started(app, started)
    state, attempt, _ = _job_row(conn, job_id)
    assert (state, attempt) in {("delayed", 1), ("ready", 1)}
    assert errors_of(conn, job_id) == [(1, "timed out after 0.6 s")]
