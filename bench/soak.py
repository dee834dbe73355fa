"""Steady production into a fresh, never-analysed table, x_jobs beside graphile-worker:
``bench.py --only soak`` (``--soak MINUTES``, ``--soak-rate JOBS_PER_S``), or this file alone.

Each system in turn gets a database of its own, created for the run and never analysed by
hand (autovacuum at the server's settings, as users run it): x_jobs by CREATE EXTENSION,
graphile-worker by its own migrate (bench/peers/soak_graphile.mjs). One worker runs at its
defaults, ``python -m x_jobs worker apps.noop:app`` with no flags, or graphile-worker's run()
with the settings of its performance page and a no-op task (at its defaults it does not keep the
rate here: see soak_graphile.mjs). It is started before the traffic, as a
deploy does, and idles WARM_UP seconds on the empty tables. Then, on the same schedule for both:

  producer     one connection of this process enqueues BATCH jobs every BATCH / rate seconds
               (x_jobs.enqueue_many; graphile_worker.add_jobs, its SQL API). Each batch has a
               fixed due time: a late producer sends back to back until it is on time again,
               and reports at the end if it could not keep the rate
  probe        (x_jobs) a connection opened on the empty table, as the worker's is, claims
               one job every PROBE_EVERY seconds and completes what it got. The claim runs in
               a transaction of its own, timed apart from its COMMIT: the statement is what its
               plan decides, the commit is the WAL flush, which on a shared disk under durable
               settings varies tenfold whatever the plan (docs/benchmarks.md). Its session
               does not count in pg_stat_user_functions (track_functions none)
  retention    (x_jobs) x_jobs.maintenance.maintain (what ``x-jobs maintain`` runs) every
               MAINTAIN_EVERY seconds, keeping finished jobs RETENTION; graphile-worker deletes
               a job when it completes, so it needs none
  sampler      every INTERVAL seconds a line: produced/s, done/s, backlog (produced - done),
               the probe's claim p50/p99 and its commit's, the worker's mean claim time
               (pg_stat_user_functions, with track_functions = 'pl' set on the database before
               the worker connects; like the probe's claim, without the commit),
               the size of the job tables (pg_total_relation_size, indexes and TOAST with
               them), their dead rows, the main table's autovacuum and autoanalyze counts so
               far, rows purged, and the CPU time per job done of the server
               (bench/server_cpu.py; the probe's and the sampler's backends left out, the
               retention's counted) and of the worker process (/proc/PID/stat)

x_jobs counts what it has done exactly in x_jobs.counter (complete_many adds to it in the same
transaction); graphile-worker deletes what it has done, so its done is produced minus the rows
left. The summary compares the two in bench.py's (measure, result, target, met) lines; the
targets are issue 21's: x_jobs keeps up (done/s >= KEEP_UP of the rate in every interval after
the first), its claim statement's p99 stays under CLAIM_P99_MS, and its job tables end no
bigger than SIZE_RATIO times graphile-worker's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import IO, Any, LiteralString

import psycopg
from psycopg import sql
from server_cpu import ServerCpu, processes_seconds

from bench import ROOT, percentile, verdict
from x_jobs.maintenance import Retention, maintain

RATE = 2_000
BATCH = 100
INTERVAL = 10.0
PROBE_EVERY = 0.1
RETENTION = timedelta(minutes=1)
MAINTAIN_EVERY = 10.0
WARM_UP = 2.0
FULL_MINUTES = 3.0
QUICK_MINUTES = 0.5
KEEP_UP = 0.95
CLAIM_P99_MS = 5.0
SIZE_RATIO = 1.5

XJOBS, GRAPHILE = "x_jobs", "graphile-worker"

PROBE_CLAIM: LiteralString = (
    "SELECT id FROM x_jobs.claim(queues => ARRAY['bench'], worker => 'probe', "
    "lease => '30 seconds', qty => 1)"
)
PROBE_COMPLETE: LiteralString = "SELECT count(*) FROM x_jobs.complete_many(%s, 'probe')"


# --- the two systems ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Worker:
    proc: subprocess.Popen[str]
    #: The process whose CPU counts as the worker's (the Python worker, or Node's).
    pid: int
    settings: str


@dataclass(frozen=True)
class System:
    name: str
    dbname: str
    enqueue: LiteralString
    make_batch: Callable[[int, int], str]
    #: Jobs done so far, given %(produced)s (the jobs committed before it runs).
    done: LiteralString
    #: Size in bytes and dead rows of the job tables, autovacuums and autoanalyzes of the main one.
    tables: LiteralString
    install: Callable[[str], None]
    start_worker: Callable[[str], Worker]
    stop_worker: Callable[[Worker], None]
    #: The probe, the worker's claim statistics and the retention: x_jobs only.
    is_xjobs: bool


def _tables_sql(schema: LiteralString, names: LiteralString, main: LiteralString) -> LiteralString:
    return (
        "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint, "
        "coalesce(sum(n_dead_tup), 0)::bigint, "
        f"coalesce(max(autovacuum_count) FILTER (WHERE relname = '{main}'), 0), "
        f"coalesce(max(autoanalyze_count) FILTER (WHERE relname = '{main}'), 0) "
        f"FROM pg_stat_user_tables WHERE schemaname = '{schema}' AND {names}"
    )


def _xjobs_batch(start: int, count: int) -> str:
    return json.dumps(
        [{"name": "noop", "queue": "bench", "input": {"n": n}} for n in range(start, start + count)]
    )


def _graphile_batch(start: int, count: int) -> str:
    return json.dumps(
        [{"identifier": "noop", "payload": {"n": n}} for n in range(start, start + count)]
    )


def _xjobs_install(dbname: str) -> None:
    with psycopg.connect(dbname=dbname, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION x_jobs")


def _xjobs_worker(dbname: str) -> Worker:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "python"), str(ROOT / "bench")]),
        PGDATABASE=dbname,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "x_jobs", "worker", "apps.noop:app"], env=env, text=True
    )
    with psycopg.connect(dbname=dbname, autocommit=True) as conn:
        while conn.execute("SELECT count(*) FROM x_jobs.worker").fetchone() != (1,):
            if proc.poll() is not None:
                raise RuntimeError(f"the x_jobs worker exited ({proc.returncode})")
            time.sleep(0.02)
    return Worker(
        proc, proc.pid, "python -m x_jobs worker apps.noop:app, no flags (its defaults), sync no-op"
    )


def _xjobs_stop(worker: Worker) -> None:
    worker.proc.send_signal(signal.SIGTERM)
    try:
        worker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()


def _graphile_worker(dbname: str) -> Worker:
    proc = subprocess.Popen(
        ["node", str(ROOT / "bench" / "peers" / "soak_graphile.mjs"), dbname],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    try:
        ready = json.loads(line)
    except ValueError:
        ready = None
    if not isinstance(ready, dict) or not ready.get("ready"):
        _graphile_stop(Worker(proc, proc.pid, ""))
        raise RuntimeError(f"soak_graphile.mjs said {line!r}, not ready")
    threading.Thread(target=_copy_lines, args=(proc.stdout,), daemon=True).start()
    return Worker(proc, int(ready["pid"]), str(ready["settings"]))


def _graphile_stop(worker: Worker) -> None:
    if worker.proc.poll() is None and worker.proc.stdin is not None:
        try:
            worker.proc.stdin.write("stop\n")
            worker.proc.stdin.close()
        except BrokenPipeError:
            pass
    try:
        worker.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()


def _copy_lines(source: IO[str]) -> None:
    for line in source:
        sys.stderr.write(line)


SYSTEMS = (
    System(
        name=XJOBS,
        dbname="x_jobs_soak",
        enqueue="SELECT count(*) FROM x_jobs.enqueue_many(%s::jsonb)",
        make_batch=_xjobs_batch,
        done="SELECT coalesce(sum(completed), 0)::bigint FROM x_jobs.counter",
        tables=_tables_sql("x_jobs", "relname IN ('job', 'job_error', 'counter')", "job"),
        install=_xjobs_install,
        start_worker=_xjobs_worker,
        stop_worker=_xjobs_stop,
        is_xjobs=True,
    ),
    System(
        name=GRAPHILE,
        dbname="x_jobs_soak_graphile",
        # graphile-worker's SQL API: add_jobs takes an array of its job_spec composite.
        enqueue=(
            "SELECT count(*) FROM graphile_worker.add_jobs(ARRAY("
            "SELECT s FROM jsonb_populate_recordset(NULL::graphile_worker.job_spec, %s::jsonb) s))"
        ),
        make_batch=_graphile_batch,
        done="SELECT %(produced)s - count(*) FROM graphile_worker._private_jobs",
        tables=_tables_sql("graphile_worker", "true", "_private_jobs"),
        install=lambda dbname: None,  # soak_graphile.mjs migrates before its worker runs
        start_worker=_graphile_worker,
        stop_worker=_graphile_stop,
        is_xjobs=False,
    ),
)


# --- the load ----------------------------------------------------------------------------------


class Loop(threading.Thread):
    """A thread that runs `step` on its own connection every `every` seconds from `t0` until
    `until` (or stop()); the first error ends it and is raised by join_checked()."""

    def __init__(self, dbname: str, t0: float, until: float, every: float) -> None:
        super().__init__(daemon=True)
        self.dbname, self.t0, self.until, self.every = dbname, t0, until, every
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def step(self, conn: psycopg.Connection[Any], n: int) -> None:
        raise NotImplementedError

    def prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Runs once the connection is open, before the first step."""

    def run(self) -> None:
        try:
            with psycopg.connect(dbname=self.dbname, autocommit=True) as conn:
                self.prepare(conn)
                n = 0
                while not self.stopped.is_set():
                    due = self.t0 + n * self.every
                    # A late loop catches up, but not past its end: what it missed is missed.
                    if due >= self.until or time.perf_counter() >= self.until:
                        break
                    if (wait := due - time.perf_counter()) > 0 and self.stopped.wait(wait):
                        break
                    self.step(conn, n)
                    n += 1
        except BaseException as err:
            self.error = err

    def stop(self) -> None:
        self.stopped.set()

    def join_checked(self) -> None:
        self.join()
        if self.error is not None:
            raise RuntimeError(f"{type(self).__name__} failed") from self.error


