"""Durable steps in real worker processes: replay after kill -9, sleeps and event waits that hold
no worker, timeouts, sagas, progress, and ``app.result``.

What a step body did is read from ``public.effect`` (see ``apps.flows``): one row per time a
body ran, so "not executed again" is a count, not a guess.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, LiteralString

import pytest
from apps import flows, step_edges
from apps.workers import Fleet
from conftest import Conn, wait_for

import x_jobs
from x_jobs.steps import StepStore

TARGET = "apps.flows:app"


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(dsn, tmp_path) as fleet:
        fleet.execute(flows.SCHEMA)
        yield fleet


@pytest.fixture
def client(dsn: str) -> Iterator[x_jobs.App]:
    """An app on the test's database, for ``result`` (apps.flows.app reads the environment)."""
    app = x_jobs.App(dsn)
    yield app
    app.close()


def _effects(fleet: Fleet, job_id: int) -> list[tuple[str, int]]:
    return [
        (str(what), int(attempt))
        for what, attempt in fleet.execute(
            "SELECT what, attempt FROM public.effect WHERE job_id = %s ORDER BY seq", [job_id]
        )
    ]


def _job(fleet: Fleet, job_id: int) -> dict[str, Any]:
    (row,) = fleet.execute(
        "SELECT state::text, attempt, claimed_by, run_at = 'infinity', output, last_error, progress"
        " FROM x_jobs.job WHERE id = %s",
        [job_id],
    )
    keys = ("state", "attempt", "claimed_by", "forever", "output", "last_error", "progress")
    return dict(zip(keys, row, strict=True))


def _steps(fleet: Fleet, job_id: int) -> list[tuple[str, bool, str, str, int]]:
    return [
        (str(name), bool(compensation), str(kind), str(status), int(attempt))
        for name, compensation, kind, status, attempt in fleet.execute(
            "SELECT name, compensation, kind, status::text, attempt FROM x_jobs.step"
            " WHERE job_id = %s ORDER BY created_at, compensation, name",
            [job_id],
        )
    ]


def _in_state(fleet: Fleet, job_id: int, state: str) -> bool:
    return bool(_job(fleet, job_id)["state"] == state)


def test_a_workflow_killed_after_step_two_resumes_at_step_three(fleet: Fleet, conn: Conn) -> None:
    job_id = flows.app.enqueue(flows.three_steps, {}, conn=conn).id
    first = fleet.start(target=TARGET, lease=1.0)
    fleet.wait_for(lambda: ("parked", 1) in _effects(fleet, job_id), "step two to be recorded")
    first.kill()

    fleet.start(target=TARGET, lease=1.0)
    fleet.wait_for(lambda: _in_state(fleet, job_id, "done"), "the re-run to finish")

    assert _effects(fleet, job_id) == [("one", 1), ("two", 1), ("parked", 1), ("three", 2)]
    job = _job(fleet, job_id)
    assert job["output"] == {"a": 1, "b": 2, "c": 3}
    assert job["attempt"] == 2
    assert _steps(fleet, job_id) == [
        ("one", False, "run", "done", 1),
        ("two", False, "run", "done", 1),
        ("three", False, "run", "done", 2),
    ]


def test_a_wait_holds_no_worker_and_a_publish_from_psql_wakes_it(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.await_approval, {"key": "order-7"}, conn=conn).id
    fleet.start(target=TARGET)
    fleet.wait_for(lambda: _in_state(fleet, job_id, "suspended"), "the run to suspend")
    job = _job(fleet, job_id)
    assert job["claimed_by"] is None and job["forever"] is True
    # Attempts are for failures: the suspension gave its attempt back.
    assert job["attempt"] == 0

    # An event with another key wakes nobody.
    subprocess.run(
        [
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            fleet.dbname,
            "-c",
            """SELECT x_jobs.publish('approved', '{"by": "mallory"}', 'order-8')""",
        ],
        check=True,
    )
    subprocess.run(
        [
            "psql",
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            fleet.dbname,
            "-c",
            """SELECT x_jobs.publish('approved', '{"by": "ada"}', 'order-7')""",
        ],
        check=True,
    )

    assert client.result(job_id, timeout=60) == {"by": "ada"}
    assert _effects(fleet, job_id) == [("before", 1), ("after", 1)]
    assert _job(fleet, job_id)["attempt"] == 1
    assert _steps(fleet, job_id) == [
        ("before", False, "run", "done", 1),
        ("approval", False, "wait", "done", 1),
    ]


