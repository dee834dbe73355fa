"""What declarations cost the enqueue path (0.4.0): the same enqueues against 0.3.9 (literal
defaults, no declarations), 0.4.0 with no job type declared, and 0.4.0 with the job's type
declared (every request filled from it), in alternating rounds on one server.

  scripts/throwaway-pg --durable -- .venv/bin/python bench/enqueue_declared.py [--rounds N]

Three shapes: enqueue_many of 1,000 requests, and 1,000 single enqueue calls in one transaction
(the function's own cost), both timed by the server's clock around the calls, so that the
client's scheduling on a busy machine stays out; and 300 single enqueues each committed on its
own, timed by the client (what a producer sees, mostly the commit's flush on a durable server).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

DATABASES = {
    "0.3.9": "x_jobs_bench_039",
    "0.4.0": "x_jobs_bench_040",
    "0.4.0 declared": "x_jobs_bench_040d",
}
BATCH = 1000
IN_ONE = 1000
COMMITTED = 300


def setup(admin: psycopg.Connection[Any]) -> None:
    for label, name in DATABASES.items():
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        with psycopg.connect(dbname=name, autocommit=True) as conn:
            if label == "0.3.9":
                conn.execute("CREATE EXTENSION x_jobs VERSION '0.3.9'")
            else:
                conn.execute("CREATE EXTENSION x_jobs")
            if label == "0.4.0 declared":
                # The shape of a Python worker's declaration: every field, and 50 other types.
                conn.execute(
                    "SELECT count(*) FROM x_jobs.declare_jobs(%s)",
                    [
                        json.dumps(
                            [
                                {
                                    "name": name,
                                    "queue": "bench",
                                    "max_attempts": 5,
                                    "priority": 0,
                                    "dead_letter": True,
                                    "backoff_base": "1 second",
                                    "backoff_max": "1 hour",
                                    "keep_done": True,
                                    "timeout": "30 seconds",
                                }
                                for name in ["bench", *(f"other{n}" for n in range(50))]
                            ]
                        )
                    ],
                )


#: Seconds the server spent in a statement, by its own clock.
TIMED = """
    CREATE FUNCTION pg_temp.timed(p_many jsonb, p_singles integer) RETURNS double precision
    LANGUAGE plpgsql AS $$
    DECLARE
        v_start timestamptz := clock_timestamp();
    BEGIN
        IF p_many IS NOT NULL THEN
            PERFORM count(*) FROM x_jobs.enqueue_many(p_many);
        END IF;
        FOR i IN 1..p_singles LOOP
            PERFORM x_jobs.enqueue('bench', jsonb_build_object('n', i));
        END LOOP;
        RETURN extract(epoch FROM clock_timestamp() - v_start);
    END
    $$
"""


def timed(conn: psycopg.Connection[Any], many: str | None, singles: int) -> float:
    row = conn.execute("SELECT pg_temp.timed(%s::jsonb, %s)", [many, singles]).fetchone()
    assert row is not None
    return float(row[0])


def many(conn: psycopg.Connection[Any]) -> float:
    payload = json.dumps([{"name": "bench", "input": {"n": n}} for n in range(BATCH)])
    return BATCH / timed(conn, payload, 0)


def singles_in_one(conn: psycopg.Connection[Any]) -> float:
    return IN_ONE / timed(conn, None, IN_ONE)


def singles_committed(conn: psycopg.Connection[Any]) -> float:
    started = time.perf_counter()
    for n in range(COMMITTED):
        conn.execute("SELECT x_jobs.enqueue('bench', jsonb_build_object('n', %s::int))", [n])
    return COMMITTED / (time.perf_counter() - started)


SHAPES: dict[str, Callable[[psycopg.Connection[Any]], float]] = {
    f"enqueue_many of {BATCH:,} (jobs/s)": many,
    f"{IN_ONE:,} enqueue calls in one transaction (calls/s)": singles_in_one,
    f"{COMMITTED} enqueue calls, each committed (calls/s)": singles_committed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        setup(admin)
        rates: dict[tuple[str, str], list[float]] = {}
        conns = {
            label: psycopg.connect(dbname=name, autocommit=True)
            for label, name in DATABASES.items()
        }
        try:
            for conn in conns.values():
                conn.execute(TIMED)
            for conn in conns.values():  # warm the plans and the caches
                for shape in SHAPES.values():
                    shape(conn)
            for _ in range(args.rounds):
                for shape_name, shape in SHAPES.items():
                    for label, conn in conns.items():
                        rates.setdefault((shape_name, label), []).append(shape(conn))
                for conn in conns.values():
                    conn.execute("TRUNCATE x_jobs.job")
        finally:
            for conn in conns.values():
                conn.close()
        for name in DATABASES.values():
            admin.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))
    # On a shared machine the best round is the one least slowed by others: the rates are
    # compared by it (and by the median, for the spread).
    print(f"{args.rounds} rounds, alternating; best, median (range), best as a share of 0.3.9's")
    for shape_name in SHAPES:
        print(shape_name)
        base = max(rates[(shape_name, "0.3.9")])
        for label in DATABASES:
            values = rates[(shape_name, label)]
            best = max(values)
            print(
                f"  {label:<15} {best:>10,.0f}  {statistics.median(values):>10,.0f}"
                f"  ({min(values):,.0f}-{best:,.0f})  {best / base:6.1%}"
            )


if __name__ == "__main__":
    main()
