"""pg_cron calling x_jobs.tick_schedules fires the jobs of due schedules, and a worker runs them.

The test starts a server of its own with pg_cron loaded (shared_preload_libraries, and
cron.database_name naming the database that holds both extensions), as a deployment without
workers that tick would: pg_cron's job ``SELECT * FROM x_jobs.tick_schedules()`` every minute,
in a session of its own (a background worker), on the real clock. A schedule every minute is
then due at the next whole minute, so the test waits for it: up to a minute, half a minute on
average. pg_cron 1.4 (Debian 12's postgresql-15-cron) schedules by the minute only ('N seconds'
came with 1.5).

pg_cron comes from Debian's postgresql-<major>-cron, which scripts/ensure-deps installs; without
it the test fails and says so (a skip would pass a run that never tried).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, wait_for
from psycopg.conninfo import make_conninfo

logger = logging.getLogger(__name__)

TESTS_DIR = Path(__file__).resolve().parent
SCHEDULE = "cron-echo-every-minute"
TICK = "SELECT * FROM x_jobs.tick_schedules()"
#: From a schedule made to its first fire: the next whole minute, and pg_cron's start of its
#: job a moment after it.
MINUTE_DEADLINE = 75.0


def _pg_config(flag: str) -> str:
    done = subprocess.run(["pg_config", flag], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _bindir() -> Path:
    """The server binaries (Debian's pg_config points at wrappers in /usr/bin)."""
    bindir = Path(_pg_config("--bindir"))
    if (bindir / "initdb").exists():
        return bindir
    major = _pg_config("--version").split()[1].split(".")[0]
    return Path(f"/usr/lib/postgresql/{major}/bin")


class CronServer:
    """A server of the test's own with pg_cron preloaded, on a Unix socket in a temporary
    directory, with the test server's staged x_jobs (its extension_destdir)."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        # Under /tmp and world-traversable: the server runs as postgres when the tests are root.
        self.root = Path(tempfile.mkdtemp(prefix="xjcron.", dir="/tmp"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        self.user = "postgres" if os.getuid() == 0 else os.environ.get("USER", "postgres")

    def run(self, *command: str) -> None:
        done = subprocess.run(
            [*self.as_owner, *command], cwd="/", capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}\n{self.log()}"

    def start(self, stage: str) -> None:
        if self.as_owner:
            shutil.chown(self.root, "postgres")
        self.run(
            str(self.bindir / "initdb"), "--no-sync", "-A", "trust", "-U", self.user,
            "-D", str(self.data),
        )  # fmt: skip
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = ''\nunix_socket_directories = '{self.root}'\n"
                f"extension_destdir = '{stage}'\n"
                "shared_preload_libraries = 'pg_cron'\ncron.database_name = 'postgres'\n"
                # pg_cron's jobs run in background workers, not in sessions it opens over libpq
                # (which would need a host and a password rule for it).
                "cron.use_background_workers = on\nmax_worker_processes = 16\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            )
        self.run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log_path),
            "-w", "start",
        )  # fmt: skip

    def conninfo(self, dbname: str = "postgres") -> str:
        return make_conninfo("", host=str(self.root), port=5432, dbname=dbname, user=self.user)

    def connect(self) -> Conn:
        return psycopg.connect(self.conninfo(), autocommit=True, connect_timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            subprocess.run(
                [*self.as_owner, str(self.bindir / "pg_ctl"), "-D", str(self.data),
                 "-m", "immediate", "-w", "stop"],
                cwd="/", capture_output=True, check=False,
            )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def cron_server(admin: Conn) -> Iterator[CronServer]:
    library = Path(_pg_config("--pkglibdir")) / "pg_cron.so"
    if not library.exists():
        major = _pg_config("--version").split()[1].split(".")[0]
        pytest.fail(
            f"pg_cron is not installed ({library} is missing): run scripts/ensure-deps, which "
            f"installs Debian's postgresql-{major}-cron",
            pytrace=False,
        )
    row = admin.execute("SHOW extension_destdir").fetchone()
    server = CronServer()
    try:
        server.start(row[0] if row else "")
        with server.connect() as conn:
            conn.execute("CREATE EXTENSION pg_cron")
            conn.execute("CREATE EXTENSION x_jobs")
        yield server
    finally:
        server.close()


def _one(conn: Conn, query: LiteralString, params: Sequence[Any] = ()) -> Any:
    """The one row ``query`` answers: its value, or the row when it has several columns."""
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0] if len(row) == 1 else row


def _worker(server: CronServer, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    command = [
        sys.executable, "-m", "x_jobs", "worker", "apps.cron_echo:app",
        "--dsn", server.conninfo(), "--concurrency", "2", "--poll", "0.2", "--grace", "5",
    ]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(
            command, cwd=TESTS_DIR, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def test_pg_cron_ticking_fires_a_schedule_whose_job_a_worker_runs(
    cron_server: CronServer, tmp_path: Path
) -> None:
    conn = cron_server.connect()
    try:
        # Not in a minute's last two seconds: the schedule and pg_cron's job are made within
        # one minute, so the first minute pg_cron runs in is the schedule's first instant.
        while dt.datetime.now(dt.UTC).second >= 58:
            time.sleep(0.2)
        info = conn.execute(
            "SELECT next_fire_at FROM x_jobs.set_schedule(name => %s, job => 'cron_echo',"
            " cron => '* * * * *', input => '{\"greeting\": \"from pg_cron\"}')",
            [SCHEDULE],
        ).fetchone()
        assert info is not None
        first: dt.datetime = info[0]
        cron_job = _one(conn, "SELECT cron.schedule('x_jobs-tick', '* * * * *', %s)", [TICK])
        made = dt.datetime.now(dt.UTC)
        assert first.second == 0 and dt.timedelta(0) < first - made <= dt.timedelta(seconds=60)

        # No worker runs yet: whatever enqueues the job is pg_cron's tick.
        def fired() -> bool:
            return bool(_one(conn, "SELECT count(*) FROM x_jobs.job") > 0)

        wait_for(fired, "pg_cron's tick to fire the schedule", timeout=MINUTE_DEADLINE)
        job_id, state, enqueued_by, schedule = _one(
            conn,
            "SELECT id, state::text, enqueued_by, input -> '_schedule' FROM x_jobs.job"
            " ORDER BY id LIMIT 1",
        )
        assert (state, enqueued_by) == ("ready", f"schedule:{SCHEDULE}")
        assert schedule["name"] == SCHEDULE and schedule["late"] is False
        assert dt.datetime.fromisoformat(schedule["at"]) == first

        # pg_cron's own account: the tick ran and succeeded.
        def tick_recorded() -> bool:
            rows = conn.execute(
                "SELECT status, return_message FROM cron.job_run_details WHERE jobid = %s"
                " AND status NOT IN ('starting', 'running', 'sending', 'connecting')",
                [cron_job],
            ).fetchall()
            return bool(rows)

        wait_for(tick_recorded, "pg_cron to record its run")
        runs = conn.execute(
            "SELECT status, return_message, command FROM cron.job_run_details WHERE jobid = %s"
            " AND status NOT IN ('starting', 'running', 'sending', 'connecting')",
            [cron_job],
        ).fetchall()
        assert runs and all(r == ("succeeded", "SELECT 1", TICK) for r in runs), (
            f"{runs}\n{cron_server.log()[-3000:]}"
        )

        # A worker runs the job pg_cron fired.
        log = tmp_path / "worker.log"
        worker = _worker(cron_server, log)
        try:
            wait_for(
                lambda: (
                    _one(conn, "SELECT state::text FROM x_jobs.job WHERE id = %s", [job_id])
                    == "done"
                ),
                "the worker to run the fired job",
            )
            output = _one(conn, "SELECT output FROM x_jobs.job WHERE id = %s", [job_id])
            assert output == {
                "greeting": "from pg_cron",
                "at": schedule["at"],
                "pid": worker.pid,
            }, log.read_text(errors="replace")
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(DEADLINE_SECONDS) == 0, log.read_text(errors="replace")
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        fires, last_job_id = _one(
            conn, "SELECT fires, last_job_id FROM x_jobs.list_schedules(%s)", [SCHEDULE]
        )
        assert fires >= 1
        assert last_job_id >= job_id
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT cron.unschedule('x_jobs-tick')")
        conn.close()