class Producer(Loop):
    """BATCH jobs per step on a fixed schedule; `produced` counts the committed ones."""

    def __init__(self, system: System, t0: float, until: float, rate: float) -> None:
        super().__init__(system.dbname, t0, until, BATCH / rate)
        self.system = system
        self.produced = 0
        self.most_late = 0.0

    def step(self, conn: psycopg.Connection[Any], n: int) -> None:
        self.most_late = max(self.most_late, time.perf_counter() - (self.t0 + n * self.every))
        conn.execute(self.system.enqueue, [self.system.make_batch(n * BATCH, BATCH)])
        self.produced += BATCH


@dataclass(frozen=True)
class ProbeCall:
    #: Seconds since t0 when the claim was sent.
    at: float
    #: Seconds of the claim statement, and of the COMMIT that followed it.
    claim: float
    commit: float


class Probe(Loop):
    """One x_jobs claim of qty 1 per step, timed; what it got is completed."""

    def __init__(self, conn: psycopg.Connection[Any], t0: float, until: float) -> None:
        super().__init__("", t0, until, PROBE_EVERY)
        self.conn = conn
        self.calls: list[ProbeCall] = []

    def run(self) -> None:
        try:
            n = 0
            while not self.stopped.is_set():
                due = self.t0 + n * self.every
                if due >= self.until or time.perf_counter() >= self.until:
                    break
                if (wait := due - time.perf_counter()) > 0 and self.stopped.wait(wait):
                    break
                with self.conn.transaction():
                    started = time.perf_counter()
                    ids = [row[0] for row in self.conn.execute(PROBE_CLAIM).fetchall()]
                    claimed = time.perf_counter()
                committed = time.perf_counter()
                self.calls.append(
                    ProbeCall(started - self.t0, claimed - started, committed - claimed)
                )
                if ids:
                    self.conn.execute(PROBE_COMPLETE, [ids])
                n += 1
        except BaseException as err:
            self.error = err


