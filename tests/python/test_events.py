"""x_jobs.step_wait and x_jobs.publish at the SQL level: no lost wake-up, and no early one.

A wait checks the published events, then suspends its run; a publish records its event, then
resolves the open waits. Both first take an advisory lock on the event (see "The wait and the
publish, without a lost wake-up" in sql/src/60-steps.sql), so whichever comes second sees what the
first committed. The race below runs them over real connections and checks that every run is woken
exactly once, by its publish or by its own wait; the others check that a publish acts only when (and
if) its transaction commits, only at READ COMMITTED, that a wait times out, and that an operator's
resolve_step and a publish cannot deadlock.

To show that an action sent no notification without sleeping, the producer sends a sentinel
notification after it: notifications reach a listener in commit order (as in test_notify.py).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, Connect, notify_names, wait_for_lock_waiters
from psycopg.types.json import Jsonb

from x_jobs.errors import IsolationUnsupported, translate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """What step_wait answers, and what x_jobs.step holds, of one step."""

    status: str
    output: Any
    event_id: int | None
    error: str | None
    resolved_by: str | None


@dataclass(frozen=True)
class Claimed:
    id: int
    claims: int
    created_at: datetime


WAIT: LiteralString = """
    SELECT status::text, output, event_id, error, resolved_by
    FROM x_jobs.step_wait(
        id => %(id)s, worker => %(worker)s, step => %(step)s, event => %(event)s,
        event_key => %(key)s::text, match => %(match)s::jsonb,
        timeout => %(timeout)s::interval, since => %(since)s::timestamptz
    )
"""

STEP: LiteralString = """
    SELECT status::text, output, event_id, error, resolved_by
    FROM x_jobs.step WHERE job_id = %s AND name = %s AND NOT compensation
