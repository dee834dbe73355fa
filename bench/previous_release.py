"""The newest version against the previous release, measured in the same run on one server:
``bench.py --only previous`` (in ``make bench``'s default set).

Two databases: ``x_jobs_bench_previous`` holds the previous release (``CREATE EXTENSION x_jobs
VERSION '<previous>'``, through whatever chain of scripts reaches it) and its workers are that
release's own client, materialised from git by tests/python/previous.py; ``x_jobs_bench_newest``
holds a fresh install of the newest version and its workers are this checkout's client. The
measures are bench.py's own, run on each database in turn:

  enqueue_many   jobs/s, batches of 1,000 from one connection (bench_enqueue_many), over
                 300 batches on each side, in turns of 10
  claim latency  median and p99 of one claim call, qty 1 and 10, at a backlog of 100,000 due
                 rows beside 1,000,000 done ones (claim_latency), over 1,200 calls on each
                 side, in turns of 20
  drain          jobs/s of 1 and 2 worker processes draining 100,000 no-op jobs
                 (drain_with_workers), the best of 6 rounds on each side

(The full sizes; each side makes drain_rounds times the calls of bench.py's own part.)

The two sides alternate (previous, newest, newest, previous...): the machine's speed drifts
within minutes, and one measure each would compare two moments, not two versions. Each pair is
printed with the ratio newest/previous (for the latency, the previous median over the newest:
above 1 is faster there too) against RATIO_TARGET (DRAIN_RATIO_TARGET for the drains).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from bench import (
    ROOT,
    Sizes,
    bench_enqueue_many,
    claim_latency,
    drain_with_workers,
    enqueue_backlog,
    fill_done_rows,
    percentile,
    rounds_text,
    verdict,
)

#: No regression beyond the noise: newest/previous at least this. In A/A runs of this harness
#: (one version against itself on a 2-core machine shared with other work, docs/benchmarks.md)
#: the enqueue and the claim medians, taken over turns, came out within 4% of each other: 0.90
#: passes that noise and stops a regression of a tenth.
RATIO_TARGET = 0.90
#: The drain's best rounds spread more: 0.87 to 1.14 in the same A/A run, as other work on the
#: machine comes and goes within a 100,000-job drain. 0.85 passes that; a miss there is a reason
#: to re-run on a quiet machine (where the drains agree within a few percent) before calling it
#: a regression.
DRAIN_RATIO_TARGET = 0.85

#: The enqueue and the claim latency alternate between the two databases every this many
#: batches (of 1,000 jobs: half of them enqueue_many's, half the floor's) or claim calls. A
#: claim's time is mostly its commit's flush, which other work on a shared machine's disk moves
#: by a factor of four within a minute: in rounds of 400 calls each, one side's median came
#: out at 1 ms and the other's at 4 ms from one version. In turns this short both sides see
#: the same moments, and their medians are taken over all their calls.
ENQUEUE_BATCHES_PER_TURN = 20
CLAIMS_PER_TURN = 20
#: Drains of 100,000 jobs cannot be cut finer: each side counts its best of this many times
#: drain_rounds (an even number of rounds, and more than a peer gets in bench.py's drain part:
#: two versions are closer to each other than x_jobs and a peer).
DRAIN_ROUNDS_FACTOR = 2

T = TypeVar("T")

#: A row of bench.py's table: measure, result, target, met.
Line = tuple[str, str, str, str]

PREVIOUS_SCRIPT = ROOT / "tests" / "python" / "previous.py"


@dataclass(frozen=True)
class Side:
    """One of the two compared: a database at a version, and the client its workers run."""

    label: str
    version: str
    dsn: str
    client: Path


@dataclass(frozen=True)
class PreviousClient:
    version: str
    commit: str
    python: Path


def materialise_previous(into: Path) -> PreviousClient:
    """The previous release's client under ``into`` (tests/python/previous.py, run as a script:
    it finds the release in git and checks that a process imports its client)."""
    done = subprocess.run(
        [sys.executable, str(PREVIOUS_SCRIPT), str(into)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench --only previous: {done.stderr.strip()}")
    found = json.loads(done.stdout)
    return PreviousClient(str(found["version"]), str(found["commit"]), Path(found["python"]))


def newest_version(dsn: str) -> str:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT x_jobs.version()").fetchone()
    assert row is not None
    return str(row[0])


@contextmanager
def database(name: str, version: str | None) -> Iterator[str]:
    """A fresh database with the extension at ``version`` (None: the newest); its conninfo.
    Dropped afterwards."""
    ident = sql.Identifier(name)
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(ident))
    try:
        with psycopg.connect(dbname=name, autocommit=True) as conn:
            if version is None:
                conn.execute("CREATE EXTENSION x_jobs")
            else:
                conn.execute(
                    sql.SQL("CREATE EXTENSION x_jobs VERSION {}").format(sql.Literal(version))
                )
        yield make_conninfo(dbname=name)
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))


def enqueue_turn(sizes: Sizes, side: Side) -> tuple[int, float]:
    """Jobs enqueued by enqueue_many on the side's database, and the seconds they took: one
    turn of ``sizes.enqueue_batches`` batches (bench_enqueue_many; its floor's batches, which
    alternate with them, are left out)."""
    jobs = sizes.enqueue_batches // 2 * 1000
    return jobs, jobs / bench_enqueue_many(side.dsn, sizes)[0]


def claim_turn(sizes: Sizes, qty: int, side: Side) -> list[float]:
    """Seconds of each of ``sizes.claims_per_point`` claim calls of ``qty`` (claim_latency)."""
    return claim_latency(side.dsn, sizes, qty)


def drain_rate(sizes: Sizes, workers: int, side: Side) -> float:
    """jobs/s of ``workers`` worker processes of the side's client draining its database."""
    return drain_with_workers(side.dsn, sizes.drain_jobs, workers, client=side.client)