class Retainer(Loop):
    """x_jobs' retention pass, keeping finished jobs RETENTION."""

    def __init__(self, dbname: str, t0: float, until: float) -> None:
        # Half an interval out of step with the sampler, so a pass and a sample seldom meet.
        super().__init__(dbname, t0 + MAINTAIN_EVERY / 2, until, MAINTAIN_EVERY)
        self.purged = 0

    def step(self, conn: psycopg.Connection[Any], n: int) -> None:
        done = maintain(conn, Retention(jobs=RETENTION))
        self.purged += done.deleted.get("jobs", 0)


# --- sampling ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    at: float
    produced: int
    done: int
    size: int
    dead: int
    vacuums: int
    analyzes: int
    server_cpu: float | None
    worker_cpu: float
    claim_calls: int
    claim_ms: float
    purged: int


@dataclass(frozen=True)
class Interval:
    end: float
    produced_s: float
    done_s: float
    backlog: int
    probe: list[ProbeCall]
    claim_mean_ms: float | None
    sample: Sample
    server_us: float | None
    worker_us: float | None
    purged: int


def take_sample(
    conn: psycopg.Connection[Any],
    system: System,
    *,
    producer: Producer,
    retainer: Retainer | None,
    cpu: ServerCpu | None,
    worker: Worker,
    own: frozenset[int] = frozenset(),
) -> Sample:
    """``own``: the backends of this process's probe and sampler, whose CPU is not the
    system's (graphile-worker has no probe, and the two sides count done jobs differently)."""
    at = time.perf_counter()
    produced = producer.produced
    row = conn.execute(system.done, {"produced": produced}).fetchone()
    assert row is not None
    done = int(row[0])
    tables = conn.execute(system.tables).fetchone()
    assert tables is not None
    calls, claim_ms = 0, 0.0
    if system.is_xjobs:
        stats = conn.execute(
            "SELECT calls, total_time FROM pg_stat_user_functions "
            "WHERE schemaname = 'x_jobs' AND funcname = 'claim'"
        ).fetchone()
        if stats is not None:
            calls, claim_ms = int(stats[0]), float(stats[1])
    return Sample(
        at=at,
        produced=produced,
        done=done,
        size=int(tables[0]),
        dead=int(tables[1]),
        vacuums=int(tables[2]),
        analyzes=int(tables[3]),
        server_cpu=cpu.seconds(excluding=own) if cpu is not None else None,
        worker_cpu=processes_seconds([worker.pid]),
        claim_calls=calls,
        claim_ms=claim_ms,
        purged=retainer.purged if retainer is not None else 0,
    )


