"""Tickers in processes of their own, racing over the same schedules: every instant that
x_jobs.cron_next says a schedule fires at is enqueued once, never twice and never missed, and a
ticker killed in the middle of x_jobs.tick_schedules loses and repeats nothing.

Each ticker is a process (multiprocessing, spawned: nothing of the test's process is shared)
with its connection, and walks the test clock (x_jobs.fake_now) as a worker walks the real one.
What fired is read from the jobs themselves: one per (``_schedule.name``, ``_schedule.at``).
"""

from __future__ import annotations

import datetime as dt
import logging
import multiprocessing
import multiprocessing.synchronize
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pytest
from conftest import (
    DEADLINE_SECONDS,
    Conn,
    crash_backend,
    fresh_database,
    needs_pg_ctl,
    wait_for,
)
from psycopg.conninfo import conninfo_to_dict

logger = logging.getLogger(__name__)

SPAWN = multiprocessing.get_context("spawn")

#: The test clock's start: 2026-03-29 00:25 UTC, so that the walk crosses Europe/Berlin's spring
#: forward (01:00 UTC, 02:00 CET -> 03:00 CEST) and a whole hour (01:00 UTC).
START = dt.datetime(2026, 3, 29, 0, 25, tzinfo=dt.UTC)
WALK_MINUTES = 60
TICKERS = 4
MAX_ROWS = 100

TICK = "SELECT schedules, enqueued, skipped FROM x_jobs.tick_schedules(max_rows => %s)"

#: (how many, cron, time zone). 1,000 in all. The Berlin ones meet the spring forward: '30 2'
#: (a time the clock skips: fires at 03:00 CEST once), '*/10 2' (not fixed: no 02:xx that day);
#: Adelaide (+10:30) and Kolkata (+5:30) fire on UTC's half hours.
MIX: list[tuple[int, str, str]] = [
    (250, "* * * * *", "UTC"),
    (200, "*/5 * * * *", "UTC"),
    (120, "0 * * * *", "UTC"),
    (80, "7 1 * * *", "UTC"),
    (40, "30 2 * * *", "Europe/Berlin"),
    (40, "*/10 * * * *", "Europe/Berlin"),
    (20, "*/10 2 * * *", "Europe/Berlin"),
    (25, "0 3 * * *", "Europe/Berlin"),
    (25, "0 * * * *", "Europe/Berlin"),
    (50, "45 20 * * *", "America/New_York"),
    (50, "*/3 * * * *", "America/New_York"),
    (50, "0 * * * *", "Australia/Adelaide"),
    (50, "15,45 * * * *", "Asia/Kolkata"),
]
CATCHUPS = ("latest", "all", "none")

SET_SCHEDULES = """
    SELECT count(*) FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[]) AS s (n, c, z, k),
        LATERAL x_jobs.set_schedule(name => s.n, job => 'tick', cron => s.c, tz => s.z,
            catchup => s.k)
"""
#: Every instant each schedule fires at in (after, until], as cron_next says: at most one a
#: minute, so the walk's minutes (+ 1, to see past its end) are enough instants to ask for.
EXPECTED = """
    SELECT s.name, f.fire_at
    FROM x_jobs.list_schedules() AS s
    CROSS JOIN LATERAL x_jobs.cron_next(s.cron, s.tz, %(after)s, %(count)s) AS f
    WHERE f.fire_at <= %(until)s
"""
FIRED = """
    SELECT input -> '_schedule' ->> 'name', input -> '_schedule' ->> 'at', count(*)
    FROM x_jobs.job GROUP BY 1, 2
"""


def _spec() -> list[tuple[str, str, str, str]]:
    """(name, cron, zone, catchup) of MIX's schedules, the catch-up policies in turn."""
    rows: list[tuple[str, str, str, str]] = []
    for how_many, cron, tz in MIX:
        for _ in range(how_many):
            rows.append((f"s{len(rows):05d}", cron, tz, CATCHUPS[len(rows) % 3]))
    return rows


def _create_schedules(conn: Conn, spec: Sequence[tuple[str, str, str, str]]) -> None:
    conn.execute("SELECT set_config('x_jobs.fake_now', %s, false)", [START.isoformat()])
    columns = [list(column) for column in zip(*spec, strict=True)]
    row = conn.execute(SET_SCHEDULES, columns).fetchone()
    assert row == (len(spec),)
    conn.execute("RESET x_jobs.fake_now")