def test_a_wait_with_a_timeout_takes_the_timeout_path(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.await_approval, {"key": "never", "timeout": 0.5}, conn=conn).id
    fleet.start(target=TARGET, poll=0.1)

    output = client.result(job_id, timeout=60)
    assert output["timed_out"].startswith("X_STEP_TIMEOUT")
    assert _effects(fleet, job_id) == [("before", 1), ("timed out", 1)]
    ((status, resolved_by),) = fleet.execute(
        "SELECT status::text, resolved_by FROM x_jobs.step WHERE job_id = %s AND name = 'approval'",
        [job_id],
    )
    assert (status, resolved_by) == ("failed", "timeout")


def test_a_wait_since_the_run_began_sees_an_event_published_before_it(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.await_since_run, {"key": "early"}, conn=conn).id
    conn.execute("SELECT x_jobs.publish('approved', '{\"n\": 1}', 'early')")
    fleet.start(target=TARGET)
    assert client.result(job_id, timeout=60) == {"n": 1}


def test_a_sleep_suspends_the_run_and_it_resumes_after(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.napper, {"seconds": 1.5}, conn=conn).id
    fleet.start(target=TARGET, poll=0.1)
    fleet.wait_for(lambda: _in_state(fleet, job_id, "suspended"), "the run to sleep")
    assert _job(fleet, job_id)["claimed_by"] is None

    # max_attempts is 1: the sleep did not spend the job's only attempt.
    assert client.result(job_id, timeout=60) == {"attempt": 1}
    assert _effects(fleet, job_id) == [("before", 1), ("after", 1)]


def test_a_saga_that_fails_for_good_runs_the_compensations_in_reverse_once(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.saga, {}, conn=conn).id
    fleet.start(target=TARGET)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert failed.value.state == "dead"
    assert "step three failed" in (failed.value.error or "")
    # Attempt 1 failed with attempts left: no compensation. Attempt 2 replayed one and two, failed
    # at three for good, and undid two, then one; step three never completed, so nothing undoes it.
    assert _effects(fleet, job_id) == [
        ("one", 1),
        ("two", 1),
        ("three", 1),
        ("three", 2),
        ("undo two r2", 2),
        ("undo one r1", 2),
    ]
    # Recorded as they ran: two's compensation first.
    assert [s for s in _steps(fleet, job_id) if s[1]] == [
        ("two", True, "run", "done", 2),
        ("one", True, "run", "done", 2),
    ]


def test_a_failing_compensation_is_retried_reported_and_both_errors_kept(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.saga, {"bad_undo": True}, conn=conn).id
    fleet.start(target=TARGET)

    with pytest.raises(x_jobs.JobFailed):
        client.result(job_id, timeout=60)
    effects = [what for what, _ in _effects(fleet, job_id)]
    assert effects.count("undo two r2") == 3
    assert effects[-1] == "undo one r1"
    error = _job(fleet, job_id)["last_error"]
    assert "step three failed" in error
    assert "compensation of step 'two' failed" in error and "refund service is down" in error
    ((status, step_error),) = fleet.execute(
        "SELECT status::text, error FROM x_jobs.step"
        " WHERE job_id = %s AND name = 'two' AND compensation",
        [job_id],
    )
    assert status == "failed" and "refund service is down" in step_error


@pytest.mark.parametrize("job", [flows.slow_saga, flows.slow_async_saga], ids=["sync", "async"])
def test_a_final_attempt_that_times_out_undoes_its_steps(
    fleet: Fleet, conn: Conn, client: x_jobs.App, job: x_jobs.Job[Any]
) -> None:
    job_id = flows.app.enqueue(job, {}, conn=conn).id
    fleet.start(target=TARGET)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert failed.value.state == "dead"
    assert "timed out after 0.5 s" in (failed.value.error or "")
    # The handler was told to stop (the sync one says so), then its booking was undone, once.
    effects = [what for what, _ in _effects(fleet, job_id)]
    assert effects[0] == "book" and effects[-1] == "unbook b1"
    assert effects[1:-1] == (["stopped: timeout"] if job is flows.slow_saga else [])
    assert [s for s in _steps(fleet, job_id) if s[1]] == [("book", True, "run", "done", 1)]