def interval(before: Sample, after: Sample, t0: float, probe: Probe | None) -> Interval:
    seconds = after.at - before.at
    done = after.done - before.done
    probe_calls = [
        c for c in (probe.calls if probe else []) if before.at - t0 <= c.at < after.at - t0
    ]
    calls = after.claim_calls - before.claim_calls
    server = None
    if after.server_cpu is not None and before.server_cpu is not None and done > 0:
        server = (after.server_cpu - before.server_cpu) / done * 1e6
    return Interval(
        end=after.at - t0,
        produced_s=(after.produced - before.produced) / seconds,
        done_s=done / seconds,
        backlog=after.produced - after.done,
        probe=probe_calls,
        claim_mean_ms=(after.claim_ms - before.claim_ms) / calls if calls else None,
        sample=after,
        server_us=server,
        worker_us=(after.worker_cpu - before.worker_cpu) / done * 1e6 if done > 0 else None,
        purged=after.purged - before.purged,
    )


HEADER = (
    f"{'t s':>5} {'produced/s':>10} {'done/s':>7} {'backlog':>8} {'claim p50/p99 ms':>16} "
    f"{'commit p50/p99':>14} "
    f"{'worker claim ms':>15} {'tables MB':>9} {'dead rows':>9} {'vac/an':>6} {'purged':>7} "
    f"{'server us/job':>13} {'worker us/job':>13}"
)


