"""Schedules: ``bench.py --only schedules`` (in ``make bench``'s default set), or this file alone.
Issue 22's two figures:

  tick cost   seconds per x_jobs.tick_schedules(max_rows => 100) call that fires 100 due
              schedules, at 100 schedules in all and at 100,000 (the other 99,900 due months
              to a year ahead), each size in a database of its own; the calls alternate between
              the two, on the test clock (x_jobs.fake_now, one minute further each call, so
              that the same 100 '* * * * *' schedules are due again), in rounds, with the jobs
              deleted and both tables vacuumed between rounds (untimed). Target: the median at
              100,000 within 1.5 times the median at 100 (a tick seeks the due ones by
              next_fire_at; it reads no other row). Beside it, a call with nothing due, at both
              sizes: one probe of the due index
  lateness    LATENESS_SCHEDULES schedules every minute, all due at the same instants, on the
              real clock, ticked by two processes as a worker ticks: each sleeps until the next
              whole minute of x_jobs.now() plus a random 0-100 ms, then calls
              tick_schedules(max_rows => 1000) until it answers fewer. p50 and p99 over every
              fired job of (created_at - the instant it was fired for, its _schedule.at):
              created_at is the enqueueing transaction's start. Target: p99 under 2 s. Beside
              it, when each job was visible to workers: the tick call's return (its commit
              acknowledged) on the ticker's clock, minus the instant

The bench prepares the 99,900 idle schedules as a superuser with SQL on the table (copies of
rows that set_schedule made, each keeping its own next_fire_at): set_schedule one by one would
take a minute for rows that only have to be there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing
import multiprocessing.synchronize
import random
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from bench import percentile, verdict

#: A row of bench.py's table: measure, result, target, met.
Line = tuple[str, str, str, str]
Conn = psycopg.Connection[tuple[Any, ...]]

TICK_RATIO_TARGET = 1.5
LATENESS_P99_TARGET = 2.0
DUE = 100
TICKERS = 2
TICK_ROWS = 1000

#: The test clock of the tick cost: a Monday, far from any daylight-saving change.
CLOCK_START = dt.datetime(2030, 3, 4, 6, 0, tzinfo=dt.UTC)
#: The idle schedules' expressions: each fires once a month or once a year, none within the
#: hours of test clock that a run walks.
IDLE_CRONS = [
    "0 0 1 * *",
    "30 4 15 * *",
    "15 12 28 * *",
    "0 9 1 1 *",
    "45 23 31 12 *",
    "0 6 1 6 *",
    "20 3 10 * *",
    "0 0 1 7 *",
]


@dataclass(frozen=True)
class ScheduleSizes:
    big: int
    rounds: int
    calls_per_round: int
    lateness_schedules: int
    lateness_minutes: int


FULL = ScheduleSizes(
    big=100_000, rounds=10, calls_per_round=100, lateness_schedules=10_000, lateness_minutes=3
)
QUICK = ScheduleSizes(
    big=100_000, rounds=3, calls_per_round=30, lateness_schedules=2_000, lateness_minutes=1
)

SPAWN = multiprocessing.get_context("spawn")


def log(message: str) -> None:
    """Progress on stderr: the part waits for whole minutes of the real clock."""
    print(f"schedules {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


@contextmanager
def own_database(name: str) -> Iterator[str]:
    """A database of this part's own with the extension; its conninfo. Dropped afterwards."""
    ident = sql.Identifier(name)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        with psycopg.connect(dbname=name, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION x_jobs")
        yield f"dbname={name}"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def set_clock(conn: Conn, at: dt.datetime) -> None:
    conn.execute("SELECT set_config('x_jobs.fake_now', %s, false)", [at.isoformat()])


# --- tick cost ---------------------------------------------------------------------------------

MAKE_DUE: LiteralString = """
    SELECT count(*) FROM generate_series(1, %s) AS g,
        LATERAL x_jobs.set_schedule(name => 'due-' || g, job => 'bench_tick', cron => '* * * * *')
"""
MAKE_IDLE_TEMPLATES: LiteralString = """
    SELECT count(*) FROM unnest(%s::text[]) WITH ORDINALITY AS c (cron, n),
        LATERAL x_jobs.set_schedule(name => 'idle-' || c.n, job => 'bench_tick', cron => c.cron)
"""
#: %(rows)s copies of the idle templates, in turn, each with its template's parsed fields and
#: next instant.
COPY_IDLE: LiteralString = """
    INSERT INTO x_jobs.schedule (
        name, job, cron, tz, fields, input, catchup, catchup_max, overlap, grace, paused,
        next_fire_at, declared_by, created_at, updated_at)
    SELECT t.name || '-' || g, t.job, t.cron, t.tz, t.fields, t.input, t.catchup, t.catchup_max,
           t.overlap, t.grace, t.paused, t.next_fire_at, t.declared_by, t.created_at,
           t.updated_at
    FROM generate_series(1, %(rows)s) AS g
    JOIN (
        SELECT s.*, row_number() OVER (ORDER BY s.name) - 1 AS k
        FROM x_jobs.schedule AS s WHERE s.name LIKE 'idle-%%'
    ) AS t ON t.k = g %% %(templates)s
"""
TICK: LiteralString = (
    "SELECT schedules, enqueued, skipped FROM x_jobs.tick_schedules(max_rows => %s)"
)


def prepare_tick(conn: Conn, idle: int) -> None:
    """DUE schedules every minute, first due at CLOCK_START + 1 minute, and ``idle`` more."""
    set_clock(conn, CLOCK_START)
    conn.execute(MAKE_DUE, [DUE])
    if idle:
        conn.execute(MAKE_IDLE_TEMPLATES, [IDLE_CRONS])
        conn.execute(COPY_IDLE, {"rows": idle - len(IDLE_CRONS), "templates": len(IDLE_CRONS)})
    conn.execute("RESET x_jobs.fake_now")
    conn.execute("VACUUM ANALYZE x_jobs.schedule")
    row = conn.execute("SELECT count(*) FROM x_jobs.list_schedules()").fetchone()
    if row != (DUE + idle,):
        raise RuntimeError(f"prepared {row} schedules, not {DUE + idle}")


def tidy(conn: Conn) -> None:
    """Between rounds, untimed: the fired jobs gone, both tables vacuumed."""
    conn.execute("DELETE FROM x_jobs.job")
    conn.execute("VACUUM x_jobs.job, x_jobs.schedule")


def timed_tick(conn: Conn, at: dt.datetime, max_rows: int, expect: int) -> float:
    set_clock(conn, at)
    started = time.perf_counter()
    row = conn.execute(TICK, [max_rows]).fetchone()
    elapsed = time.perf_counter() - started
    if row is None or row[0] != expect or row[1] != expect:
        raise RuntimeError(f"a tick at {at} answered {row}, not {expect} fired")
    return elapsed


@dataclass(frozen=True)
class TickCost:
    small: list[float]
    big: list[float]
    idle_small: list[float]
    idle_big: list[float]


def bench_tick_cost(sizes: ScheduleSizes) -> TickCost:
    cost = TickCost([], [], [], [])
    with ExitStack() as stack:
        small_dsn = stack.enter_context(own_database("x_jobs_bench_sched_small"))
        big_dsn = stack.enter_context(own_database("x_jobs_bench_sched_big"))
        small = stack.enter_context(psycopg.connect(small_dsn, autocommit=True))
        big = stack.enter_context(psycopg.connect(big_dsn, autocommit=True))
        log(f"preparing {DUE} schedules, and {sizes.big:,} beside them")
        prepare_tick(small, 0)
        prepare_tick(big, sizes.big - DUE)
        minute = 0
        for round_ in range(sizes.rounds):
            log(f"tick cost: round {round_ + 1} of {sizes.rounds}")
            for call in range(sizes.calls_per_round + 1):
                minute += 1
                at = CLOCK_START + dt.timedelta(minutes=minute, seconds=1)
                # Which size goes first alternates; the first call of a round warms up after
                # the vacuum and is not counted.
                pair = [(small, cost.small), (big, cost.big)]
                for conn, samples in pair if call % 2 else pair[::-1]:
                    elapsed = timed_tick(conn, at, DUE, DUE)
                    if call:
                        samples.append(elapsed)
                # Nothing is due a second later: one probe of the index.
                later = at + dt.timedelta(seconds=1)
                for conn, samples in ((small, cost.idle_small), (big, cost.idle_big)):
                    elapsed = timed_tick(conn, later, DUE, 0)
                    if call:
                        samples.append(elapsed)
            tidy(small)
            tidy(big)
    return cost


def tick_lines(cost: TickCost, sizes: ScheduleSizes) -> list[Line]:
    def text(samples: list[float]) -> str:
        return (
            f"median {statistics.median(samples) * 1000:.2f} ms, "
            f"p99 {percentile(samples, 0.99) * 1000:.2f} ms"
        )

    ratio = statistics.median(cost.big) / statistics.median(cost.small)
    idle_ratio = statistics.median(cost.idle_big) / statistics.median(cost.idle_small)
    return [
        (f"tick_schedules firing {DUE}, {DUE} schedules", text(cost.small), "", ""),
        (f"tick_schedules firing {DUE}, {sizes.big:,} schedules", text(cost.big), "", ""),
        (
            f"tick firing {DUE}, median ratio {sizes.big:,}/{DUE} schedules",
            f"{ratio:.2f}",
            f"<= {TICK_RATIO_TARGET}",
            verdict(ratio <= TICK_RATIO_TARGET),
        ),
        (f"tick_schedules, nothing due, {DUE} schedules", text(cost.idle_small), "", ""),
        (f"tick_schedules, nothing due, {sizes.big:,} schedules", text(cost.idle_big), "", ""),
        (f"tick, nothing due, median ratio {sizes.big:,}/{DUE}", f"{idle_ratio:.2f}", "", ""),
    ]


# --- lateness ----------------------------------------------------------------------------------

MAKE_EVERY_MINUTE: LiteralString = """
    SELECT count(*), min(s.next_fire_at), max(s.next_fire_at) FROM generate_series(1, %s) AS g,
        LATERAL x_jobs.set_schedule(name => 'minute-' || g, job => 'bench_late',
            cron => '* * * * *') AS s
"""
LATENESS: LiteralString = """
    SELECT extract(epoch FROM j.created_at - (j.input -> '_schedule' ->> 'at')::timestamptz),
           j.input -> '_schedule' ->> 'at'
    FROM x_jobs.job AS j
"""


def ticker(conninfo: str, seed: int, minutes: int, barrier: Any, out: Any) -> None:
    """A ticker process, as a worker ticks: sleep until the next whole minute of the database's
    clock plus a random 0-100 ms, tick TICK_ROWS a call until fewer are due; ``minutes`` times.
    Puts on ``out`` (instant, seconds from it to each call's return, the rows each fired)."""
    rng = random.Random(seed)
    returns: list[tuple[str, float, int]] = []
    try:
        with psycopg.connect(conninfo, autocommit=True, application_name=f"ticker-{seed}") as c:
            barrier.wait(timeout=120)
            for _ in range(minutes):
                row = c.execute("SELECT x_jobs.now()").fetchone()
                assert row is not None
                now: dt.datetime = row[0]
                boundary = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
                time.sleep((boundary - now).total_seconds() + rng.uniform(0, 0.1))
                while True:
                    fired = c.execute(TICK, [TICK_ROWS]).fetchone()
                    returned = dt.datetime.now(dt.UTC)
                    assert fired is not None
                    returns.append(
                        (boundary.isoformat(), (returned - boundary).total_seconds(), fired[1])
                    )
                    if fired[0] < TICK_ROWS:
                        break
        out.put(("ok", returns))
    except BaseException as err:
        out.put(("error", repr(err)))
        raise


@dataclass(frozen=True)
class Lateness:
    created: list[float]
    visible: list[float]
    jobs: int
    per_ticker: list[int]


def bench_lateness(sizes: ScheduleSizes) -> Lateness:
    with own_database("x_jobs_bench_sched_late") as dsn, psycopg.connect(dsn) as conn:
        conn.autocommit = True
        # Not late in a minute: the tickers start before the schedules' first instant.
        while dt.datetime.now(dt.UTC).second >= 45:
            time.sleep(0.5)
        log(f"lateness: {sizes.lateness_schedules:,} schedules every minute")
        made = conn.execute(MAKE_EVERY_MINUTE, [sizes.lateness_schedules]).fetchone()
        if made is None or made[0] != sizes.lateness_schedules or made[1] != made[2]:
            raise RuntimeError(f"made {made}: not every schedule due at the same instant")
        conn.execute("VACUUM ANALYZE x_jobs.schedule")
        barrier = SPAWN.Barrier(TICKERS)
        out = SPAWN.Queue()
        procs = [
            SPAWN.Process(target=ticker, args=(dsn, seed, sizes.lateness_minutes, barrier, out))
            for seed in range(TICKERS)
        ]
        for proc in procs:
            proc.start()
        log(f"lateness: {TICKERS} tickers for {sizes.lateness_minutes} whole minute(s)")
        try:
            answers = [out.get(timeout=60 * (sizes.lateness_minutes + 2)) for _ in procs]
        finally:
            for proc in procs:
                proc.join(timeout=30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        errors = [detail for status, detail in answers if status != "ok"]
        if errors:
            raise RuntimeError(f"a ticker failed: {errors}")
        rows = conn.execute(LATENESS).fetchall()
    instants = {str(at) for _, at in rows}
    expected = sizes.lateness_schedules * len(instants)
    if len(rows) != expected or len(instants) != sizes.lateness_minutes:
        raise RuntimeError(
            f"{len(rows)} jobs for {len(instants)} instants; expected "
            f"{sizes.lateness_schedules:,} at each of {sizes.lateness_minutes}"
        )
    visible = [seconds for _, calls in answers for _, seconds, fired in calls for _ in range(fired)]
    return Lateness(
        created=[float(seconds) for seconds, _ in rows],
        visible=visible,
        jobs=len(rows),
        per_ticker=[sum(fired for _, _, fired in calls) for _, calls in answers],
    )


def lateness_lines(late: Lateness, sizes: ScheduleSizes) -> list[Line]:
    p99 = percentile(late.created, 0.99)
    label = (
        f"lateness, {sizes.lateness_schedules:,} due at once, {TICKERS} tickers, {late.jobs:,} jobs"
    )
    shares = " + ".join(f"{n:,}" for n in late.per_ticker)
    return [
        (
            f"{label}: created_at - instant",
            f"p50 {statistics.median(late.created):.3f} s, p99 {p99:.3f} s, "
            f"max {max(late.created):.3f} s",
            f"p99 < {LATENESS_P99_TARGET:g} s",
            verdict(p99 < LATENESS_P99_TARGET),
        ),
        (
            f"{label}: visible (tick's commit) - instant",
            f"p50 {statistics.median(late.visible):.3f} s, "
            f"p99 {percentile(late.visible, 0.99):.3f} s",
            "",
            "",
        ),
        ("  jobs fired by each ticker", shares, "", ""),
    ]


# --- the part ----------------------------------------------------------------------------------


def bench_schedules(quick: bool) -> list[Line]:
    """bench.py's part ``schedules``: its rows of the table. Prints its settings first."""
    sizes = QUICK if quick else FULL
    print(
        "schedules settings:\n"
        f"  tick cost: {DUE} schedules '* * * * *' due each call, max_rows {DUE}, alone and "
        f"beside {sizes.big - DUE:,} idle ones (monthly/yearly, copies made by SQL), each size "
        f"its own database; {sizes.rounds} rounds of {sizes.calls_per_round} calls per size "
        "(the sizes alternating, the first call of a round not counted), the test clock a "
        "minute on per call, jobs deleted and tables vacuumed between rounds; time = the call's "
        "round trip from this process, autocommit (its commit included)\n"
        f"  lateness: {sizes.lateness_schedules:,} schedules '* * * * *' (set_schedule, one "
        f"statement), {TICKERS} ticker processes, each at the next whole minute of "
        f"x_jobs.now() + uniform 0-100 ms, tick_schedules(max_rows => {TICK_ROWS}) until "
        f"fewer, {sizes.lateness_minutes} minute(s) of the real clock",
        flush=True,
    )
    lines = tick_lines(bench_tick_cost(sizes), sizes)
    lines += lateness_lines(bench_lateness(sizes), sizes)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    lines = bench_schedules(args.quick)
    width = max(len(line[0]) for line in lines)
    for name, value, target, met in lines:
        print(f"{name:<{width}}  {value}  {target} {met}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