def _fired(conn: Conn) -> Counter[tuple[str, dt.datetime]]:
    """How many jobs were enqueued for each (schedule, instant)."""
    return Counter(
        {
            (str(name), dt.datetime.fromisoformat(str(at))): int(count)
            for name, at, count in conn.execute(FIRED)
        }
    )


def _expected(conn: Conn, until: dt.datetime) -> set[tuple[str, dt.datetime]]:
    minutes = int((until - START).total_seconds() // 60)
    params = {"after": START, "until": until, "count": minutes + 1}
    return {(str(name), at) for name, at in conn.execute(EXPECTED, params)}


def _assert_each_once(
    fired: Counter[tuple[str, dt.datetime]], expected: set[tuple[str, dt.datetime]]
) -> None:
    twice = sorted(key for key, count in fired.items() if count > 1)
    missing = sorted(expected - set(fired))
    extra = sorted(set(fired) - expected)
    assert (twice[:10], missing[:10], extra[:10]) == ([], [], []), (
        f"{len(twice)} instants fired more than once, {len(missing)} never, "
        f"{len(extra)} that cron_next does not name"
    )


# --- the ticker processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Walk:
    """What every walker of a test does: tick ``minutes`` minutes of the test clock, each at
    START + the minute + a random offset of up to ``offset_seconds`` (0: the minute itself, the
    same instant for every walker), ``max_rows`` a call (0: a random 1..20 each call)."""

    conninfo: str
    minutes: int
    offset_seconds: float
    max_rows: int


def _walker(walk: Walk, seed: int, barrier: multiprocessing.synchronize.Barrier) -> list[int]:
    """Tick minute by minute, each minute after every walker has finished the minute before
    (the barrier); within a minute, call tick_schedules until it answers fewer schedules than
    it was allowed. Answers the sums of (schedules, enqueued, skipped) it was answered.
    The barrier is what makes "every instant" the expectation: a minute that no ticker saw
    would be caught up by each schedule's policy (latest: only the last), as it should be."""
    rng = random.Random(seed)
    totals = [0, 0, 0]
    name = f"ticker-{seed}"
    with psycopg.connect(walk.conninfo, autocommit=True, application_name=name) as conn:
        for minute in range(1, walk.minutes + 1):
            barrier.wait(timeout=DEADLINE_SECONDS)
            offset = rng.uniform(0, walk.offset_seconds)
            at = START + dt.timedelta(minutes=minute, seconds=offset)
            conn.execute("SELECT set_config('x_jobs.fake_now', %s, false)", [at.isoformat()])
            time.sleep(rng.uniform(0, 0.003))
            while True:
                qty = walk.max_rows or rng.randint(1, 20)
                row = conn.execute(TICK, [qty]).fetchone()
                assert row is not None
                schedules, enqueued, skipped = (int(value) for value in row)
                assert schedules <= qty, (schedules, qty)
                totals = [totals[0] + schedules, totals[1] + enqueued, totals[2] + skipped]
                if schedules < qty:
                    break
        barrier.wait(timeout=DEADLINE_SECONDS)
    return totals


def _walker_main(queue: Any, *args: Any) -> None:
    """A spawned process's body: _walker's answer, or its error as text, on ``queue``."""
    try:
        queue.put(("ok", _walker(*args)))
    except BaseException as err:
        queue.put(("error", repr(err)))
        raise


def _run_walkers(walk: Walk, tickers: int) -> list[list[int]]:
    barrier = SPAWN.Barrier(tickers)
    queue = SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_walker_main,
            args=(queue, walk, seed, barrier),
            name=f"ticker-{seed}",
        )
        for seed in range(tickers)
    ]
    for proc in procs:
        proc.start()
    try:
        answers = [queue.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(timeout=DEADLINE_SECONDS)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [detail for status, detail in answers if status != "ok"]
    assert not errors, errors
    assert [proc.exitcode for proc in procs] == [0] * tickers
    return [detail for _, detail in answers]


# --- a. four tickers, a thousand schedules, an hour of test clock ------------------------------


def test_four_tickers_fire_every_instant_of_an_hour_exactly_once(dsn: str, conn: Conn) -> None:
    spec = _spec()
    assert len(spec) == 1000
    _create_schedules(conn, spec)
    until = START + dt.timedelta(minutes=WALK_MINUTES)
    expected = _expected(conn, until)
    # The walk holds what it is meant to: the spring forward fired once at 01:00 UTC, and
    # nothing of Berlin's '*/10 2' that day.
    assert ("s00650", START.replace(hour=1, minute=0)) in expected  # '30 2', Berlin
    assert not [key for key in expected if "s00730" <= key[0] < "s00750"]  # '*/10 2', Berlin

    answers = _run_walkers(Walk(dsn, WALK_MINUTES, 50.0, MAX_ROWS), TICKERS)

    fired = _fired(conn)
    _assert_each_once(fired, expected)
    assert sum(fired.values()) == len(expected) > 15_000
    # What the tickers were answered adds up to what is in the table; no instant was skipped,
    # and the work was shared.
    assert sum(enqueued for _, enqueued, _ in answers) == len(expected)
    assert sum(skipped for _, _, skipped in answers) == 0
    assert sum(1 for _, enqueued, _ in answers if enqueued) > 1, answers
    late = conn.execute(
        "SELECT count(*) FROM x_jobs.job WHERE (input -> '_schedule' ->> 'late')::boolean"
    ).fetchone()
    assert late == (0,)
    # Each schedule counted its fires and stands at its next instant after the walk.
    per_schedule = Counter(name for name, _ in expected)
    for name, fires, skips, next_fire_at in conn.execute(
        "SELECT name, fires, skips, next_fire_at FROM x_jobs.list_schedules()"
    ):
        assert (fires, skips) == (per_schedule[name], 0), name
        assert next_fire_at > until, name


# --- c. two tickers at one instant, over and over ----------------------------------------------


def test_two_tickers_at_the_same_instant_never_fire_a_row_twice(dsn: str, conn: Conn) -> None:
    """Both tickers' clocks read the same instant each round, and each takes 1 to 20 rows a
    call, so that they meet on the same rows over and over: SKIP LOCKED hands each row to one,
    and a row the other one advanced no longer qualifies when it gets to lock it."""
    rounds, schedules = 80, 120
    spec = [(f"r{n:04d}", "* * * * *", "UTC", CATCHUPS[n % 3]) for n in range(schedules)]
    _create_schedules(conn, spec)
    answers = _run_walkers(Walk(dsn, rounds, 0.0, 0), 2)

    fired = _fired(conn)
    _assert_each_once(fired, _expected(conn, START + dt.timedelta(minutes=rounds)))
    assert sum(fired.values()) == rounds * schedules
    assert all(enqueued > 0 for _, enqueued, _ in answers), answers
    assert sum(schedules for schedules, _, _ in answers) == rounds * schedules


# --- b. a ticker killed in the middle of a tick ------------------------------------------------

#: Schedules all due at one instant, and the rows one tick call takes: two calls of 2,500,
#: each long enough (about a second) to be killed in the middle of.
DUE_AT_ONCE = 5000
KILL_ROWS = 2500


@pytest.fixture(scope="module")
def due_template(admin: Conn, template_db: str) -> Iterator[str]:
    """A database with DUE_AT_ONCE schedules that all fire at START + 1 minute (one instant
    each), to clone per test: made once, as set_schedule of 5,000 takes seconds."""
    with fresh_database(admin, template_db, prefix="x_jobs_due") as conninfo:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            crons = ["* * * * *", "*/2 * * * *", "*/13 * * * *", "26 0 * * *", "26 * * * *"]
            spec = [
                (f"d{n:05d}", crons[n % len(crons)], "UTC", CATCHUPS[n % 3])
                for n in range(DUE_AT_ONCE)
            ]
            _create_schedules(conn, spec)
            row = conn.execute(
                "SELECT count(*) FROM x_jobs.list_schedules() WHERE next_fire_at = %s",
                [START + dt.timedelta(minutes=1)],
            ).fetchone()
            assert row == (DUE_AT_ONCE,)
        name = str(conninfo_to_dict(conninfo)["dbname"])
        _drop_connections(admin, name)
        yield name


def _drop_connections(admin: Conn, name: str) -> None:
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", [name]
    )