def row_text(iv: Interval) -> str:
    def ms(samples: list[float]) -> str:
        if not samples:
            return "-"
        return f"{percentile(samples, 0.5) * 1000:.2f}/{percentile(samples, 0.99) * 1000:.2f}"

    claim = ms([c.claim for c in iv.probe])
    commit = ms([c.commit for c in iv.probe])
    mean = f"{iv.claim_mean_ms:.2f}" if iv.claim_mean_ms is not None else "-"
    server = f"{iv.server_us:.0f}" if iv.server_us is not None else "n/a"
    work = f"{iv.worker_us:.0f}" if iv.worker_us is not None else "-"
    s = iv.sample
    return (
        f"{iv.end:>5.0f} {iv.produced_s:>10,.0f} {iv.done_s:>7,.0f} {iv.backlog:>8,} {claim:>16} "
        f"{commit:>14} "
        f"{mean:>15} {s.size / 2**20:>9.1f} {s.dead:>9,} {f'{s.vacuums}/{s.analyzes}':>6} "
        f"{iv.purged:>7,} {server:>13} {work:>13}"
    )


# --- one system's run --------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    system: System
    settings: str
    rate: float
    seconds: float
    intervals: list[Interval]
    first: Sample
    last: Sample
    produced: int
    most_late: float
    probe: list[ProbeCall]


def _admin(statement: sql.SQL | sql.Composed) -> None:
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(statement)


def soak_one(system: System, seconds: float, rate: float) -> Run:
    """One system from a fresh database to its dropping; prints a line per interval."""
    name = sql.Identifier(system.dbname)
    _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
    _admin(sql.SQL("CREATE DATABASE {}").format(name))
    worker: Worker | None = None
    loops: list[Loop] = []
    probe_conn: psycopg.Connection[Any] | None = None
    try:
        # Before anyone connects: sessions read the database's settings when they start.
        _admin(sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(name))
        system.install(system.dbname)
        _admin(sql.SQL("CHECKPOINT"))
        probe: Probe | None = None
        if system.is_xjobs:
            probe_conn = psycopg.connect(dbname=system.dbname, autocommit=True)
            probe_conn.execute("SET track_functions = 'none'")
            probe_conn.execute(PROBE_CLAIM).fetchall()  # its plans, like the worker's, on empty
        worker = system.start_worker(system.dbname)
        print(f"{system.name}: {worker.settings}")
        time.sleep(WARM_UP)
        with psycopg.connect(dbname=system.dbname, autocommit=True) as conn:
            # The sampler's counts must not take the server's two cores from the worker.
            conn.execute("SET max_parallel_workers_per_gather = 0")
            cpu = ServerCpu.find(conn)
            own = frozenset(c.info.backend_pid for c in (conn, probe_conn) if c is not None)
            t0 = time.perf_counter()
            until = t0 + seconds
            producer = Producer(system, t0, until, rate)
            loops.append(producer)
            retainer = None
            if probe_conn is not None:
                probe = Probe(probe_conn, t0, until)
                retainer = Retainer(system.dbname, t0, until)
                loops += [probe, retainer]
            first = previous = take_sample(
                conn, system, producer=producer, retainer=retainer, cpu=cpu, worker=worker, own=own
            )
            for loop in loops:
                loop.start()
            print(HEADER)
            intervals: list[Interval] = []
            count = round(seconds / INTERVAL)
            for n in range(1, count + 1):
                time.sleep(max(0.0, t0 + n * INTERVAL - time.perf_counter()))
                if n == count:
                    producer.join_checked()  # its last batch is in before the last sample
                for loop in loops:
                    if not loop.is_alive() and loop.error is not None:
                        loop.join_checked()
                if worker.proc.poll() is not None:
                    raise RuntimeError(
                        f"the {system.name} worker exited ({worker.proc.returncode})"
                    )
                sample = take_sample(
                    conn,
                    system,
                    producer=producer,
                    retainer=retainer,
                    cpu=cpu,
                    worker=worker,
                    own=own,
                )
                intervals.append(interval(previous, sample, t0, probe))
                print(row_text(intervals[-1]), flush=True)
                previous = sample
            for loop in loops:
                loop.stop()
                loop.join_checked()
        return Run(
            system=system,
            settings=worker.settings,
            rate=rate,
            seconds=seconds,
            intervals=intervals,
            first=first,
            last=previous,
            produced=producer.produced,
            most_late=producer.most_late,
            probe=probe.calls if probe else [],
        )
    finally:
        for loop in loops:
            loop.stop()
        for loop in loops:
            loop.join(timeout=30)
        if probe_conn is not None:
            probe_conn.close()
        if worker is not None:
            system.stop_worker(worker)
        _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


