"""What an operator sees of a running worker: Prometheus metrics at its port, JSON and text log
lines, and its announcement (build, queues, draining) in x_jobs.worker."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from apps import basic
from apps.workers import Fleet
from conftest import Conn, free_port, scrape, wait_for

import x_jobs
from x_jobs.cli import TextLogFormatter

TESTS = Path(__file__).resolve().parent


def test_metrics_count_what_the_worker_did(dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn)
    attempts: dict[int, int] = {}

    @app.job(name="flaky", queue="obs", retry=x_jobs.Retry(base=0.01, max=0.02))
    def flaky(input: dict[str, int], ctx: x_jobs.JobContext) -> int:
        attempts[input["n"]] = ctx.attempt
        if input["n"] == 0 and ctx.attempt == 1:
            raise ValueError("first attempt of job 0 fails")
        return input["n"]

    flaky.enqueue_many([{"n": n} for n in range(5)])
    port = free_port()
    worker = x_jobs.Worker(app, concurrency=2, poll_interval=0.05, metrics_port=port)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_for(
            lambda: (
                conn.execute("SELECT count(*) FROM x_jobs.job WHERE state = 'done'").fetchone()
                == (5,)
            ),
            "the five jobs to be done",
        )
        # The settler counts a settle once its commit has returned: the page may be a moment
        # behind the rows.
        wait_for(
            lambda: scrape(port).get('x_jobs_settled_total{job_name="flaky",state="done"}') == 5,
            "the page to count the five settles",
        )
        samples = scrape(port)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert samples['x_jobs_claimed_total{job_name="flaky"}'] == 6
    assert samples['x_jobs_settled_total{job_name="flaky",state="done"}'] == 5
    # The failed first attempt of job 0 went back to the queue to wait out its backoff.
    retried = sum(
        value
        for key, value in samples.items()
        if key.startswith('x_jobs_settled_total{job_name="flaky",state="') and "done" not in key
    )
    assert retried == 1
    assert samples['x_jobs_run_seconds_count{job_name="flaky"}'] == 6
    # A histogram: the buckets count the runs up to their bound, the last (+Inf) all of them.
    buckets = [
        value
        for key, value in samples.items()
        if key.startswith('x_jobs_run_seconds_bucket{job_name="flaky",')
    ]
    assert len(buckets) == 15
    assert buckets == sorted(buckets)
    assert samples['x_jobs_run_seconds_bucket{job_name="flaky",le="+Inf"}'] == 6
    assert samples['x_jobs_run_seconds_sum{job_name="flaky"}'] > 0
    assert samples["x_jobs_held"] == 0


def test_json_logs_and_the_announcement(dsn: str, conn: Conn) -> None:
    dbname = conn.info.dbname
    # The checkout's package under test (PYTHONPATH) stays importable after the apps.
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PGDATABASE=dbname, PYTHONPATH=path)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "x_jobs",
            "worker",
            "apps.basic:app",
            "--queue",
            "obs",
            "--build",
            "v1.2.3",
            "--poll",
            "0.1",
            "--log-format",
            "json",
        ],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Read stderr as it comes, so that a worker that does not stop shows what it last said.
    logged: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: logged.extend(proc.stderr or []), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT build, queues FROM x_jobs.worker WHERE draining_at IS NULL"
                ).fetchall()
                == [("v1.2.3", ["obs"])]
            ),
            "the worker to announce its build and queues",
        )
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(
                "the worker did not stop within 30 s of SIGTERM; it logged:\n" + "".join(logged)
            )
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
    stderr = "".join(logged)
    assert proc.returncode == 0, stderr
    lines: list[dict[str, Any]] = [json.loads(line) for line in logged if line.strip()]
    messages = [line["msg"] for line in lines]
    assert "worker starting" in messages
    assert "worker stopped" in messages
    start = lines[messages.index("worker starting")]
    assert start["level"] == "info"
    assert start["queues"] == ["obs"]
    assert start["worker"].startswith(socket.gethostname())
    # The drain announced itself: queue demand stops counting the jobs of this worker.
    row = conn.execute("SELECT draining_at IS NOT NULL FROM x_jobs.worker").fetchone()
    assert row == (True,)


#: A text log line's key=value field: a bare value, or a JSON string when it needs quoting.
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^ "]*)')


def text_fields(line: str, message: str) -> dict[str, str]:
    """The key=value fields after ``message`` in a text log line, each value as logged (quoted
    ones decoded). Fails unless the rest of the line is fields and nothing else."""
    rest = line.split(f" {message} ", 1)[1]
    fields: dict[str, str] = {}
    at = 0
    while at < len(rest):
        found = FIELD.match(rest, at)
        assert found is not None, f"no field at {rest[at:]!r} in {line!r}"
        key, value = found.groups()
        fields[key] = json.loads(value) if value.startswith('"') else value
        at = found.end() + 1  # the space before the next field
    return fields


def test_text_logs_name_the_failed_job_and_its_error_quoted(
    dsn: str, conn: Conn, tmp_path: Path
) -> None:
    """The text format (the default) dropped every extra field: "job failed" said neither which
    job nor why. They follow the message as key=value, a value with spaces or quotes as a JSON
    string, so the line still splits into its fields."""
    with Fleet(dsn, tmp_path) as fleet:
        job_id = basic.app.enqueue(basic.quoted_error, {}, conn=conn).id
        worker = fleet.start(extra=["--queue", "default"])
        fleet.wait_for(lambda: "x_jobs.worker: job failed" in worker.log(), "the failure's log")
        log = worker.log()
    (line,) = [line for line in log.splitlines() if "x_jobs.worker: job failed" in line]
    assert " INFO x_jobs.worker: job failed " in line, line
    fields = text_fields(line, "job failed")
    error = 'ValueError: upstream said "no" = refused'
    assert fields == {
        "job_id": str(job_id),
        "job": "quoted_error",
        "attempt": "1",
        "state": "dead",
        "error": error,
    }
    assert conn.execute("SELECT last_error FROM x_jobs.job WHERE id = %s", [job_id]).fetchone() == (
        error,
    )


def test_a_text_log_value_with_a_newline_stays_on_its_line() -> None:
    record = logging.makeLogRecord(
        {"name": "x_jobs.worker", "levelname": "INFO", "msg": "job failed"}
    )
    record.job_id = 7
    record.error = "first line\nsecond line"
    line = TextLogFormatter().format(record)
    assert "\n" not in line
    assert text_fields(line, "job failed") == {"job_id": "7", "error": "first line\nsecond line"}
