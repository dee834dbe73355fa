"""The newest version against the previous release, measured in the same run on one server:
``bench.py --only previous`` (in ``make bench``'s default set).

Two databases: ``x_jobs_bench_previous`` holds the previous release (``CREATE EXTENSION x_jobs
VERSION '<previous>'``, through whatever chain of scripts reaches it) and its workers are that
release's own client, materialised from git by tests/python/previous.py; ``x_jobs_bench_newest``
holds a fresh install of the newest version and its workers are this checkout's client. The
measures are bench.py's own, run on each database in turn:

  enqueue_many   jobs/s, batches of 1,000 from one connection (bench_enqueue_many)
  claim latency  median of one claim call, qty 1 and 10, at a backlog of 100,000 due rows
                 beside 1,000,000 done ones (claim_latency)
  drain          jobs/s of 1 and 2 worker processes draining 100,000 no-op jobs
                 (drain_with_workers)

Rounds interleave the two, previous then newest, and each side counts its best round: the
machine's speed drifts within minutes, and one measure each would compare two moments, not two
versions. Each pair is printed with the ratio newest/previous (for the latency, the previous
median over the newest: above 1 is faster there too) against RATIO_TARGET.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

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
    rounds_text,
    verdict,
)

#: No regression beyond the noise: newest/previous at least this. An A/A run of this harness
#: (the previous release against itself, docs/benchmarks.md) puts the noise of one pair of best
#: rounds on this class of shared machine within about 5% for the enqueue and the drains and
#: within about 10% for a claim's median; 0.90 lets that noise pass and stops a regression of
#: a tenth or more.
RATIO_TARGET = 0.90

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


def enqueue_rate(sizes: Sizes, side: Side) -> float:
    """jobs/s of enqueue_many on the side's database (bench_enqueue_many, without its floor)."""
    return bench_enqueue_many(side.dsn, sizes)[0]


def claim_median(sizes: Sizes, qty: int, side: Side) -> float:
    """Seconds, the median of one claim call of ``qty`` on the side's database."""
    return statistics.median(claim_latency(side.dsn, sizes, qty))


def drain_rate(sizes: Sizes, workers: int, side: Side) -> float:
    """jobs/s of ``workers`` worker processes of the side's client draining its database."""
    return drain_with_workers(side.dsn, sizes.drain_jobs, workers, client=side.client)


def interleaved(
    sides: tuple[Side, Side], rounds: int, measure: Callable[[Side], float]
) -> tuple[list[float], list[float]]:
    """``measure`` of each side, ``rounds`` times, alternating: previous, newest, previous..."""
    results: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for figures, side in zip(results, sides, strict=True):
            figures.append(measure(side))
    return results


def pair_lines(
    label: str, sides: tuple[Side, Side], figures: tuple[list[float], list[float]], unit: str
) -> list[Line]:
    """The two sides' rounds (the best first) and newest/previous of the best rounds."""
    lines: list[Line] = [
        (f"{label}: {side.label} {side.version}", rounds_text(rates, unit), "", "")
        for side, rates in zip(sides, figures, strict=True)
    ]
    ratio = max(figures[1]) / max(figures[0])
    lines.append(
        (
            f"  {label}: newest / previous",
            f"{ratio:.2f}",
            f">= {RATIO_TARGET:.2f}",
            verdict(ratio >= RATIO_TARGET),
        )
    )
    return lines


def latency_lines(
    label: str, sides: tuple[Side, Side], medians: tuple[list[float], list[float]]
) -> list[Line]:
    """The two sides' median claim times (the best round first) and previous/newest."""
    lines: list[Line] = []
    for side, rounds in zip(sides, medians, strict=True):
        rest = ", ".join(f"{m * 1000:.3f}" for m in rounds)
        lines.append(
            (
                f"{label}: {side.label} {side.version}",
                f"median {min(rounds) * 1000:.3f} ms (best of {rest})",
                "",
                "",
            )
        )
    ratio = min(medians[0]) / min(medians[1])
    lines.append(
        (
            f"  {label}: previous / newest median",
            f"{ratio:.2f}",
            f">= {RATIO_TARGET:.2f}",
            verdict(ratio >= RATIO_TARGET),
        )
    )
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
            rounds = sizes.drain_rounds

            enqueued = interleaved(sides, rounds, partial(enqueue_rate, sizes))
            lines += pair_lines("enqueue_many, batches of 1,000", sides, enqueued, "jobs/s")

            for side in sides:
                fill_done_rows(side.dsn, sizes.done_rows)
                enqueue_backlog(side.dsn, sizes.big_backlog, "bench")
                with psycopg.connect(side.dsn, autocommit=True) as conn:
                    conn.execute("VACUUM ANALYZE x_jobs.job")
            for qty in (1, 10):
                medians = interleaved(sides, rounds, partial(claim_median, sizes, qty))
                lines += latency_lines(
                    f"claim qty {qty:>2}, backlog {sizes.big_backlog:,}", sides, medians
                )

            for workers in (1, 2):
                drained = interleaved(sides, rounds, partial(drain_rate, sizes, workers))
                label = f"drain, {workers} process(es), {sizes.drain_jobs:,} jobs"
                lines += pair_lines(label, sides, drained, "jobs/s")
    return lines