# --- the part ----------------------------------------------------------------------------------


def server_settings() -> str:
    names = [
        "autovacuum",
        "autovacuum_naptime",
        "autovacuum_analyze_threshold",
        "autovacuum_analyze_scale_factor",
        "autovacuum_vacuum_scale_factor",
        "autovacuum_vacuum_insert_threshold",
    ]
    with psycopg.connect(dbname="postgres") as conn:
        rows = conn.execute(
            "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name = ANY(%s) "
            "ORDER BY name",
            [names],
        ).fetchall()
    return ", ".join(f"{n.removeprefix('autovacuum_') or n}={v}" for n, v in rows)


def summary(runs: dict[str, Run]) -> list[tuple[str, str, str, str]]:
    lines: list[tuple[str, str, str, str]] = []
    for run in runs.values():
        expected = run.rate * run.seconds
        if run.produced < 0.99 * expected:
            lines.append(
                (
                    f"soak {run.system.name}: the producer could not keep {run.rate:,.0f}/s",
                    f"{run.produced / run.seconds:,.0f} jobs/s, up to {run.most_late:.1f} s late",
                    "",
                    "",
                )
            )
    for run in runs.values():
        # Against the rate, or what the producer managed when it could not keep it.
        ref = min(run.rate, run.produced / run.seconds)
        later = run.intervals[1:] or run.intervals
        worst = min(later, key=lambda iv: iv.done_s)
        ours = run.system.is_xjobs
        lines.append(
            (
                f"soak {run.system.name}: worst done/s after the first {INTERVAL:.0f} s",
                f"{worst.done_s:,.0f} jobs/s = {worst.done_s / ref:.0%} of {ref:,.0f} "
                f"(at {worst.end:.0f} s)",
                f">= {KEEP_UP:.0%} of the rate" if ours else "",
                verdict(worst.done_s >= KEEP_UP * ref) if ours else "",
            )
        )
    xj, gw = runs.get(XJOBS), runs.get(GRAPHILE)
    if xj is not None and xj.probe:
        claims = [c.claim for c in xj.probe]
        p99 = percentile(claims, 0.99) * 1000
        lines.append(
            (
                f"soak x_jobs claim qty 1 (probe), whole run, {len(claims):,} calls",
                f"median {statistics.median(claims) * 1000:.2f} ms, p99 {p99:.2f} ms",
                f"p99 < {CLAIM_P99_MS:.0f} ms",
                verdict(p99 < CLAIM_P99_MS),
            )
        )
        # Beside it, not in it: the flush is the disk's, whatever the claim's plan.
        for label, took in (
            ("its commit (the WAL flush)", [c.commit for c in xj.probe]),
            ("claim and commit together", [c.claim + c.commit for c in xj.probe]),
        ):
            lines.append(
                (
                    f"  {label}",
                    f"median {statistics.median(took) * 1000:.2f} ms, "
                    f"p99 {percentile(took, 0.99) * 1000:.2f} ms",
                    "",
                    "",
                )
            )
        means = [iv for iv in xj.intervals if iv.claim_mean_ms is not None]
        if means:
            worst_mean = max(means, key=lambda iv: iv.claim_mean_ms or 0.0)
            lines.append(
                (
                    "soak x_jobs worker's mean claim (pg_stat_user_functions), worst interval",
                    f"{worst_mean.claim_mean_ms:.2f} ms (at {worst_mean.end:.0f} s)",
                    "",
                    "",
                )
            )
    lines.append(
        (
            "soak peak backlog",
            ", ".join(
                f"{run.system.name} {max(iv.backlog for iv in run.intervals):,}"
                for run in runs.values()
            ),
            "",
            "",
        )
    )
    if xj is not None and gw is not None:
        ratio = xj.last.size / gw.last.size
        lines.append(
            (
                "soak job tables at the end, x_jobs / graphile-worker",
                f"{xj.last.size / 2**20:.1f} MB / {gw.last.size / 2**20:.1f} MB = {ratio:.2f}x",
                f"<= {SIZE_RATIO}x",
                verdict(ratio <= SIZE_RATIO),
            )
        )
        for label, key in (("server", "server_cpu"), ("worker process", "worker_cpu")):
            per_job = []
            for run in (xj, gw):
                start, end = getattr(run.first, key), getattr(run.last, key)
                done = run.last.done - run.first.done
                per_job.append(None if start is None or not done else (end - start) / done * 1e6)
            mine, theirs = per_job
            lines.append(
                (
                    f"soak {label} CPU per job done, x_jobs / graphile-worker",
                    f"{mine:.0f} us / {theirs:.0f} us = {mine / theirs:.2f}"
                    if mine is not None and theirs
                    else "n/a",
                    "",
                    "",
                )
            )
    return lines