def interleaved(
    sides: tuple[Side, Side], turns: int, measure: Callable[[Side], T]
) -> tuple[list[T], list[T]]:
    """``measure`` of each side, ``turns`` times, alternating: previous, newest, newest,
    previous, previous... Each side goes first as often as second (when ``turns`` is even), so
    neither gains from a place in the order (after the other's run, say) nor from a drift of
    the machine's speed that lasts the whole part."""
    results: tuple[list[T], list[T]] = ([], [])
    for turn in range(turns):
        order = (0, 1) if turn % 2 == 0 else (1, 0)
        for index in order:
            results[index].append(measure(sides[index]))
    return results


def ratio_line(label: str, ratio: float, target: float = RATIO_TARGET) -> Line:
    return (label, f"{ratio:.2f}", f">= {target:.2f}", verdict(ratio >= target))


def enqueue_lines(
    sides: tuple[Side, Side], turns: tuple[list[tuple[int, float]], list[tuple[int, float]]]
) -> list[Line]:
    """Each side's jobs/s over all its turns, and newest/previous."""
    label = "enqueue_many, batches of 1,000"
    rates = [sum(j for j, _ in side) / sum(t for _, t in side) for side in turns]
    lines: list[Line] = [
        (f"{label}: {side.label} {side.version}", f"{rate:,.0f} jobs/s", "", "")
        for side, rate in zip(sides, rates, strict=True)
    ]
    lines.append(ratio_line(f"  {label}: newest / previous", rates[1] / rates[0]))
    return lines


def latency_lines(
    label: str, sides: tuple[Side, Side], turns: tuple[list[list[float]], list[list[float]]]
) -> list[Line]:
    """Each side's median and p99 over all its claims, and previous/newest of the medians."""
    pooled = [[sample for turn in side for sample in turn] for side in turns]
    lines: list[Line] = [
        (
            f"{label}: {side.label} {side.version}",
            f"median {statistics.median(samples) * 1000:.3f} ms, "
            f"p99 {percentile(samples, 0.99) * 1000:.3f} ms",
            "",
            "",
        )
        for side, samples in zip(sides, pooled, strict=True)
    ]
    ratio = statistics.median(pooled[0]) / statistics.median(pooled[1])
    lines.append(ratio_line(f"  {label}: previous / newest median", ratio))
    return lines


def drain_lines(
    label: str, sides: tuple[Side, Side], rounds: tuple[list[float], list[float]]
) -> list[Line]:
    """The two sides' rounds (the best first) and newest/previous of the best rounds."""
    lines: list[Line] = [
        (f"{label}: {side.label} {side.version}", rounds_text(rates, "jobs/s"), "", "")
        for side, rates in zip(sides, rounds, strict=True)
    ]
    ratio = max(rounds[1]) / max(rounds[0])
    lines.append(ratio_line(f"  {label}: newest / previous", ratio, DRAIN_RATIO_TARGET))
    return lines


def compare_with_previous(sizes: Sizes) -> list[Line]:
    """bench.py's part ``previous``: its rows of the table."""
    with (
        tempfile.TemporaryDirectory(prefix="x_jobs_bench_previous.") as into,
        database("x_jobs_bench_newest", None) as new_dsn,
    ):
        client = materialise_previous(Path(into))
        with database("x_jobs_bench_previous", client.version) as old_dsn:
            sides = (
                Side("previous", client.version, old_dsn, client.python),
                Side("newest", newest_version(new_dsn), new_dsn, ROOT / "python"),
            )
            lines: list[Line] = [
                (
                    "previous release",
                    f"{client.version} at {client.commit[:10]}, drained by its own client",
                    "",
                    "",
                ),
            ]
            # Turns of a few calls each, so that both sides see the same moments of the
            # machine; as many calls in all as bench.py's own parts make, drain_rounds times.
            rounds = sizes.drain_rounds
            per_turn = min(ENQUEUE_BATCHES_PER_TURN, sizes.enqueue_batches)
            enqueued = interleaved(
                sides,
                rounds * max(1, sizes.enqueue_batches // per_turn),
                partial(enqueue_turn, replace(sizes, enqueue_batches=per_turn)),
            )
            lines += enqueue_lines(sides, enqueued)

            for side in sides:
                fill_done_rows(side.dsn, sizes.done_rows)
                enqueue_backlog(side.dsn, sizes.big_backlog, "bench")
                with psycopg.connect(side.dsn, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE x_jobs.job")
            per_turn = min(CLAIMS_PER_TURN, sizes.claims_per_point)
            turn_sizes = replace(sizes, claims_per_point=per_turn)
            for qty in (1, 10):
                claimed = interleaved(
                    sides,
                    rounds * max(1, sizes.claims_per_point // per_turn),
                    partial(claim_turn, turn_sizes, qty),
                )
                lines += latency_lines(
                    f"claim qty {qty:>2}, backlog {sizes.big_backlog:,}", sides, claimed
                )

            for workers in (1, 2):
                drained = interleaved(
                    sides, rounds * DRAIN_ROUNDS_FACTOR, partial(drain_rate, sizes, workers)
                )
                label = f"drain, {workers} process(es), {sizes.drain_jobs:,} jobs"
                lines += drain_lines(label, sides, drained)
    return lines
