"""Fair queues: ``bench.py --only fairness`` (in ``make bench``'s default set), or this file alone.
Issue 23's two figures (section "Benchmark"), each queue in a database of its own:

  noisy neighbour  tenant A enqueues NOISY_A jobs (enqueue_many, batches of 1,000), then tenants
                   B..K NOISY_OTHERS each (one enqueue_many call each); then one worker (one
                   connection, autocommit) drains the queue: a loop of x_jobs.claim(queue, qty
                   10, lease 5 minutes), each claim followed by complete_many of what it got,
                   until a claim answers nothing. Once on a fair queue (set_queue_policy(fair =>
                   true) before the enqueues), once on a plain (FIFO) queue loaded alike, one
                   after the other. Reported from the job rows after the drain (read as
                   superuser): p50 and p99 of the wait, started_at - created_at (created_at is
                   the enqueueing transaction's start, started_at the claiming one's), of
                   B..K's jobs and A's p50, on both queues, and each drain's rate (jobs in all /
                   seconds from the first claim to the last complete). Target: B..K's p99 on the
                   fair queue under 2% of their p99 on the FIFO queue
  claim latency    a fair queue with BACKLOG ready rows spread evenly over 1, 100 and 10,000
                   tenants (enqueue_many, batches of 1,000; VACUUM ANALYZE after), and a plain
                   queue with the same backlog (one tenant) as the reference; one connection per
                   database, kept for the whole run (a fair queue's session cursor goes round
                   the tenants as a worker's does). Seconds per x_jobs.claim call, its round trip
                   from this process (autocommit: its commit included), at qty 10 and at qty 1;
                   each claim's rows completed by complete_many after it, untimed, so the
                   backlog shrinks slowly. The sizes alternate claim by claim within rounds
                   (which database goes first rotates), and the job tables are vacuumed between
                   rounds (untimed, as autovacuum would); the first claim of a round after the
                   vacuum is not counted. Target: the median at 100 and at 10,000 tenants within
                   1.5 times the median at 1 tenant, at qty 10 and at qty 1. Beside it, no
                   target: the fair queue's median against the plain queue's

The machines are shared and noisy: every target is a ratio of figures from the same run.
"""

from __future__ import annotations

import argparse
import json
import os
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

WAIT_P99_TARGET = 0.02
CLAIM_RATIO_TARGET = 1.5
QUEUE = "fairbench"
NOISY = "a"
OTHERS = [chr(c) for c in range(ord("b"), ord("k") + 1)]
TENANT_COUNTS = (1, 100, 10_000)
BATCH = 1000


@dataclass(frozen=True)
class FairSizes:
    noisy_a: int
    noisy_others: int
    backlog: int
    rounds: int
    claims_per_round: int


FULL = FairSizes(
    noisy_a=200_000, noisy_others=100, backlog=200_000, rounds=20, claims_per_round=100
)
QUICK = FairSizes(noisy_a=20_000, noisy_others=20, backlog=50_000, rounds=4, claims_per_round=25)


