"""What psycopg's automatic prepared statements save the worker: a claim and a complete_many
call, timed on a connection that prepares them (psycopg's default, prepare_threshold 5) and on
one that never does (prepare_threshold None, what the client uses since it must work behind
PgBouncer in transaction mode).

Run it on a durable throwaway server (the figures in docs/benchmarks.md come from this):

    PYTHONPATH=python scripts/throwaway-pg --durable -- .venv/bin/python bench/prepared.py

Each round takes both connections in turn (the order alternating), and on each one claims
``qty`` no-op jobs and completes them in one complete_many call, ``calls`` times; a round's
figure is the median of its calls. Two ways: each call committing on its own (autocommit, as the
worker sends them: the commit's flush is most of a call's time on a durable server), and both
calls in a transaction rolled back (what parsing and planning cost, without the flush). It
prints the range of the round medians (their median in brackets) for each way, call, qty and
connection, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

from x_jobs.worker import CLAIM, COMPLETE_MANY, _ids


def _time_round(
    conn: psycopg.Connection[Any], qty: int, calls: int, worker: str, *, rollback: bool = False
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Seconds of a claim and of a complete_many, over ``calls`` of each: (median, 10th
    percentile) of each (the low percentile is what the call costs when the machine's other
    work leaves it alone)."""
    claims: list[float] = []
    completes: list[float] = []
    for _ in range(calls):
        with conn.transaction(force_rollback=True) if rollback else contextlib.nullcontext():
            start = time.perf_counter()
            rows = conn.execute(CLAIM, [["bench"], worker, "30 seconds", qty]).fetchall()
            middle = time.perf_counter()
            conn.execute(COMPLETE_MANY, [_ids(r[0] for r in rows), worker, None]).fetchall()
            end = time.perf_counter()
        assert len(rows) == qty, "the backlog ran out: enqueue more"
        claims.append(middle - start)
        completes.append(end - middle)
    return _low_and_median(claims), _low_and_median(completes)


def _low_and_median(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), statistics.quantiles(values, n=10)[0]


WAYS = ("committed", "rolled back")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--qty", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    args = parser.parse_args()

    name = f"x_jobs_prepared_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        with (
            psycopg.connect(dbname=name, autocommit=True) as setup,
            psycopg.connect(dbname=name, autocommit=True) as prepared,
            psycopg.connect(dbname=name, autocommit=True, prepare_threshold=None) as unprepared,
        ):
            setup.execute("CREATE EXTENSION x_jobs")
            need = args.rounds * args.calls * sum(args.qty) * 2 + 2000
            for _ in range(0, need, 10_000):
                setup.execute(
                    "SELECT count(*) FROM x_jobs.enqueue_many(jobs => (SELECT jsonb_agg("
                    "jsonb_build_object('name', 'noop', 'queue', 'bench', 'keep_done', false))"
                    " FROM generate_series(1, 10000)))"
                )
            setup.execute("VACUUM ANALYZE x_jobs.job")
            conns = {"prepared": prepared, "unprepared": unprepared}
            # Warm up both (the prepared one past psycopg's threshold of 5).
            for conn in conns.values():
                for qty in args.qty:
                    _time_round(conn, qty, 10, "warm")
            # psycopg did prepare them on the one, and not on the other.
            for conn, at_least in ((prepared, 2), (unprepared, 0)):
                row = conn.execute("SELECT count(*) FROM pg_catalog.pg_prepared_statements")
                count = row.fetchone()
                assert count is not None and count[0] >= at_least and (at_least or not count[0])
            figures: dict[tuple[str, str, int, str], list[tuple[float, float]]] = {}
            for n in range(args.rounds):
                order = list(conns) if n % 2 == 0 else list(reversed(conns))
                for way in args.ways:
                    for qty in args.qty:
                        for label in order:
                            claim, complete = _time_round(
                                conns[label], qty, args.calls, label, rollback=way == "rolled back"
                            )
                            figures.setdefault((way, label, qty, "claim"), []).append(claim)
                            figures.setdefault((way, label, qty, "complete_many"), []).append(
                                complete
                            )
    finally:
        with psycopg.connect(autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    print(
        f"{args.rounds} rounds of {args.calls} calls; ms per call, the median over the rounds of"
        " each round's median, and of its 10th percentile in brackets"
    )
    print("| way | call | qty | prepared | unprepared | unprepared - prepared |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in args.ways:
        for qty in args.qty:
            for call in ("claim", "complete_many"):
                got = {}
                for label in ("prepared", "unprepared"):
                    rounds = figures[way, label, qty, call]
                    got[label] = (
                        statistics.median(r[0] for r in rounds) * 1000,
                        statistics.median(r[1] for r in rounds) * 1000,
                    )
                cells = [f"{m:.3f} ({low:.3f})" for m, low in got.values()]
                diff = [got["unprepared"][i] - got["prepared"][i] for i in (0, 1)]
                print(
                    f"| {way} | {call} | {qty} | {cells[0]} | {cells[1]} |"
                    f" {diff[0]:+.3f} ({diff[1]:+.3f}) |"
                )


if __name__ == "__main__":
    main()