"""


def _step_of(row: tuple[Any, ...] | None) -> Step:
    assert row is not None
    status, output, event_id, error, resolved_by = row
    return Step(str(status), output, event_id, error, resolved_by)


def _enqueue(conn: Conn, queue: str = "default") -> int:
    row = conn.execute("SELECT id FROM x_jobs.enqueue('flow', queue => %s)", [queue]).fetchone()
    assert row is not None
    return int(row[0])


def _claim(conn: Conn, worker: str, qty: int = 1, queue: str = "default") -> list[Claimed]:
    rows = conn.execute(
        "SELECT id, claims, created_at FROM x_jobs.claim(ARRAY[%s], %s, '5 minutes', %s)",
        [queue, worker, qty],
    ).fetchall()
    return [Claimed(int(i), int(c), t) for i, c, t in rows]


def _wait(
    conn: Conn,
    job_id: int,
    worker: str,
    event: str,
    *,
    key: str | None = None,
    match: dict[str, Any] | None = None,
    timeout: str | None = None,
    since: datetime | None = None,
    step: str = "wait",
) -> Step:
    params = {
        "id": job_id,
        "worker": worker,
        "step": step,
        "event": event,
        "key": key,
        "match": None if match is None else Jsonb(match),
        "timeout": timeout,
        "since": since,
    }
    return _step_of(conn.execute(WAIT, params).fetchone())


def _publish(conn: Conn, event: str, payload: Any, key: str | None = None) -> tuple[int, int]:
    """Publish; answer the event's id and how many runs it woke."""
    row = conn.execute(
        "SELECT event_id, woken FROM x_jobs.publish(%s, %s, %s::text)",
        [event, Jsonb(payload), key],
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _step(conn: Conn, job_id: int, name: str = "wait") -> Step:
    return _step_of(conn.execute(STEP, [job_id, name]).fetchone())


def _job(conn: Conn, job_id: int) -> tuple[str, str | None]:
    row = conn.execute(
        "SELECT state::text, claimed_by FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert row is not None
    return str(row[0]), row[1]


def _events(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM x_jobs.event").fetchone()
    assert row is not None
    return int(row[0])


def _suspended_job(
    conn: Conn,
    event: str = "go",
    *,
    key: str | None = None,
    match: dict[str, Any] | None = None,
    queue: str = "default",
) -> int:
    """A job whose run waits on ``event`` (suspended, held by nobody)."""
    job_id = _enqueue(conn, queue)
    (claimed,) = _claim(conn, "w1", queue=queue)
    assert claimed.id == job_id
    step = _wait(conn, job_id, "w1", event, key=key, match=match)
    assert step.status == "waiting"
    assert _job(conn, job_id) == ("suspended", None)
    return job_id


# The race ---------------------------------------------------------------------------------

RACE_JOBS = 1_000
RACE_QUEUE = "race"
CLAIMERS = 8
PUBLISHERS = 2
#: Publishes go in a random order within windows of the claim order (by id), and a publisher
#: starts a window once the claims came within LEAD jobs of it, so that a job's publish and its
#: wait often run at the same moment. Over a shuffle of all 1,000 keys, or with publishers that
#: do not keep pace with the claims, the publish of a key mostly came long before or long after
#: its wait: with the wait's lock taken out of step_wait, most runs lost no wake-up. Paced like
#: this, every one of 6 runs lost some (1 to 7 per 1,000 in each variant).
WINDOW = 40
LEAD = 80
RACE_SECONDS = 60.0


@dataclass(frozen=True)
class Race:
    """How the jobs of a race wait: each on a key of its own, or on one keyless event by match."""

    event: str
    keyed: bool

    def key(self, job_id: int) -> str | None:
        return str(job_id) if self.keyed else None

    def match(self, job_id: int) -> dict[str, Any] | None:
        return None if self.keyed else {"job": job_id}


class Front:
    """How many jobs the claimers took so far, for the publishers to keep pace with."""

    def __init__(self) -> None:
        self._claimed = 0
        self._moved = threading.Condition()

    def advance(self, jobs: int) -> None:
        with self._moved:
            self._claimed += jobs
            self._moved.notify_all()

    def reach(self, jobs: int) -> None:
        with self._moved:
            if not self._moved.wait_for(lambda: self._claimed >= jobs, DEADLINE_SECONDS):
                raise TimeoutError(f"the claimers took {self._claimed} jobs, not {jobs}")


@dataclass(frozen=True)
class Course:
    """What the claimers and the publishers of one race share."""

    race: Race
    payloads: dict[int, dict[str, Any]]
    start: threading.Barrier
    front: Front = field(default_factory=Front)
    #: Set once every publish committed.
    published: threading.Event = field(default_factory=threading.Event)


def _claimer(conn: Conn, worker: str, course: Course) -> list[tuple[Claimed, Step]]:
    """Claim, wait on each job's event, complete what the wait finds done; answer every wait.

    A run woken by a publish is claimed again and its wait replayed: that answers the step done.
    Stops once every publish committed and no job is ready or running any more.
    """
    race = course.race
    rng = random.Random(worker)
    answers: list[tuple[Claimed, Step]] = []
    course.start.wait(timeout=DEADLINE_SECONDS)
    deadline = time.monotonic() + RACE_SECONDS
    while time.monotonic() < deadline:
        # Read before the claim: if every publish had committed then, a claim that finds nothing
        # and no ready or running row mean that nothing is left to wake.
        all_published = course.published.is_set()
        claimed = _claim(conn, worker, rng.randint(1, 10), RACE_QUEUE)
        if not claimed:
            busy = conn.execute(
                "SELECT EXISTS (SELECT FROM x_jobs.job WHERE state IN ('ready', 'running'))"
            ).fetchone()
            assert busy is not None
            if all_published and not busy[0]:
                return answers
            time.sleep(0.005)
            continue
        course.front.advance(sum(1 for job in claimed if job.claims == 1))
        for job in claimed:
            step = _wait(
                conn,
                job.id,
                worker,
                race.event,
                key=race.key(job.id),
                match=race.match(job.id),
                # An event may be published before the run reaches its wait: match from the
                # job's creation (what the Python client's since="run" passes).
                since=job.created_at,
            )
            answers.append((job, step))
            if step.status == "done":
                done = conn.execute("SELECT x_jobs.complete(%s, %s)", [job.id, worker])
                assert done.fetchone() == (True,)
    raise TimeoutError(f"{worker} still claiming after {RACE_SECONDS:.0f} s")


def _publisher(
    conn: Conn, windows: list[tuple[int, list[int]]], course: Course
) -> dict[int, tuple[int, int]]:
    """Publish the event of each job, window by window; answer (event id, woken) by job."""
    race = course.race
    course.start.wait(timeout=DEADLINE_SECONDS)
    answers: dict[int, tuple[int, int]] = {}
    for at, jobs in windows:
        course.front.reach(max(0, at - LEAD))
        for job in jobs:
            answers[job] = _publish(conn, race.event, course.payloads[job], race.key(job))
    return answers


def _publish_windows(jobs: list[int], seed: int) -> list[tuple[int, list[int]]]:
    """The jobs in windows of WINDOW by id, each shuffled, with the claims it waits for."""
    rng = random.Random(seed)
    windows: list[tuple[int, list[int]]] = []
    for at in range(0, len(jobs), WINDOW):
        window = jobs[at : at + WINDOW]
        rng.shuffle(window)
        windows.append((at, window))
    return windows


@pytest.mark.parametrize(
    "race",
    [Race("go", keyed=True), Race("go.all", keyed=False)],
    ids=["a-key-per-job", "one-keyless-event-by-match"],
)
def test_racing_waits_and_publishes_wake_every_run_exactly_once(
    conn: Conn, connect: Connect, race: Race
) -> None:
    requests = [{"name": "flow", "queue": RACE_QUEUE} for _ in range(RACE_JOBS)]
    jobs = sorted(
        int(row[0])
        for row in conn.execute(
            "SELECT id FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)]
        ).fetchall()
    )
    payloads = {job: {"job": job, "token": uuid.uuid4().hex} for job in jobs}
    windows = _publish_windows(jobs, seed=RACE_JOBS)

    claimers = [connect(name=f"claimer-{n}") for n in range(CLAIMERS)]
    publishers = [connect(name=f"publisher-{n}") for n in range(PUBLISHERS)]
    course = Course(race, payloads, threading.Barrier(CLAIMERS + PUBLISHERS))
    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=CLAIMERS + PUBLISHERS) as pool:
        claiming = [pool.submit(_claimer, c, f"worker-{n}", course) for n, c in enumerate(claimers)]
        publishing = [
            pool.submit(_publisher, c, windows[n::PUBLISHERS], course)
            for n, c in enumerate(publishers)
        ]
        by_job: dict[int, tuple[int, int]] = {}
        try:
            for future in publishing:
                by_job.update(future.result(timeout=RACE_SECONDS))
        finally:
            # Also when a publisher failed: the claimers then stop once nothing is left to do.
            course.published.set()
        waits = [answer for f in claiming for answer in f.result(timeout=RACE_SECONDS)]
    logger.info("the race took %.1f s", time.monotonic() - began)

    # First of all: no run was left waiting for a publish that already committed.
    lost = conn.execute(
        "SELECT j.id, s.status::text FROM x_jobs.job AS j"
        " LEFT JOIN x_jobs.step AS s ON s.job_id = j.id"
        " WHERE j.state = 'suspended' ORDER BY j.id"
    ).fetchall()
    assert lost == [], f"{len(lost)} runs never woken (lost wake-ups): {lost[:10]}"

    # Each job reached its wait once on its first claim; the wait then either found the event
    # (done: the run goes on) or suspended the run.
    first = {job.id: step for job, step in waits if job.claims == 1}
    assert sorted(first) == jobs
    assert len(first) == sum(1 for job, _ in waits if job.claims == 1)
    found = {job for job, step in first.items() if step.status == "done"}
    suspended = {job for job, step in first.items() if step.status == "waiting"}
    assert found | suspended == set(jobs), {s.status for s in first.values()}

    # A publish woke each suspended run, once: it was claimed exactly once more, and the replayed
    # wait answered the step its publish resolved.
    replays = [(job, step) for job, step in waits if job.claims > 1]
    assert sorted(job.id for job, _ in replays) == sorted(suspended)
    assert all(job.claims == 2 and step.status == "done" for job, step in replays)

    # Every job was woken exactly once: by its publish, or by its own wait finding the event.
    assert len(by_job) == RACE_JOBS
    woken = {job: answer[1] for job, answer in by_job.items()}
    wrong = {job: n for job, n in woken.items() if n != (0 if job in found else 1)}
    assert wrong == {}, f"publishes that woke the wrong number of runs: {wrong}"
    assert sum(woken.values()) + len(found) == RACE_JOBS
    logger.info(
        "%s: %d runs woken by a publish, %d found their event when they reached the wait",
        race.event,
        len(suspended),
        len(found),
    )
    # Both ways happened, so the race ran both orders (a key's publish before its wait and after).
    assert found and suspended, (len(found), len(suspended))

    # Every step was resolved once, by its own event, with that event's payload.
    for job, step in [*first.items(), *((j.id, s) for j, s in replays)]:
        if step.status == "done":
            assert (step.output, step.event_id) == (payloads[job], by_job[job][0]), job
    steps = conn.execute(
        "SELECT job_id, status::text, output, event_id, resolved_by, kind FROM x_jobs.step"
    ).fetchall()
    assert len(steps) == RACE_JOBS
    for job_id, status, output, event_id, resolved_by, kind in steps:
        assert (status, resolved_by, kind) == ("done", "event", "wait"), job_id
        assert (output, event_id) == (payloads[job_id], by_job[job_id][0]), job_id

    # Each event was recorded once, under its key.
    events = conn.execute("SELECT id, name, key FROM x_jobs.event").fetchall()
    assert sorted((int(i), n, k) for i, n, k in events) == sorted(
        (event_id, race.event, race.key(job)) for job, (event_id, _) in by_job.items()
    )

    # No run is left suspended; a suspension gave its attempt back.
    jobs_now = conn.execute("SELECT id, state::text, attempt, claims FROM x_jobs.job").fetchall()
    assert {(state, attempt) for _, state, attempt, _ in jobs_now} == {("done", 1)}
    assert {int(i): c for i, _, _, c in jobs_now} == {job: 1 if job in found else 2 for job in jobs}


def test_a_wait_matches_the_events_since_its_step_was_reached(conn: Conn) -> None:
    first, second = _enqueue(conn), _enqueue(conn)
    claimed = {job.id: job for job in _claim(conn, "w1", qty=2)}
    assert set(claimed) == {first, second}
    early_id, woken = _publish(conn, "go", {"n": 1}, "k")
    assert woken == 0

    # By default a wait takes only the events published once its run reached it...
    assert _wait(conn, first, "w1", "go", key="k").status == "waiting"
    # ...and from an earlier instant when it asks: here the job's creation.
    found = _wait(conn, second, "w1", "go", key="k", since=claimed[second].created_at)
    assert (found.status, found.output, found.event_id) == ("done", {"n": 1}, early_id)
    assert _job(conn, second) == ("running", "w1")

    late_id, woken = _publish(conn, "go", {"n": 2}, "k")
    assert woken == 1
    assert _step(conn, first) == Step("done", {"n": 2}, late_id, None, "event")
    assert _job(conn, first) == ("ready", None)
    # The step the earlier event resolved keeps it.
    assert _step(conn, second).event_id == early_id


# Transactions -----------------------------------------------------------------------------


def test_a_rolled_back_publish_wakes_nobody(conn: Conn) -> None:
    job_id = _suspended_job(conn, key="k")
    with conn.transaction():
        _, woken = _publish(conn, "go", {"paid": True}, "k")
        assert woken == 1
        raise psycopg.Rollback()

    assert _job(conn, job_id) == ("suspended", None)
    assert _step(conn, job_id) == Step("waiting", None, None, None, None)
    assert _events(conn) == 0
    assert _claim(conn, "w2") == []

    # The wait is still open: the next publish resolves it.
    event_id, woken = _publish(conn, "go", {"paid": True}, "k")
    assert woken == 1
    assert _step(conn, job_id) == Step("done", {"paid": True}, event_id, None, "event")
    assert _job(conn, job_id) == ("ready", None)


def test_a_publish_wakes_its_run_only_when_its_transaction_commits(
    conn: Conn, connect: Connect
) -> None:
    job_id = _suspended_job(conn, key="k")
    publisher = connect(name="publisher")
    with publisher.transaction():
        # The publish is one write of a bigger transaction (here: an outbox enqueue beside it).
        publisher.execute("SELECT x_jobs.enqueue('receipt', queue => 'outbox')")
        event_id, woken = _publish(publisher, "go", {"paid": True}, "k")
        assert woken == 1
        assert _job(publisher, job_id) == ("ready", None)

        # Nobody else sees any of it before the commit, and a claim neither gets the run nor
        # waits for the publisher's lock on it.
        assert _job(conn, job_id) == ("suspended", None)
        assert _step(conn, job_id).status == "waiting"
        assert _events(conn) == 0
        assert _claim(conn, "w2") == []

    assert _job(conn, job_id) == ("ready", None)
    assert _step(conn, job_id) == Step("done", {"paid": True}, event_id, None, "event")
    (claimed,) = _claim(conn, "w2")
    assert (claimed.id, claimed.claims) == (job_id, 2)


@pytest.mark.parametrize(
    "level",
    [psycopg.IsolationLevel.REPEATABLE_READ, psycopg.IsolationLevel.SERIALIZABLE],
    ids=["repeatable-read", "serializable"],
)
def test_publish_refuses_a_snapshot_isolation_level(
    conn: Conn, connect: Connect, level: psycopg.IsolationLevel
) -> None:
    job_id = _suspended_job(conn, key="k")
    publisher = connect(name="publisher", autocommit=False)
    publisher.isolation_level = level
    with pytest.raises(psycopg.Error) as caught, publisher.transaction():
        _publish(publisher, "go", {"paid": True}, "k")
    err = caught.value
    assert err.sqlstate == "XJ022"
    assert (err.diag.message_primary or "").startswith("X_ISOLATION_UNSUPPORTED"), str(err)
    assert err.diag.message_hint, "a refusal says what to do"
    typed = translate(err)
    assert isinstance(typed, IsolationUnsupported)
    assert typed.__cause__ is err

    assert _job(conn, job_id) == ("suspended", None)
    assert _events(conn) == 0
    # The same connection publishes at READ COMMITTED.
    publisher.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    with publisher.transaction():
        assert _publish(publisher, "go", {"paid": True}, "k")[1] == 1
    assert _job(conn, job_id) == ("ready", None)


# Timeouts ---------------------------------------------------------------------------------

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _set_clock(conn: Conn, at: datetime) -> None:
    conn.execute("SELECT set_config('x_jobs.fake_now', %s, false)", [at.isoformat()])


def test_a_wait_that_times_out_makes_its_run_claimable_and_fails_its_step(conn: Conn) -> None:
    _set_clock(conn, T0)
    job_id = _enqueue(conn)
    (claimed,) = _claim(conn, "w1")
    assert claimed.id == job_id
    step = _wait(conn, job_id, "w1", "go", key="k", timeout="10 minutes")
    assert step.status == "waiting"
    row = conn.execute(
        "SELECT j.state::text, j.run_at, j.claimed_by, s.timeout_at"
        " FROM x_jobs.job AS j JOIN x_jobs.step AS s ON s.job_id = j.id WHERE j.id = %s",
        [job_id],
    ).fetchone()
    deadline = T0 + timedelta(minutes=10)
    assert row == ("suspended", deadline, None, deadline)

    # Not before the timeout...
    _set_clock(conn, deadline - timedelta(seconds=1))
    assert _claim(conn, "w2") == []
    # ...and at it, the run is due again: a worker claims it and replays its steps.
    _set_clock(conn, deadline)
    (claimed,) = _claim(conn, "w2")
    assert claimed.id == job_id
    rows = conn.execute(
        "SELECT name, status::text, error, resolved_by FROM x_jobs.steps(%s, 'w2')", [job_id]
    ).fetchall()
    assert len(rows) == 1
    name, status, error, resolved_by = rows[0]
    assert (name, status, resolved_by) == ("wait", "failed", "timeout")
    assert str(error).startswith("X_STEP_TIMEOUT"), error

    # A publish after the timeout resolves nothing; the replayed wait answers the failure.
    assert _publish(conn, "go", {"late": True}, "k")[1] == 0
    replay = _wait(conn, job_id, "w2", "go", key="k", timeout="10 minutes")
    assert (replay.status, replay.error, replay.event_id) == ("failed", error, None)
    assert _job(conn, job_id) == ("running", "w2")


# NOTIFY -----------------------------------------------------------------------------------


def _notifications_after(
    listener: Conn, producer: Conn, action: Callable[[], object]
) -> list[tuple[str, int]]:
    """Run ``action``; answer the (queue, pid) of every x_jobs notification it caused."""
    queue = notify_names(producer, "x_jobs", ["mail", "sms"])
    action()
    sentinel = f"sentinel-{uuid.uuid4()}"
    producer.execute("SELECT pg_notify('x_jobs', %s)", [sentinel])
    got: list[tuple[str, int]] = []
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        for note in listener.notifies(timeout=1.0):
            assert note.channel == "x_jobs"
            if note.payload == sentinel:
                return got
            got.append((queue(note.payload), note.pid))
    pytest.fail(f"the sentinel notification never arrived (got {got})")


def test_publish_notifies_the_queues_it_wakes_when_it_commits(conn: Conn, connect: Connect) -> None:
    _suspended_job(conn, key="k", queue="mail")
    # Two runs in two queues wait on one keyless event.
    _suspended_job(conn, "shipped", queue="mail")
    _suspended_job(conn, "shipped", queue="sms")
    listener = connect(name="listener")
    listener.execute("LISTEN x_jobs")
    pid = conn.info.backend_pid

    def publish_and_roll_back() -> None:
        with conn.transaction():
            assert _publish(conn, "go", {}, "k")[1] == 1
            raise psycopg.Rollback()

    assert _notifications_after(listener, conn, publish_and_roll_back) == []
    # A publish that wakes nobody notifies nobody.
    assert _notifications_after(listener, conn, lambda: _publish(conn, "go", {}, "other")) == []
    assert _notifications_after(listener, conn, lambda: _publish(conn, "go", {}, "k")) == [
        ("mail", pid)
    ]
    # One notification per queue woken.
    got = _notifications_after(listener, conn, lambda: _publish(conn, "shipped", {}))
    assert sorted(got) == [("mail", pid), ("sms", pid)]


# Lock order -------------------------------------------------------------------------------


def test_an_operator_and_a_publish_resolving_one_wait_do_not_deadlock(
    conn: Conn, connect: Connect
) -> None:
    """Both lock the step row, then the job row, so they cannot deadlock.

    A third session holding the step row lines the two up: the publish queues for the step
    first, resolve_step behind it. With resolve_step taking the job first (as a draft did), the
    publish would then wait for the job and one of them be aborted with 40P01. Exactly one of
    them resolves the wait, and neither dies.
    """
    job_id = _suspended_job(conn, key="k")
    holder, publisher, operator = (connect(name=n) for n in ("holder", "publisher", "operator"))

    def resolve() -> str:
        row = operator.execute(
            "SELECT status::text FROM x_jobs.resolve_step(%s, 'wait', %s)",
            [job_id, Jsonb({"by": "operator"})],
        ).fetchone()
        assert row is not None
        return str(row[0])

    details: list[str] = []

    def outcome(future: Future[Any]) -> Any:
        try:
            return future.result(timeout=DEADLINE_SECONDS)
        except psycopg.Error as err:
            details.append(
                f"{err.sqlstate}: {err.diag.message_primary} ({err.diag.message_detail})"
            )
            return err.sqlstate

    with ThreadPoolExecutor(max_workers=2) as pool:
        with holder.transaction():
            holder.execute("SELECT FROM x_jobs.step WHERE job_id = %s FOR UPDATE", [job_id])
            publishing = pool.submit(_publish, publisher, "go", {"by": "event"}, "k")
            wait_for_lock_waiters(conn, [publisher.info.backend_pid])
            resolving = pool.submit(resolve)
            wait_for_lock_waiters(conn, [publisher.info.backend_pid, operator.info.backend_pid])
        published, resolved = outcome(publishing), outcome(resolving)

    assert "40P01" not in (published, resolved), (
        f"publish -> {published}, resolve_step -> {resolved}: {details}"
    )
    step = _step(conn, job_id)
    if step.resolved_by == "event":
        # The publish came first; the operator is told that the step no longer waits.
        assert (published, resolved) == ((step.event_id, 1), "XJ032")
    else:
        assert (step.resolved_by, resolved) == ("operator", "done")
        assert isinstance(published, tuple) and published[1] == 0, published
    assert _job(conn, job_id) == ("ready", None)