@pytest.fixture
def due_dsn(admin: Conn, due_template: str) -> Iterator[str]:
    with fresh_database(admin, due_template) as conninfo:
        yield conninfo


def _doomed_ticker(conninfo: str, check_client: bool) -> None:
    """Tick at START + 1 minute + 10 s, KILL_ROWS a call, until fewer are due: the process
    that the test kills. check_client: the server checks every 10 ms whether its client is
    still there (client_connection_check_interval), and so abandons the call of a client that
    died; without it, PostgreSQL runs the statement to its end and commits (a client's death
    is seen only when the answer is sent)."""
    at = START + dt.timedelta(minutes=1, seconds=10)
    with psycopg.connect(conninfo, autocommit=True, application_name="doomed ticker") as conn:
        conn.execute("SELECT set_config('x_jobs.fake_now', %s, false)", [at.isoformat()])
        # Its commits are on disk (the WAL) when they are answered, as they are in production:
        # the test servers commit asynchronously, and a crash of the server would lose them.
        conn.execute("SET synchronous_commit = on")
        if check_client:
            conn.execute("SET client_connection_check_interval = '10ms'")
        while True:
            row = conn.execute(TICK, [KILL_ROWS]).fetchone()
            if row is None or row[0] < KILL_ROWS:
                return