def log(message: str) -> None:
    print(f"fairness {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


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


ENQUEUE_MANY: LiteralString = "SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)"
SET_FAIR: LiteralString = "SELECT x_jobs.set_queue_policy(queue => %s, fair => true)"
CLAIM: LiteralString = """
    SELECT id FROM x_jobs.claim(queues => ARRAY[%s], worker => 'w', lease => '5 minutes',
                                qty => %s)
"""
COMPLETE: LiteralString = "SELECT count(*) FROM x_jobs.complete_many(ids => %s, worker => 'w')"


def enqueue(conn: Conn, tenants: list[str]) -> None:
    """One enqueue_many call of a job per entry of ``tenants``, in that order."""
    payload = json.dumps(
        [{"name": "bench_fair", "queue": QUEUE, "tenant_id": tenant} for tenant in tenants]
    )
    row = conn.execute(ENQUEUE_MANY, [payload]).fetchone()
    if row != (len(tenants),):
        raise RuntimeError(f"enqueue_many answered {row}, not {len(tenants)}")


def claim_ids(conn: Conn, qty: int) -> list[int]:
    return [int(row[0]) for row in conn.execute(CLAIM, [QUEUE, qty]).fetchall()]


def complete(conn: Conn, ids: list[int]) -> None:
    row = conn.execute(COMPLETE, [ids]).fetchone()
    if row != (len(ids),):
        raise RuntimeError(f"complete_many answered {row}, not {len(ids)}")


# --- noisy neighbour ---------------------------------------------------------------------------

WAITS: LiteralString = """
    SELECT j.tenant_id, extract(epoch FROM j.started_at - j.created_at)::float8
    FROM x_jobs.job AS j
    WHERE j.queue = %s AND j.state = 'done'
"""


@dataclass(frozen=True)
class Drain:
    others: list[float]
    noisy: list[float]
    jobs: int
    seconds: float
    #: The machine's 1-minute load average as the drain began and as it ended: the drains run
    #: one after the other, so a neighbour's load during one of them shows here.
    load: tuple[float, float]


def drain_noisy(name: str, fair: bool, sizes: FairSizes) -> Drain:
    with own_database(name) as dsn, psycopg.connect(dsn, autocommit=True) as conn:
        if fair:
            conn.execute(SET_FAIR, [QUEUE])
        log(f"{'fair' if fair else 'plain'}: {NOISY} enqueues {sizes.noisy_a:,}")
        for start in range(0, sizes.noisy_a, BATCH):
            enqueue(conn, [NOISY] * min(BATCH, sizes.noisy_a - start))
        for tenant in OTHERS:
            enqueue(conn, [tenant] * sizes.noisy_others)
        conn.execute("VACUUM ANALYZE x_jobs.job")
        total = sizes.noisy_a + sizes.noisy_others * len(OTHERS)
        log(f"{'fair' if fair else 'plain'}: one worker drains {total:,}")
        done = 0
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        while ids := claim_ids(conn, 10):
            complete(conn, ids)
            done += len(ids)
        seconds = time.perf_counter() - started
        load = (load_before, os.getloadavg()[0])
        if done != total:
            raise RuntimeError(f"drained {done:,} jobs, not {total:,}")
        rows = conn.execute(WAITS, [QUEUE]).fetchall()
    if len(rows) != total:
        raise RuntimeError(f"{len(rows):,} done rows, not {total:,}")
    return Drain(
        others=[float(w) for tenant, w in rows if tenant != NOISY],
        noisy=[float(w) for tenant, w in rows if tenant == NOISY],
        jobs=total,
        seconds=seconds,
        load=load,
    )


def noisy_lines(fair: Drain, plain: Drain, sizes: FairSizes) -> list[Line]:
    def text(samples: list[float]) -> str:
        return f"p50 {statistics.median(samples):.3f} s, p99 {percentile(samples, 0.99):.3f} s"

    others = f"{len(OTHERS)} x {sizes.noisy_others}"
    label = f"noisy neighbour ({sizes.noisy_a:,} of {NOISY.upper()}, then {others})"
    ratio = percentile(fair.others, 0.99) / percentile(plain.others, 0.99)
    fair_rate = fair.jobs / fair.seconds
    plain_rate = plain.jobs / plain.seconds
    return [
        (f"{label}: B..K wait, fair queue", text(fair.others), "", ""),
        (f"{label}: B..K wait, FIFO queue", text(plain.others), "", ""),
        (
            "B..K wait p99, fair / FIFO",
            f"{ratio:.2%}",
            f"< {WAIT_P99_TARGET:.0%}",
            verdict(ratio < WAIT_P99_TARGET),
        ),
        (
            f"{NOISY.upper()} wait p50, fair / FIFO",
            f"{statistics.median(fair.noisy):.3f} / {statistics.median(plain.noisy):.3f} s",
            "",
            "",
        ),
        (
            f"drain, 1 worker, claim 10 + complete_many, {fair.jobs:,} jobs, fair / FIFO",
            f"{fair_rate:,.0f} / {plain_rate:,.0f} jobs/s ({fair_rate / plain_rate:.2f}x; "
            f"{(1 / fair_rate - 1 / plain_rate) * 1e6:+.0f} us a job)",
            "",
            "",
        ),
        (
            "  load average (1 min) at the drain's start - end, fair; FIFO",
            f"{fair.load[0]:.2f} - {fair.load[1]:.2f}; {plain.load[0]:.2f} - {plain.load[1]:.2f}",
            "",
            "",
        ),
    ]


# --- claim latency -----------------------------------------------------------------------------


def preload(conn: Conn, tenants: int, rows: int, fair: bool) -> None:
    """``rows`` ready rows spread evenly over ``tenants`` tenants, their turns interleaved."""
    if fair:
        conn.execute(SET_FAIR, [QUEUE])
    names = [f"t{n:05d}" for n in range(tenants)]
    for start in range(0, rows, BATCH):
        enqueue(conn, [names[n % tenants] for n in range(start, min(rows, start + BATCH))])
    conn.execute("VACUUM ANALYZE x_jobs.job")


@dataclass
class Point:
    label: str
    conn: Conn
    samples: dict[int, list[float]]


def bench_claim_latency(sizes: FairSizes) -> dict[str, dict[int, list[float]]]:
    with ExitStack() as stack:
        points: list[Point] = []
        for tenants, fair in [(n, True) for n in TENANT_COUNTS] + [(1, False)]:
            label = f"fair {tenants}" if fair else "plain"
            dsn = stack.enter_context(own_database(f"x_jobs_bench_fair_{label.replace(' ', '_')}"))
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
            log(f"claim latency: preloading {sizes.backlog:,} rows, {label}")
            preload(conn, tenants, sizes.backlog, fair)
            points.append(Point(label, conn, {1: [], 10: []}))
        for round_ in range(sizes.rounds):
            log(f"claim latency: round {round_ + 1} of {sizes.rounds}")
            for point in points:
                point.conn.execute("VACUUM x_jobs.job")
            order = points[round_ % len(points) :] + points[: round_ % len(points)]
            for qty in (10, 1):
                for call in range(sizes.claims_per_round + 1):
                    for point in order:
                        started = time.perf_counter()
                        ids = claim_ids(point.conn, qty)
                        elapsed = time.perf_counter() - started
                        if len(ids) != qty:
                            raise RuntimeError(f"{point.label}: claimed {len(ids)}, not {qty}")
                        complete(point.conn, ids)
                        if call:
                            point.samples[qty].append(elapsed)
        return {point.label: point.samples for point in points}


def latency_lines(lat: dict[str, dict[int, list[float]]], sizes: FairSizes) -> list[Line]:
    lines: list[Line] = []
    for qty in (10, 1):
        for label, samples in lat.items():
            name = (
                f"fair queue, {int(label.split()[1]):,} tenant(s)"
                if label != "plain"
                else "plain (FIFO) queue, reference"
            )
            lines.append(
                (
                    f"claim qty {qty:>2}, {sizes.backlog:,} ready, {name}",
                    f"median {statistics.median(samples[qty]) * 1000:.2f} ms, "
                    f"p99 {percentile(samples[qty], 0.99) * 1000:.2f} ms",
                    "",
                    "",
                )
            )
        one = statistics.median(lat["fair 1"][qty])
        for tenants in TENANT_COUNTS[1:]:
            ratio = statistics.median(lat[f"fair {tenants}"][qty]) / one
            lines.append(
                (
                    f"claim qty {qty}, median ratio {tenants:,} / 1 tenant",
                    f"{ratio:.2f}",
                    f"<= {CLAIM_RATIO_TARGET}",
                    verdict(ratio <= CLAIM_RATIO_TARGET),
                )
            )
        plain = statistics.median(lat["plain"][qty])
        ratios = " / ".join(
            f"{statistics.median(lat[f'fair {n}'][qty]) / plain:.2f}" for n in TENANT_COUNTS
        )
        counts = " / ".join(f"{n:,}" for n in TENANT_COUNTS)
        lines.append((f"claim qty {qty}, median fair ({counts} tenants) / plain", ratios, "", ""))
    return lines


# --- the part ----------------------------------------------------------------------------------


def bench_fairness(quick: bool) -> list[Line]:
    """bench.py's part ``fairness``: its rows of the table. Prints its settings first."""
    sizes = QUICK if quick else FULL
    print(
        "fairness settings:\n"
        f"  noisy neighbour: {sizes.noisy_a:,} jobs of tenant {NOISY} (enqueue_many of {BATCH:,}),"
        f" then {sizes.noisy_others} each of {', '.join(OTHERS)} (an enqueue_many each), "
        "VACUUM ANALYZE, then one connection claims qty 10 (lease 5 minutes) and "
        "complete_many's them until empty; a fair queue, then a plain one, each its own "
        "database; wait = started_at - created_at of the done rows\n"
        f"  claim latency: {sizes.backlog:,} ready rows over 1, 100, 10,000 tenants (fair) and "
        f"1 (plain), each its own database and connection; {sizes.rounds} rounds of "
        f"{sizes.claims_per_round} timed claims per size at qty 10 then at qty 1 (the sizes "
        "alternating claim by claim, the first of a round not counted, job tables vacuumed "
        "between rounds), each claim's rows completed after it, untimed; time = the claim's "
        "round trip, autocommit",
        flush=True,
    )
    fair = drain_noisy("x_jobs_bench_fair_noisy", True, sizes)
    plain = drain_noisy("x_jobs_bench_fifo_noisy", False, sizes)
    lines = noisy_lines(fair, plain, sizes)
    lines += latency_lines(bench_claim_latency(sizes), sizes)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    lines = bench_fairness(args.quick)
    width = max(len(line[0]) for line in lines)
    for name, value, target, met in lines:
        print(f"{name:<{width}}  {value}  {target} {met}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