def test_a_handler_that_stops_past_the_grace_keeps_its_job_and_undoes_its_steps_then(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    deaf = flows.app.enqueue(flows.slow_saga, {"deaf_for": 5.0}, conn=conn).id
    # One handler thread: the next job runs only once the deaf one has returned for good.
    after = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    worker = fleet.start(target=TARGET, concurrency=1, grace=0.5)

    fleet.wait_for(
        lambda: "did not stop within the grace" in worker.log(), "the grace to pass, logged"
    )
    assert fleet.states([deaf]) == {deaf: "running"}, "let go of while its handler ran"
    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(deaf, timeout=60)
    assert failed.value.state == "dead"
    assert "timed out after 0.5 s" in (failed.value.error or "")
    assert client.result(after, timeout=60) is True
    # It stopped at last, 5 s in; the job was still its own, so its booking was undone then.
    assert _effects(fleet, deaf) == [("book", 1), ("stopped: timeout", 1), ("unbook b1", 1)]
    assert [s for s in _steps(fleet, deaf) if s[1]] == [("book", True, "run", "done", 1)]


def test_a_cancelled_saga_is_not_undone_by_the_worker_that_lost_it(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.cancelled_saga, {}, conn=conn).id
    after = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    fleet.start(target=TARGET, concurrency=1)
    wait_for(lambda: _effects(fleet, job_id) == [("book", 1)], "the booking")

    assert conn.execute("SELECT x_jobs.cancel(id => %s)", [job_id]).fetchone() == (True,)
    # One handler thread: the next job runs once the cancelled one has returned for good.
    assert client.result(after, timeout=60) is True
    assert _effects(fleet, job_id) == [("book", 1)]
    assert _job(fleet, job_id)["state"] == "cancelled"
    assert [s for s in _steps(fleet, job_id) if s[1]] == []


def test_progress_is_written_to_the_row(fleet: Fleet, conn: Conn, client: x_jobs.App) -> None:
    job_id = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    fleet.start(target=TARGET)
    assert client.result(job_id, timeout=60) is True
    progress = _job(fleet, job_id)["progress"]
    assert (progress["done"], progress["total"], progress["note"]) == (3, 10, "three of ten")


def test_an_async_workflow_replays_its_step_after_an_event(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.async_flow, {"key": "k"}, conn=conn).id
    fleet.start(target=TARGET)
    fleet.wait_for(lambda: _in_state(fleet, job_id, "suspended"), "the async run to suspend")
    conn.execute("SELECT x_jobs.publish('go', '{\"ok\": true}', 'k')")
    assert client.result(job_id, timeout=60) == {"a": 1, "payload": {"ok": True}}
    assert _effects(fleet, job_id) == [("one", 1), ("after", 1)]


def test_result_times_out_on_a_live_job_and_refuses_an_unknown_one(
    conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    with pytest.raises(x_jobs.ResultTimeout, match=f"job {job_id} is still ready"):
        client.result(job_id, timeout=0.1)
    with pytest.raises(x_jobs.errors.JobNotFound):
        client.result(job_id + 1000, timeout=0.1)


def test_a_step_output_that_is_not_json_fails_the_run_clearly(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    job_id = flows.app.enqueue(flows.bad_step, {}, conn=conn).id
    fleet.start(target=TARGET)
    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert "X_OUTPUT_INVALID: step 'ids' returned a set, which is not JSON" in (
        failed.value.error or ""
    )
    # Nothing was recorded as done: a replay would run the step again.
    assert [s for s in _steps(fleet, job_id) if s[3] == "done"] == []


@pytest.mark.parametrize("kind", ["nan", "nul"])
def test_a_step_output_jsonb_cannot_hold_fails_the_run_clearly(
    fleet: Fleet, conn: Conn, client: x_jobs.App, kind: str
) -> None:
    """NaN and a NUL character pass json.dumps and not jsonb: the record failed after the
    step ran, with a bare database error, and each retry ran the step again."""
    job_id = flows.app.enqueue(flows.unstorable_step, {"kind": kind}, conn=conn).id
    fleet.start(target=TARGET)
    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert "X_OUTPUT_INVALID: step 'measure' returned a" in (failed.value.error or "")
    assert [s for s in _steps(fleet, job_id) if s[3] == "done"] == []


def test_result_waits_the_whole_timeout_before_it_gives_up(conn: Conn, client: x_jobs.App) -> None:
    """It gave up as soon as its next pause would pass the deadline: at 0.62 s of 1 s."""
    job_id = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    started = time.monotonic()
    with pytest.raises(x_jobs.ResultTimeout):
        client.result(job_id, timeout=1.0)
    assert time.monotonic() - started >= 1.0


def test_the_step_store_opens_one_pool_for_threads_that_start_at_once(dsn: str) -> None:
    """Handler threads taking their first steps together each made a pool, all but one
    leaked (connections and threads) for the life of the worker."""
    store = StepStore(dsn, max_size=2)
    barrier = threading.Barrier(8)
    pools: list[object] = []

    def first_step() -> None:
        barrier.wait()
        pools.append(store._connections())

    threads = [threading.Thread(target=first_step) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len({id(pool) for pool in pools}) == 1
    finally:
        for pool in {id(p): p for p in pools}.values():
            pool.close()  # type: ignore[attr-defined]


def test_a_compensation_that_finds_its_job_gone_does_not_stop_the_worker(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    """Recording a compensation raised JobNotHeld (the job was cancelled meanwhile) out of the
    handler thread: the thread died, and with it one slot of the worker for good."""
    job_id = flows.app.enqueue(flows.cancelled_while_undoing, {}, conn=conn).id
    # One handler thread: the next job runs only if that thread lived on.
    after = flows.app.enqueue(flows.reporter, {}, conn=conn).id
    fleet.start(target=TARGET, concurrency=1)

    assert client.result(after, timeout=60) is True
    assert _job(fleet, job_id)["state"] == "cancelled"
    assert _effects(fleet, job_id) == [("book", 1), ("unbook b1", 1)]


def test_a_failure_for_good_whose_undoing_outlasts_the_timeout_is_not_retried(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    """The handler failed for good (PermanentError) with attempts left and compensated past
    the job's timeout: the dispatcher settled a retryable timeout instead, and the retry found
    its booking replayed as done although it had been undone."""
    job_id = flows.app.enqueue(flows.declined_slowly, {}, conn=conn).id
    fleet.start(target=TARGET, grace=5.0)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert failed.value.state == "dead"
    assert "card declined for good" in (failed.value.error or "")
    assert _job(fleet, job_id)["attempt"] == 1
    assert _effects(fleet, job_id) == [("book", 1), ("unbook b1", 1)]


EDGES = "apps.step_edges:app"


ASYNC_IN_SYNC = {
    "step-declared": ("step", True, "TypeError: step 'charge' is an async function"),
    "step-called": ("step", False, "TypeError: step 'charge' returned a coroutine"),
    "undo-declared": (
        "undo",
        True,
        "TypeError: the compensation of step 'charge' is an async function",
    ),
    "undo-called": (
        "undo",
        False,
        "compensation of step 'charge' failed: TypeError: it returned a coroutine",
    ),
}


@pytest.mark.parametrize("case", ASYNC_IN_SYNC)
def test_an_async_function_in_a_sync_handlers_steps_fails_instead_of_passing_undone(
    fleet: Fleet, conn: Conn, client: x_jobs.App, case: str
) -> None:
    """An async compensation given to a sync handler was called, its coroutine dropped unawaited
    (a RuntimeWarning), and the compensation recorded done: nothing was refunded, silently."""
    which, declared, expected = ASYNC_IN_SYNC[case]
    job_id = step_edges.app.enqueue(
        step_edges.async_in_sync, {"which": which, "declared": declared}, conn=conn
    ).id
    worker = fleet.start(target=EDGES)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    error = failed.value.error or ""
    assert expected in error
    assert "a sync handler's" in error and "make the handler async or the function sync" in error
    # An async function given as such is refused before anything runs; one returned by a lambda
    # is closed unrun: never an effect of its body, never a compensation recorded done.
    effects = [what for what, _ in _effects(fleet, job_id)]
    assert effects == (["charge"] if which == "undo" and not declared else [])
    compensations = [s[3] for s in _steps(fleet, job_id) if s[1]]
    assert compensations == (["failed"] if which == "undo" and not declared else [])
    if which == "undo" and not declared:
        assert "out of stock" in error  # the run's own error comes first
    assert "never awaited" not in worker.log()


@pytest.mark.parametrize(
    "job", [step_edges.int_key, step_edges.async_int_key], ids=["sync", "async"]
)
def test_a_wait_on_an_int_key_is_woken_by_a_publish_of_its_text(
    fleet: Fleet, conn: Conn, client: x_jobs.App, job: x_jobs.Job[Any]
) -> None:
    """key=42 went to step_wait as a smallint: UndefinedFunction, and the job failed."""
    job_id = step_edges.app.enqueue(job, {"key": 42}, conn=conn).id
    fleet.start(target=EDGES)
    fleet.wait_for(lambda: _in_state(fleet, job_id, "suspended"), "the run to wait")
    conn.execute("SELECT x_jobs.publish('order.paid', '{\"amount\": 10}', '42')")
    assert client.result(job_id, timeout=60) == {"amount": 10}


class _NoDatabase(StepStore):
    def fetch(self, sql: LiteralString, params: list[Any]) -> list[dict[str, Any]]:
        raise AssertionError("the key reached the database")


@pytest.mark.parametrize(
    ("key", "kind"), [(4.2, "float"), (True, "bool"), (b"42", "bytes")], ids=str
)
def test_an_event_key_that_is_not_a_str_or_an_int_is_refused_before_the_database(
    key: Any, kind: str
) -> None:
    fields: dict[str, Any] = {
        "id": 1,
        "name": "n",
        "queue": "q",
        "attempt": 1,
        "max_attempts": 1,
        "run_id": "r",
        "tenant_id": "t",
        "worker": "w",
        "_store": _NoDatabase("", 1),
    }
    with pytest.raises(TypeError, match=f"an event key is a str or an int, not a {kind}"):
        x_jobs.JobContext(**fields).step.wait_for_event("paid", "order.paid", key=key)
    with pytest.raises(TypeError, match=f"an event key is a str or an int, not a {kind}"):
        asyncio.run(
            x_jobs.AsyncJobContext(**fields).step.wait_for_event("paid", "order.paid", key=key)
        )


def test_a_final_attempt_that_times_out_before_earlier_steps_names_them_in_its_error(
    fleet: Fleet, conn: Conn, client: x_jobs.App
) -> None:
    """As a failure of its own: the timeout of the final attempt, reached before any step, said
    nothing of the steps attempt 1 completed (the worker settled that timeout itself)."""
    job_id = step_edges.app.enqueue(step_edges.unreached_timeout, {}, conn=conn).id
    fleet.start(target=EDGES)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert failed.value.state == "dead"
    assert failed.value.error == (
        "timed out after 0.5 s; steps 'reserve', 'charge' completed on an earlier attempt and"
        " were not reached on the final one: their compensations, if any, did not run"
    )


@pytest.mark.parametrize(
    ("job", "before_any"),
    [
        (step_edges.unreached, True),
        (step_edges.unreached, False),
        (step_edges.async_unreached, True),
    ],
    ids=["sync-before-any-step", "sync-after-one-step", "async-before-any-step"],
)
def test_a_final_attempt_that_fails_before_earlier_steps_names_them_in_its_error(
    fleet: Fleet, conn: Conn, client: x_jobs.App, job: x_jobs.Job[Any], before_any: bool
) -> None:
    """Compensations are registered as the handler reaches its steps: a final attempt that
    failed before a step an earlier one completed never undid it, and the job said nothing."""
    job_id = step_edges.app.enqueue(job, {"before_any": before_any}, conn=conn).id
    fleet.start(target=EDGES)

    with pytest.raises(x_jobs.JobFailed) as failed:
        client.result(job_id, timeout=60)
    assert failed.value.state == "dead"
    error = failed.value.error or ""
    assert error.startswith("ConnectionError: config service down; ")
    undone = [what for what, attempt in _effects(fleet, job_id) if attempt == 2]
    if before_any:
        assert error.endswith(
            "; steps 'reserve', 'charge' completed on an earlier attempt and were not reached on"
            " the final one: their compensations, if any, did not run"
        )
        assert undone == []
    else:
        # 'reserve' was reached again and undone; only 'charge' was left.
        assert error.endswith(
            "; step 'charge' completed on an earlier attempt and was not reached on the final"
            " one: its compensation, if any, did not run"
        )
        assert undone == ["unreserve r1"]
    assert [what for what, attempt in _effects(fleet, job_id) if attempt == 1] == [
        "reserve",
        "charge",
        "ship",
    ]