def soak(
    minutes: float | None = None, quick: bool = False, rate: float = RATE
) -> list[tuple[str, str, str, str]]:
    """The part: x_jobs, then graphile-worker, under the same load; bench.py's summary lines."""
    minutes = minutes if minutes is not None else QUICK_MINUTES if quick else FULL_MINUTES
    # Whole intervals, so that every line covers as long as the others.
    seconds = INTERVAL * max(1, round(60 * minutes / INTERVAL))
    print(
        f"soak: {seconds:.0f} s per system, {rate:,.0f} jobs/s in batches of {BATCH} every "
        f"{BATCH / rate * 1000:.0f} ms from one connection, a line every {INTERVAL:.0f} s; "
        f"x_jobs keeps finished jobs {RETENTION.total_seconds():.0f} s (maintain every "
        f"{MAINTAIN_EVERY:.0f} s); fresh databases, never analysed; server: {server_settings()}"
    )
    # Installs graphile-worker when it is missing (idempotent, as bench/peers/run_all runs it).
    subprocess.run([str(ROOT / "bench" / "peers" / "setup")], check=True)
    runs: dict[str, Run] = {}
    for system in SYSTEMS:
        runs[system.name] = soak_one(system, seconds, rate)
        print()
    return summary(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, help=f"per system (default {FULL_MINUTES})")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_MINUTES} minutes")
    parser.add_argument("--rate", type=float, default=RATE, help="jobs/s (default %(default)s)")
    args = parser.parse_args()
    lines = soak(args.minutes, args.quick, args.rate)
    width = max(len(line[0]) for line in lines)
    value_width = max(len(line[1]) for line in lines)
    for name, value, target, met in lines:
        print(f"{name:<{width}}  {value:<{value_width}}  {target} {met}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