def _enqueued(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM x_jobs.job").fetchone()
    assert row is not None
    return int(row[0])


def _ticking_backend(conn: Conn) -> int | None:
    """The pid of the doomed ticker's backend while its tick_schedules call runs."""
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'doomed ticker'"
        " AND state = 'active' AND query LIKE '%%tick_schedules%%'"
    ).fetchone()
    return None if row is None else int(row[0])


def _backend_gone(conn: Conn, pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return row == (0,)


@pytest.mark.parametrize(
    "how",
    [
        # kill -9 of the ticker's process: its backend sees the client gone within 10 ms and
        # rolls the call back.
        "client process",
        # kill -9 of the ticker's server process (as root, or as the server's owner): the
        # postmaster ends every session and recovers from the WAL; the call never committed.
        "backend process",
        # pg_terminate_backend: SIGTERM to the backend, which aborts the call and exits.
        "pg_terminate_backend",
    ],
)
@needs_pg_ctl
def test_a_ticker_killed_mid_tick_loses_and_repeats_nothing(
    admin: Conn, due_dsn: str, how: str
) -> None:
    conn = psycopg.connect(due_dsn, autocommit=True)
    try:
        doomed: SpawnProcess = SPAWN.Process(
            target=_doomed_ticker, args=(due_dsn, how == "client process"), name="doomed"
        )
        doomed.start()
        try:
            # Its first call committed, and its second is running: the kill lands inside a
            # tick_schedules call, with 2,500 rows locked and their jobs enqueued uncommitted.
            deadline = time.monotonic() + DEADLINE_SECONDS
            pid = None
            while pid is None or _enqueued(conn) < KILL_ROWS:
                assert time.monotonic() < deadline, "the ticker's second call never started"
                assert doomed.is_alive(), "the ticker finished before the test could kill it"
                pid = _ticking_backend(conn)
                time.sleep(0.005)
            time.sleep(0.05)
            assert _ticking_backend(conn) == pid, "the second call ended before the kill"
            if how == "client process":
                doomed.kill()
                wait_for(lambda: _backend_gone(conn, pid), "the backend to see its client gone")
            elif how == "backend process":
                conn.close()
                # crash_backend reads only the victim's backend pid.
                victim = SimpleNamespace(info=SimpleNamespace(backend_pid=pid))
                crash_backend(admin, cast(Conn, victim))
                conn = psycopg.connect(due_dsn, autocommit=True)
            else:
                conn.execute("SELECT pg_terminate_backend(%s)", [pid])
                wait_for(lambda: _backend_gone(conn, pid), "the backend to exit")
        finally:
            doomed.join(timeout=DEADLINE_SECONDS)
            if doomed.is_alive():
                doomed.kill()
                doomed.join()
        # What the killed call did is undone, all of it: the first call's rows stand alone.
        assert _enqueued(conn) == KILL_ROWS
        due = conn.execute(
            "SELECT count(*) FROM x_jobs.list_schedules() WHERE next_fire_at <= %s",
            [START + dt.timedelta(minutes=1)],
        ).fetchone()
        assert due == (DUE_AT_ONCE - KILL_ROWS,)

        # Another ticker finishes: each instant once.
        conn.execute(
            "SELECT set_config('x_jobs.fake_now', %s, false)",
            [(START + dt.timedelta(minutes=1, seconds=20)).isoformat()],
        )
        row = conn.execute(TICK, [10_000]).fetchone()
        assert row == (DUE_AT_ONCE - KILL_ROWS, DUE_AT_ONCE - KILL_ROWS, 0)
        fired = _fired(conn)
        expected = {
            (str(name), START + dt.timedelta(minutes=1))
            for (name,) in conn.execute("SELECT name FROM x_jobs.list_schedules()")
        }
        assert len(expected) == DUE_AT_ONCE
        _assert_each_once(fired, expected)
        assert conn.execute(TICK, [10_000]).fetchone() == (0, 0, 0)
    finally:
        conn.close()
