"""x_jobs beside graphile-worker in one run: ``bench.py --only versus`` (in ``make bench``'s
default set). Issue 21's steady-state figures, each with its ratio:

  drains         jobs/s of no-op drains, x_jobs at bench.WORKER_ARGS (jobs kept: the default
                 keep_done) against graphile-worker's performance preset (run_graphile.mjs;
                 completed jobs deleted), 1 and 2 processes at both sizes and 4 at the small
                 one; beside each, the CPU time per job of the server's processes (the
                 postmaster and its children, bench/server_cpu.py) and of the worker processes
                 (utime + stime from /proc/PID/stat), both sampled at the drain's clock start
                 and stop: for x_jobs through drain_with_workers' on_clock, for graphile-worker
                 through run_graphile.mjs --clock-marks, which stops at the same two moments
  defaults       x_jobs with no tuning flag (`x-jobs worker apps.noop:app`) against the tuned
                 worker, 1 process, the small size
  wake latency   enqueue commit -> handler start of single jobs enqueued one at a time at a
                 steady 50/s and 500/s into an idle worker, x_jobs at its defaults against
                 graphile-worker at its defaults and with concurrentJobs 10: p50, p99 and the
                 worst sample

The drains of the small size run in interleaved rounds (which side goes first alternates) and
each side counts its best round: the best jobs/s and, separately, the least CPU per job. The big
size runs fewer rounds (VersusSizes.big_rounds, said in the table): a round of it takes minutes.

The wake latency's origin is the moment the enqueue call came back to the enqueuing client (its
commit acknowledged), on CLOCK_MONOTONIC; the handler reads the same clock first thing
(bench/apps/stamp.py, and the task of bench/peers/wake_graphile.mjs). One client enqueues for
every side with each one's SQL function (x_jobs.enqueue, graphile_worker.add_job), each call its
own transaction, from ENQUEUE_THREADS connections that take turns on one schedule, so that a
slow commit does not hold up the next job. graphile-worker runs twice, at its defaults and with
concurrentJobs 10 (x_jobs' default concurrency): at its default of 1 it cannot keep up with
500/s here, and its latency there is a queue's. All the workers run throughout, idle but for
their turns, and the sides take turns of a tenth of the jobs (WAKE_TURNS): the machine's speed
drifts within a minute, and one stretch each would compare moments.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import LiteralString

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from server_cpu import ServerCpu, backend_seconds, processes_seconds

from bench import ROOT, WORKER_ARGS, drain_with_workers, percentile, rounds_text, verdict

#: A row of bench.py's table: measure, result, target, met.
Line = tuple[str, str, str, str]

GRAPHILE_DRAIN = ROOT / "bench" / "peers" / "run_graphile.mjs"
GRAPHILE_WAKE = ROOT / "bench" / "peers" / "wake_graphile.mjs"

#: Issue 21's targets: x_jobs' server CPU per job at most this share of graphile-worker's, its
#: drain at least this multiple of graphile-worker's (1 and 2 processes), the worker at its
#: defaults at least this share of the tuned one.
CPU_RATIO_TARGET = 0.8
DRAIN_RATIO_TARGET = 1.5
DEFAULTS_RATIO_TARGET = 0.8

#: The wake test's enqueuing connections per side, taking turns on one schedule: at 500 jobs/s
#: an enqueue may take up to 32 ms (a durable commit on a busy disk) before the next is late.
ENQUEUE_THREADS = 16
#: Jobs run first on every side, not counted: a worker's first job pays for its connections'
#: first statements (and graphile-worker's prepared ones).
WAKE_WARMUP = 20
#: Each side's jobs come in this many turns, the sides alternating, after a pause with nothing
#: queued anywhere: every worker is idle when its turn starts.
WAKE_TURNS = 10
WAKE_IDLE_SECONDS = 0.5


@dataclass(frozen=True)
class VersusSizes:
    small: int
    big: int
    small_rounds: int
    big_rounds: int
    wake_jobs: int
    wake_rates: tuple[int, ...] = (50, 500)


FULL = VersusSizes(small=100_000, big=1_000_000, small_rounds=3, big_rounds=1, wake_jobs=2_000)
QUICK = VersusSizes(small=10_000, big=50_000, small_rounds=2, big_rounds=1, wake_jobs=300)


def log(message: str) -> None:
    """Progress on stderr: the part runs for minutes before the table is printed."""
    print(f"versus {time.strftime('%H:%M:%S')}: {message}", file=sys.stderr, flush=True)


# --- CPU time at the clock's ends --------------------------------------------------------------


@dataclass(frozen=True)
class Drain:
    jobs: int
    rate: float
    #: CPU microseconds per job: of the server's processes but the poll's backend, of the
    #: worker processes, and of the poll's backend.
    server_us: float
    workers_us: float
    poll_us: float


class ClockSamples:
    """The on_clock of a drain: CPU times at its start and stop. The backend of the bench's
    poll for an empty backlog is counted apart: its query differs between the two (x_jobs reads
    its counters, graphile-worker's runner counts the rows of a table that shrinks from the
    backlog's size), and it measures the drain, it is not part of it."""

    def __init__(self, server: ServerCpu) -> None:
        self.server = server
        self.samples: dict[str, tuple[float, float, float]] = {}

    def __call__(self, moment: str, pids: list[int], poller: int) -> None:
        self.samples[moment] = (
            self.server.seconds(excluding=frozenset({poller})),
            processes_seconds(pids),
            backend_seconds(poller),
        )

    def drain(self, jobs: int, rate: float) -> Drain:
        start, stop = self.samples["start"], self.samples["stop"]
        server, workers, poll = ((b - a) / jobs * 1e6 for a, b in zip(start, stop, strict=True))
        return Drain(jobs, rate, server, workers, poll)


def x_jobs_drain(
    dsn: str, server: ServerCpu, jobs: int, workers: int, args: list[str] = WORKER_ARGS
) -> Drain:
    clock = ClockSamples(server)
    rate = drain_with_workers(dsn, jobs, workers, worker_args=args, on_clock=clock)
    return clock.drain(jobs, rate)


def graphile_drain(server: ServerCpu, jobs: int, workers: int) -> tuple[Drain, str]:
    """run_graphile.mjs --clock-marks: its drain and its settings."""
    clock = ClockSamples(server)
    result: dict[str, object] | None = None
    proc = subprocess.Popen(
        ["node", str(GRAPHILE_DRAIN), "--clock-marks", str(jobs), str(workers)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        for line in proc.stdout:
            message = json.loads(line) if line.startswith("{") else None
            if not isinstance(message, dict):
                sys.stderr.write(line)
            elif "clock" in message:
                clock(
                    str(message["clock"]),
                    [int(pid) for pid in message["pids"]],
                    int(message["poller"]),
                )
                proc.stdin.write("sampled\n")
                proc.stdin.flush()
            else:
                result = message
    finally:
        proc.stdin.close()
        proc.wait()
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"run_graphile.mjs {jobs} {workers} failed ({proc.returncode})")
    return clock.drain(jobs, float(str(result["jobs_per_s"]))), str(result["settings"])


@dataclass
class Rounds:
    """One configuration's drains, a round each."""

    drains: list[Drain]

    @property
    def rate(self) -> float:
        return max(d.rate for d in self.drains)

    @property
    def server_us(self) -> float:
        return min(d.server_us for d in self.drains)

    @property
    def workers_us(self) -> float:
        return min(d.workers_us for d in self.drains)

    @property
    def poll_us(self) -> float:
        return min(d.poll_us for d in self.drains)

    def rates_text(self) -> str:
        return rounds_text([d.rate for d in self.drains], "jobs/s")


def us_list(values: list[float]) -> str:
    return ", ".join(f"{v:.1f}" for v in values)


# --- the drains --------------------------------------------------------------------------------


def bench_drains(
    dsn: str, sizes: VersusSizes, server: ServerCpu, settings: dict[str, str]
) -> list[Line]:
    lines: list[Line] = []
    # (jobs, workers) -> side -> rounds; side "defaults" is x_jobs with no tuning flag.
    found: dict[tuple[int, int], dict[str, Rounds]] = {}

    def run(jobs: int, workers: int, side: str) -> None:
        log(f"{side}, {workers} process(es), {jobs:,} jobs")
        if side == "graphile-worker":
            drain, settings[side] = graphile_drain(server, jobs, workers)
        else:
            drain = x_jobs_drain(
                dsn, server, jobs, workers, [] if side == "defaults" else WORKER_ARGS
            )
        found.setdefault((jobs, workers), {}).setdefault(side, Rounds([])).drains.append(drain)

    for round_ in range(sizes.small_rounds):
        # Which side goes first alternates, so that neither always drains on the heels of the
        # other's clean-up (graphile-worker's database drop, x_jobs' TRUNCATE).
        order = ["x_jobs", "graphile-worker"]
        if round_ % 2:
            order.reverse()
        for workers in (1, 2, 4):
            for side in order:
                run(sizes.small, workers, side)
            if workers == 1:
                run(sizes.small, 1, "defaults")
    for round_ in range(sizes.big_rounds):
        for n, workers in enumerate((1, 2)):
            order = ["x_jobs", "graphile-worker"]
            if (round_ + n) % 2:
                order.reverse()
            for side in order:
                run(sizes.big, workers, side)

    for (jobs, workers), sides in found.items():
        ours, theirs = sides["x_jobs"], sides["graphile-worker"]
        rounds = len(ours.drains)
        targeted = workers in (1, 2)
        lines.append(
            (
                f"versus: x_jobs tuned, {workers} process(es), {jobs:,} jobs, "
                f"{rounds} round{'s' if rounds > 1 else ''}",
                ours.rates_text(),
                "",
                "",
            )
        )
        ratio = ours.rate / theirs.rate
        lines.append(
            (
                f"  graphile-worker preset, {workers} process(es), {jobs:,} jobs",
                theirs.rates_text(),
                f"x_jobs {ratio:.2f}x"
                + (f", >= {DRAIN_RATIO_TARGET}x" if targeted else " (scale-out, no target)"),
                verdict(ratio >= DRAIN_RATIO_TARGET) if targeted else "",
            )
        )
        cpu_ratio = ours.server_us / theirs.server_us
        lines.append(
            (
                "  server CPU per job, x_jobs / graphile-worker",
                f"{ours.server_us:.1f} / {theirs.server_us:.1f} us "
                f"(rounds {us_list([d.server_us for d in ours.drains])} / "
                f"{us_list([d.server_us for d in theirs.drains])})",
                f"{cpu_ratio:.2f}x"
                + (f", <= {CPU_RATIO_TARGET}x" if targeted else " (scale-out, no target)"),
                verdict(cpu_ratio <= CPU_RATIO_TARGET) if targeted else "",
            )
        )
        lines.append(
            (
                "  the poll's backend, CPU per job (not counted above)",
                f"{ours.poll_us:.1f} / {theirs.poll_us:.1f} us",
                "",
                "",
            )
        )
        lines.append(
            (
                "  workers' CPU per job, x_jobs / graphile-worker",
                f"{ours.workers_us:.1f} / {theirs.workers_us:.1f} us",
                f"{ours.workers_us / theirs.workers_us:.2f}x",
                "",
            )
        )
        if "defaults" in sides:
            defaults = sides["defaults"]
            share = defaults.rate / ours.rate
            lines.append(
                (
                    f"  x_jobs at its defaults (no flags), 1 process, {jobs:,} jobs",
                    defaults.rates_text(),
                    f"{share:.2f}x tuned, >= {DEFAULTS_RATIO_TARGET}x",
                    verdict(share >= DEFAULTS_RATIO_TARGET),
                )
            )
            lines.append(
                (
                    "  CPU per job, x_jobs defaults / tuned",
                    f"server {defaults.server_us:.1f} / {ours.server_us:.1f} us, "
                    f"workers {defaults.workers_us:.1f} / {ours.workers_us:.1f} us",
                    f"server {defaults.server_us / ours.server_us:.2f}x",
                    "",
                )
            )
    # Scale-out at the small size: each side's best rate and CPU per job by process count.
    for side in ("x_jobs", "graphile-worker"):
        by_workers = [found[(sizes.small, workers)][side] for workers in (1, 2, 4)]
        lines.append(
            (
                f"versus: scale-out, {side}, 1 / 2 / 4 processes, {sizes.small:,} jobs",
                " / ".join(f"{r.rate:,.0f}" for r in by_workers) + " jobs/s",
                "",
                "",
            )
        )
        lines.append(
            (
                "  CPU per job, server; workers",
                " / ".join(f"{r.server_us:.1f}" for r in by_workers)
                + " us; "
                + " / ".join(f"{r.workers_us:.1f}" for r in by_workers)
                + " us",
                "",
                "",
            )
        )
    return lines


# --- wake latency ------------------------------------------------------------------------------


#: The wake latency's sides: x_jobs at its defaults; graphile-worker at its defaults
#: (concurrentJobs 1, which runs one job at a time), and with concurrentJobs 10 (x_jobs' default
#: concurrency), the one tuning that differs; each label with its concurrentJobs.
WAKE_SIDES: dict[str, int | None] = {
    "x_jobs": None,
    "graphile-worker": None,
    "graphile-worker concurrentJobs 10": 10,
}
X_JOBS_ENQUEUE: LiteralString = (
    "SELECT x_jobs.enqueue(name => 'stamp', queue => 'bench',"
    " input => jsonb_build_object('n', %s::int))"
)
GRAPHILE_ADD_JOB: LiteralString = (
    "SELECT graphile_worker.add_job('stamp', json_build_object('n', %s::int))"
)


def read_stamps(path: Path, numbers: range, timeout: float = 60.0) -> dict[int, float]:
    """The handlers' start moments of `numbers`, waiting until every one is written."""
    deadline = time.monotonic() + timeout
    while True:
        stamps: dict[int, float] = {}
        for line in path.read_text().splitlines():
            n, at = line.split()
            stamps[int(n)] = float(at)
        if all(n in stamps for n in numbers):
            return stamps
        if time.monotonic() > deadline:
            missing = sum(n not in stamps for n in numbers)
            raise RuntimeError(f"{missing} of {len(numbers)} jobs never started ({path})")
        time.sleep(0.05)


class WakeSide:
    """One system under the wake test: its enqueuing connections and its worker's stamps."""

    def __init__(
        self, label: str, conninfo: str, statement: LiteralString, stamps: Path, stack: ExitStack
    ) -> None:
        self.label = label
        self.statement = statement
        self.stamps = stamps
        self.conns = [
            stack.enter_context(psycopg.connect(conninfo, autocommit=True))
            for _ in range(ENQUEUE_THREADS)
        ]
        self.latencies: list[float] = []
        #: How late each enqueue went out against its schedule: whether the rate held.
        self.late: list[float] = []

    def turn(self, rate: float, numbers: range) -> None:
        """Enqueue job n of `numbers` at start + (n - first) / rate, each its own transaction,
        from the connections in turns (the schedule holds while a call takes less than
        ENQUEUE_THREADS / rate); then wait for every handler and note the latencies: handler
        start - the moment the call came back, both on CLOCK_MONOTONIC."""
        acked: dict[int, float] = {}
        late: list[float] = []
        errors: list[BaseException] = []
        first = numbers[0]
        start = time.monotonic() + 0.01

        def loop(slot: int) -> None:
            try:
                for n in numbers[slot :: len(self.conns)]:
                    due = start + (n - first) / rate
                    if (wait := due - time.monotonic()) > 0:
                        time.sleep(wait)
                    late.append(time.monotonic() - due)
                    self.conns[slot].execute(self.statement, [n])
                    acked[n] = time.monotonic()
            except BaseException as err:
                errors.append(err)
                raise

        threads = [threading.Thread(target=loop, args=(slot,)) for slot in range(len(self.conns))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        started = read_stamps(self.stamps, numbers)
        self.latencies += [started[n] - acked[n] for n in numbers]
        self.late += late

    def quantiles(self) -> tuple[float, float, float]:
        return (
            statistics.median(self.latencies),
            percentile(self.latencies, 0.99),
            max(self.latencies),
        )


@contextmanager
def x_jobs_wake_worker(dsn: str, stamps: Path) -> Iterator[str]:
    """One x-jobs worker at its defaults (`x-jobs worker apps.stamp:app`); its database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE x_jobs.job, x_jobs.worker, x_jobs.counter")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "bench")]),
            PGDATABASE=str(conninfo_to_dict(dsn)["dbname"]),
            X_JOBS_BENCH_STAMPS=str(stamps),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "x_jobs", "worker", "apps.stamp:app"], env=env
        )
        try:
            while conn.execute("SELECT count(*) FROM x_jobs.worker").fetchone() != (1,):
                if proc.poll() is not None:
                    raise RuntimeError(f"the x_jobs worker exited ({proc.returncode})")
                time.sleep(0.02)
            yield dsn
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            conn.execute("TRUNCATE x_jobs.job, x_jobs.worker, x_jobs.counter")


@contextmanager
def graphile_wake_worker(
    stamps: Path, concurrent_jobs: int | None, settings: dict[str, str], label: str
) -> Iterator[str]:
    """One graphile-worker run() at its defaults (wake_graphile.mjs) but for concurrentJobs
    when `concurrent_jobs` is given; its database. With NO_LOG_SUCCESS=1, as x_jobs' worker
    does not log a job that succeeds. Its settings go to settings[label] once it stopped."""
    extra = [] if concurrent_jobs is None else [str(concurrent_jobs)]
    proc = subprocess.Popen(
        ["node", str(GRAPHILE_WAKE), str(stamps), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, NO_LOG_SUCCESS="1"),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        dbname = ""
        for line in proc.stdout:
            if line.startswith("ready "):
                dbname = line.split()[1]
                break
            sys.stderr.write(line)
        if not dbname:
            raise RuntimeError(f"wake_graphile.mjs exited ({proc.wait()})")
        yield make_conninfo(dbname=dbname)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith("{"):
                settings[label] = str(json.loads(line)["settings"])
            else:
                sys.stderr.write(line)
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"wake_graphile.mjs failed ({proc.returncode})")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def bench_wake(dsn: str, sizes: VersusSizes, settings: dict[str, str]) -> list[Line]:
    """Every side's worker runs (idle) throughout; the sides take turns of
    wake_jobs / WAKE_TURNS jobs, the order reversing each turn, each turn after a pause with
    nothing queued anywhere, so that every side sees the same moments of a noisy machine."""
    lines: list[Line] = []
    per_turn = sizes.wake_jobs // WAKE_TURNS
    with tempfile.TemporaryDirectory(prefix="x_jobs_bench_wake.") as scratch, ExitStack() as stack:
        sides: list[WakeSide] = []
        for n, (label, concurrent_jobs) in enumerate(WAKE_SIDES.items()):
            stamps = Path(scratch) / f"{n}.stamps"
            stamps.write_text("")
            if label == "x_jobs":
                conninfo = stack.enter_context(x_jobs_wake_worker(dsn, stamps))
                statement = X_JOBS_ENQUEUE
            else:
                conninfo = stack.enter_context(
                    graphile_wake_worker(stamps, concurrent_jobs, settings, f"{label} wake")
                )
                statement = GRAPHILE_ADD_JOB
            sides.append(WakeSide(label, conninfo, statement, stamps, stack))
        for side in sides:
            side.turn(20, range(-WAKE_WARMUP, 0))
        number = 0
        for rate in sizes.wake_rates:
            log(f"wake latency, {rate}/s, {sizes.wake_jobs:,} jobs a side")
            for side in sides:
                side.latencies.clear()
                side.late.clear()
            for turn in range(WAKE_TURNS):
                for side in sides[:: -1 if turn % 2 else 1]:
                    time.sleep(WAKE_IDLE_SECONDS)
                    side.turn(rate, range(number, number + per_turn))
                    number += per_turn
            ours = sides[0].quantiles()
            for side in sides:
                p50, p99, worst = quantiles = side.quantiles()
                lines.append(
                    (
                        f"{'versus: ' if side is sides[0] else '  '}wake latency, {side.label}, "
                        f"{rate}/s, {len(side.latencies):,} jobs "
                        f"(enqueue lag p99 {ms(percentile(side.late, 0.99))})",
                        f"p50 {ms(p50)}, p99 {ms(p99)}, max {ms(worst)}",
                        "",
                        "",
                    )
                )
                if side is sides[0]:
                    continue
                ratios = [a / b for a, b in zip(ours, quantiles, strict=True)]
                lines.append(
                    (
                        f"    x_jobs / {side.label}",
                        "p50 {:.2f}x, p99 {:.2f}x, max {:.2f}x".format(*ratios),
                        "each < 1x",
                        " / ".join(verdict(r < 1) for r in ratios),
                    )
                )
    return lines


# --- the part ----------------------------------------------------------------------------------


def compare_with_graphile(dsn: str, quick: bool) -> list[Line]:
    """bench.py's part ``versus``: its rows of the table. Prints each side's settings first."""
    sizes = QUICK if quick else FULL
    # Installs graphile-worker when it is missing (idempotent, as bench/peers/run_all runs it).
    subprocess.run([str(ROOT / "bench" / "peers" / "setup")], check=True)
    with psycopg.connect(dsn, autocommit=True) as conn:
        server = ServerCpu.find(conn)
    if server is None:
        raise SystemExit("bench --only versus: the server's processes cannot be read here")
    settings: dict[str, str] = {}
    lines = bench_drains(dsn, sizes, server, settings)
    lines += bench_wake(dsn, sizes, settings)
    tuned = " ".join(WORKER_ARGS)
    print(
        "versus settings:\n"
        f"  drains: {sizes.small:,} jobs in {sizes.small_rounds} interleaved rounds, "
        f"{sizes.big:,} in {sizes.big_rounds} (fewer: a round takes minutes); each side counts "
        "its best round (best jobs/s; least CPU per job); backlog enqueued and settled "
        "(VACUUM ANALYZE, CHECKPOINT) before the clock\n"
        f"  x_jobs tuned: x-jobs worker apps.noop:app {tuned}; sync no-op handler; jobs kept "
        "(keep_done default); enqueued with enqueue_many, 1,000 a call\n"
        "  x_jobs defaults: x-jobs worker apps.noop:app (no flag: the tree's defaults, which the "
        "workers' start-up line on stderr names)\n"
        f"  graphile-worker drain: {settings.get('graphile-worker', '?')}; completed jobs "
        "deleted\n"
        "  CPU per job: server = postmaster and children (bench/server_cpu.py) but the backend "
        "of the bench's poll for an empty backlog (printed apart), workers = the worker "
        "processes' utime+stime, all sampled at the drain's clock start and stop\n"
        f"  wake: {sizes.wake_jobs:,} single jobs per rate after {WAKE_WARMUP} warm-up jobs and "
        f"{WAKE_IDLE_SECONDS:g} s idle, enqueued by one client from {ENQUEUE_THREADS} "
        "connections in turns, each call its own transaction; latency = handler start - "
        "enqueue call's return, CLOCK_MONOTONIC\n"
        "  x_jobs wake: x-jobs worker apps.stamp:app (defaults), x_jobs.enqueue()\n"
        + "".join(
            f"  {side} wake: {settings.get(f'{side} wake', '?')}, NO_LOG_SUCCESS=1; "
            "graphile_worker.add_job()\n"
            for side in WAKE_SIDES
            if side != "x_jobs"
        ),
        flush=True,
    )
    return lines
