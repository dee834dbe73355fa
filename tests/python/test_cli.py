"""x-jobs, the command line: every command against a real database, through typer's CliRunner
and through a real ``python -m x_jobs`` process. Human output and --json; errors end as one
line and a hint, exit 2 for usage and connection problems, 1 for refusals, never a traceback."""

from __future__ import annotations

import json
import logging
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, fresh_database
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from typer.testing import CliRunner, Result

from x_jobs import errors
from x_jobs.cli import _bulk, cli
from x_jobs.maintenance import MAX_AGE, PURGES, parse_age

logger = logging.getLogger(__name__)

# COLUMNS unset: the output is no terminal, so tables get x-jobs' width for pipes, not 80.
runner = CliRunner(env={"COLUMNS": None})


def x_jobs(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """``x-jobs ARGS`` in this process."""
    return runner.invoke(cli, list(args), env=env)


def succeeded(result: Result) -> Result:
    assert result.exit_code == 0, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n"
        f"{result.exception!r}"
    )
    return result


def failed(result: Result, exit_code: int) -> Result:
    """The command ended on purpose with ``exit_code``: one line, a hint, no traceback."""
    assert result.exit_code == exit_code, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    # An exception escaping a command also exits 1: only SystemExit is a deliberate exit.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result


def one_line_and_hint(result: Result) -> tuple[str, str]:
    """The error line and the hint line of a failed command's stderr."""
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("x-jobs: "), lines
    assert lines[1].startswith("hint: "), lines
    return lines[0], lines[1]


def as_json(result: Result) -> Any:
    return json.loads(succeeded(result).stdout)


def enqueue(dsn: str, name: str, *options: str, env: Mapping[str, str | None] | None = None) -> int:
    args = ("enqueue", name, "--input", "{}", *options, "--json", "--dsn", dsn)
    job_id = as_json(x_jobs(*args, env=env))
    return int(job_id["id"])


def listed_ids(output: str) -> list[int]:
    """The ids in the first column of a `jobs list` table."""
    return [int(line.split()[0]) for line in output.splitlines() if re.match(r"\s*\d+\s", line)]


def fail_twice(conn: Conn, job_id: int) -> None:
    """Fail the job's two attempts, as workers w1 and w2 would: it ends dead."""
    for worker, error, stack in [
        ("w1", "first [red]boom[/red]", 'Traceback:\n  File "jobs.py", line 1'),
        ("w2", "second boom", 'Traceback:\n  File "jobs.py", line 2'),
    ]:
        claimed = conn.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY['default'], worker => %s, qty => 1)",
            [worker],
        ).fetchall()
        assert claimed == [(job_id,)]
        conn.execute(
            "SELECT x_jobs.fail(id => %s, worker => %s, error => %s, error_stack => %s,"
            " retry_delay => '0')",
            [job_id, worker, error, stack],
        )


@pytest.fixture
def plain_dsn(admin: Conn) -> Iterator[str]:
    """A database of this test's own without x_jobs (CREATE DATABASE; dropped afterwards)."""
    with fresh_database(admin, "template1", prefix="x_jobs_plain") as conninfo:
        yield conninfo


def test_enqueue_then_list_shows_the_job(dsn: str, conn: Conn) -> None:
    human = succeeded(
        x_jobs(
            "enqueue",
            "send_email",
            "--input",
            '{"to": "ada@example.com"}',
            "--queue",
            "mail",
            "--priority",
            "3",
            "--max-attempts",
            "5",
            "--tenant",
            "acme",
            "--idempotency-key",
            "welcome:ada",
            "--dsn",
            dsn,
        )
    )
    rows = conn.execute(
        "SELECT id, run_id::text, name, queue, state::text, priority, max_attempts, tenant_id,"
        " idempotency_key, input, run_at FROM x_jobs.job"
    ).fetchall()
    assert len(rows) == 1
    job_id, run_id, *fields, run_at = rows[0]
    assert fields == [
        "send_email",
        "mail",
        "ready",
        3,
        5,
        "acme",
        "welcome:ada",
        {"to": "ada@example.com"},
    ]
    assert re.search(rf"^id\s+{job_id}\s*$", human.stdout, re.MULTILINE), human.stdout
    assert re.search(rf"^run_id\s+{run_id}\s*$", human.stdout, re.MULTILINE), human.stdout
    assert re.search(r"^deduped\s+no\s*$", human.stdout, re.MULTILINE), human.stdout

    # The same key of the same tenant again (keys are per tenant): the live row answers,
    # nothing new is enqueued.
    again = x_jobs(
        "enqueue",
        "send_email",
        "--input",
        "{}",
        "--tenant",
        "acme",
        "--idempotency-key",
        "welcome:ada",
        "--tenant",
        "acme",
        "--json",
        "--dsn",
        dsn,
    )
    assert as_json(again) == {"id": job_id, "run_id": run_id, "deduped": True}
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (1,)

    table = succeeded(x_jobs("jobs", "list", "--dsn", dsn)).stdout
    [line] = [line for line in table.splitlines() if re.match(rf"\s*{job_id}\s", line)]
    assert line.split()[:5] == [str(job_id), "send_email", "mail", "ready", "0/5"]
    assert run_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") in line
    assert "next page" not in table

    doc = as_json(x_jobs("jobs", "list", "--json", "--dsn", dsn))
    assert doc["next_before"] is None
    [job] = doc["jobs"]
    assert {k: job[k] for k in ("id", "run_id", "name", "queue", "state", "attempt")} == {
        "id": job_id,
        "run_id": run_id,
        "name": "send_email",
        "queue": "mail",
        "state": "ready",
        "attempt": 0,
    }
    assert (job["priority"], job["max_attempts"], job["tenant_id"]) == (3, 5, "acme")
    assert (job["idempotency_key"], job["input"]) == ("welcome:ada", {"to": "ada@example.com"})
    assert datetime.fromisoformat(job["run_at"]) == run_at


def test_enqueue_no_keep_done_makes_a_job_deleted_when_it_completes(dsn: str, conn: Conn) -> None:
    kept = as_json(x_jobs("enqueue", "report", "--input", "{}", "--json", "--dsn", dsn))
    unkept = as_json(
        x_jobs("enqueue", "ping", "--input", "{}", "--no-keep-done", "--json", "--dsn", dsn)
    )
    rows = conn.execute("SELECT id, keep_done FROM x_jobs.job ORDER BY id").fetchall()
    assert rows == [(kept["id"], True), (unkept["id"], False)]
    shown = succeeded(x_jobs("jobs", "show", str(unkept["id"]), "--dsn", dsn)).stdout
    assert re.search(r"^kept when done\s+no \(deleted\)\s*$", shown, re.MULTILINE), shown
    doc = as_json(x_jobs("jobs", "show", str(kept["id"]), "--json", "--dsn", dsn))
    assert doc["job"]["keep_done"] is True


def test_enqueue_run_at_and_delay_make_delayed_jobs(dsn: str, conn: Conn) -> None:
    at = as_json(
        x_jobs(
            "enqueue",
            "report",
            "--input",
            "[1, 2]",
            "--run-at",
            "2031-05-01T12:00:00+00:00",
            "--json",
            "--dsn",
            dsn,
        )
    )
    later = as_json(
        x_jobs("enqueue", "remind", "--input", '"x"', "--delay", "3600", "--json", "--dsn", dsn)
    )

    def row(job_id: int) -> tuple[Any, ...]:
        found = conn.execute(
            "SELECT state::text, run_at, run_at - created_at, input FROM x_jobs.job WHERE id = %s",
            [job_id],
        ).fetchone()
        assert found is not None
        return found

    state, run_at, _, payload = row(at["id"])
    assert (state, run_at, payload) == ("delayed", datetime(2031, 5, 1, 12, tzinfo=UTC), [1, 2])
    # The delay counts from the database's clock: exactly an hour after the row's creation.
    state, _, ahead, payload = row(later["id"])
    assert (state, ahead, payload) == ("delayed", timedelta(hours=1), "x")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--input", "{nope"], "'--input'"),
        (["--input", "NaN"], "'--input'"),
        (["--input", "{}", "--run-at", "next tuesday"], "next tuesday"),
        (["--input", "{}", "--run-at", "2031-01-01", "--delay", "5"], "not both"),
        (["--input", "{}", "--delay", "-1"], "--delay"),
        (["--queue", "q"], "--input"),
        # Due past the year 9999 in UTC: no page that holds the job could be read back.
        (["--input", "{}", "--delay", "1e12"], "'--delay'"),
        (["--input", "{}", "--delay", "inf"], "'--delay'"),
        (["--input", "{}", "--delay", "1e20"], "'--delay'"),
        (["--input", "{}", "--delay", "nan"], "'--delay'"),
        (["--input", "{}", "--run-at", "9999-12-31T23:59:59-05:00"], "'--run-at'"),
        (["--input", "{}", "--run-at", "0001-01-01T00:00:00+05:00"], "'--run-at'"),
        (["--input", "{}", "--priority", "99999999999"], "'--priority'"),
        (["--input", "{}", "--max-attempts", "99999999999"], "'--max-attempts'"),
    ],
)
def test_enqueue_usage_errors_exit_2_and_enqueue_nothing(
    dsn: str, conn: Conn, args: list[str], says: str
) -> None:
    result = failed(x_jobs("enqueue", "job", *args, "--dsn", dsn), 2)
    assert says in result.stderr
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_enqueue_run_at_without_offset_is_checked_in_the_session_timezone(
    dsn: str, conn: Conn
) -> None:
    # 9999-12-31T23:59:59 in New York is in the year 10000 in UTC; in UTC it is just in.
    late = ["enqueue", "job", "--input", "{}", "--run-at", "9999-12-31T23:59:59", "--dsn", dsn]
    result = failed(x_jobs(*late, env={"PGTZ": "America/New_York"}), 2)
    assert "'--run-at'" in result.stderr
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)
    job = as_json(x_jobs(*late, "--json", env={"PGTZ": "UTC"}))
    doc = as_json(x_jobs("jobs", "show", str(job["id"]), "--json", "--dsn", dsn))
    assert doc["job"]["run_at"] == "9999-12-31T23:59:59+00:00"


def test_times_near_the_year_10000_show_in_any_session_timezone(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """14 hours ahead of UTC (Pacific/Kiritimati), the last hours of 9999 in UTC are in the year
    10000 locally, which Python cannot hold: x-jobs reads every time in UTC, so they show as
    they are, never as infinity. A --run-at without an offset is still read in the session's
    own TimeZone (the database's, or PGTZ's when it is set)."""
    monkeypatch.delenv("PGTZ", raising=False)
    conn.execute("SET TimeZone = 'UTC'")
    dbname = conninfo_to_dict(dsn)["dbname"]
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET TimeZone = 'Pacific/Kiritimati'").format(
            sql.Identifier(str(dbname))
        )
    )
    late = enqueue(dsn, "late", "--run-at", "9999-12-31T20:00:00+00:00")
    # Noon in Kiritimati is 22:00 the day before in UTC.
    nearby = enqueue(dsn, "nearby", "--run-at", "2031-05-01T12:00:00")
    # Noon in New York is 17:00 UTC: 07:00 on 10000-01-01 in Kiritimati.
    behind = enqueue(
        dsn, "behind", "--run-at", "9999-12-31T12:00:00", env={"PGTZ": "America/New_York"}
    )
    stored: dict[int, datetime] = dict(conn.execute("SELECT id, run_at FROM x_jobs.job").fetchall())
    assert stored == {
        late: datetime(9999, 12, 31, 20, tzinfo=UTC),
        nearby: datetime(2031, 4, 30, 22, tzinfo=UTC),
        behind: datetime(9999, 12, 31, 17, tzinfo=UTC),
    }

    expected = {
        "late": "9999-12-31T20:00:00+00:00",
        "nearby": "2031-04-30T22:00:00+00:00",
        "behind": "9999-12-31T17:00:00+00:00",
    }
    jobs = as_json(x_jobs("jobs", "list", "--json", "--dsn", dsn))["jobs"]
    assert {job["name"]: job["run_at"] for job in jobs} == expected
    table = succeeded(x_jobs("jobs", "list", "--dsn", dsn)).stdout
    due = {line.split()[1]: " ".join(line.split()[5:7]) for line in table.splitlines()[1:]}
    assert due == {name: at[:19].replace("T", " ") for name, at in expected.items()}
    shown = succeeded(x_jobs("jobs", "show", str(late), "--dsn", dsn)).stdout
    assert re.search(r"^run at\s+9999-12-31 20:00:00\+00:00\s*$", shown, re.MULTILINE), shown
    doc = as_json(x_jobs("jobs", "show", str(behind), "--json", "--dsn", dsn))
    assert doc["job"]["run_at"] == expected["behind"]


#: Numbers no float holds: more digits than 17, and beyond the range of a double.
EXACT = '{"big": 123456789012345678901234567890.5, "tiny": 1.00000000000000000001, "n": 7}'
HUGE = "1" + "0" * 400


def test_json_options_keep_every_digit(dsn: str, conn: Conn) -> None:
    waiting = enqueue(dsn, "approval")
    suspend_on_wait(conn, waiting)
    sleeping = enqueue(dsn, "nap")
    suspend_on_sleep(conn, sleeping, "w2", "rest")

    job = as_json(
        x_jobs("enqueue", "exact", "--input", EXACT, "--queue", "q", "--json", "--dsn", dsn)
    )
    assert conn.execute(
        "SELECT input::text FROM x_jobs.job WHERE id = %s", [job["id"]]
    ).fetchone() == (
        '{"n": 7, "big": 123456789012345678901234567890.5, "tiny": 1.00000000000000000001}',
    )
    payload = f'{{"amount": {HUGE}.25}}'
    published = x_jobs(
        "events", "publish", "approved", "--key", "k", "--payload", payload, "--dsn", dsn
    )
    assert succeeded(published).stdout.endswith("woke 1 run\n")
    assert conn.execute(
        "SELECT e.payload::text, s.output::text FROM x_jobs.event AS e, x_jobs.step AS s"
        " WHERE s.job_id = %s",
        [waiting],
    ).fetchone() == (payload, payload)
    tiny = "0.1000000000000000000001"
    succeeded(x_jobs("steps", "resolve", str(sleeping), "rest", "--output", tiny, "--dsn", dsn))
    assert conn.execute(
        "SELECT output::text FROM x_jobs.step WHERE job_id = %s", [sleeping]
    ).fetchone() == (tiny,)

    # And back: --json prints the numbers jsonb holds, never Infinity (which is no JSON).
    listed = succeeded(x_jobs("jobs", "list", "--json", "--dsn", dsn)).stdout
    assert "123456789012345678901234567890.5" in listed
    assert "1.00000000000000000001" in listed
    shown = succeeded(x_jobs("jobs", "show", str(waiting), "--json", "--dsn", dsn)).stdout
    assert f'"amount": {HUGE}.25' in shown
    assert "Infinity" not in shown
    human = succeeded(x_jobs("jobs", "show", str(job["id"]), "--dsn", dsn)).stdout
    assert "123456789012345678901234567890.5" in human
    steps = succeeded(x_jobs("jobs", "show", str(sleeping), "--dsn", dsn)).stdout
    assert tiny in steps


NAMES = ("forever", "far", "ancient")


def test_times_python_cannot_hold_show_as_infinity(dsn: str, conn: Conn) -> None:
    """'infinity' (a run suspended on an event with no timeout), and years past 9999 or BC:
    the page that holds them is still read, the time shown as infinity or -infinity."""
    # In a queue of their own, which suspend_on_wait's claim does not serve.
    forever, far, ancient = (enqueue(dsn, name, "--queue", "far") for name in NAMES)
    for job_id, run_at in [
        (forever, "infinity"),
        (far, "10000-01-01 04:59:59+00"),
        (ancient, "0044-03-15 00:00:00+00 BC"),
    ]:
        conn.execute(
            "UPDATE x_jobs.job SET run_at = %s::timestamptz, state = 'delayed' WHERE id = %s",
            [run_at, job_id],
        )
    suspend_on_wait(conn, enqueue(dsn, "approval"))
    conn.execute("UPDATE x_jobs.step SET timeout_at = 'infinity', since = '-infinity'")
    message = put(conn, "audit", {})
    conn.execute("UPDATE x_jobs.outbox SET available_at = 'infinity'")

    table = succeeded(x_jobs("jobs", "list", "--dsn", dsn)).stdout
    due = {line.split()[1]: line.split()[5] for line in table.splitlines()[1:]}
    assert (due["forever"], due["far"], due["ancient"]) == (
        "infinity",
        "infinity",
        "-infinity",
    )
    jobs = as_json(x_jobs("jobs", "list", "--json", "--dsn", dsn))["jobs"]
    assert {j["name"]: j["run_at"] for j in jobs if j["name"] != "approval"} == {
        "forever": "infinity",
        "far": "infinity",
        "ancient": "-infinity",
    }
    shown = succeeded(x_jobs("jobs", "show", str(forever), "--dsn", dsn)).stdout
    assert re.search(r"^run at\s+infinity\s*$", shown, re.MULTILINE), shown
    approval = next(j["id"] for j in jobs if j["name"] == "approval")
    steps = succeeded(x_jobs("jobs", "show", str(approval), "--dsn", dsn)).stdout
    assert "infinity" in steps
    [step] = as_json(x_jobs("jobs", "show", str(approval), "--json", "--dsn", dsn))["steps"]
    assert (step["timeout_at"], step["since"]) == ("infinity", "-infinity")

    outbox = succeeded(x_jobs("outbox", "list", "--dsn", dsn)).stdout
    assert "infinity" in outbox
    doc = as_json(x_jobs("outbox", "show", str(message), "--json", "--dsn", dsn))
    assert doc["message"]["available_at"] == "infinity"


def test_intervals_python_cannot_hold_do_not_hide_the_page(dsn: str, conn: Conn) -> None:
    """PostgreSQL's intervals reach 178 million years, Python's timedelta 2.7 million: a job
    enqueued with such a backoff made jobs list and show fail for every job on the page."""
    row = conn.execute(
        "SELECT (x_jobs.enqueue('patient', backoff_max => '100000000 years')).id"
    ).fetchone()
    assert row is not None
    other = enqueue(dsn, "other")
    listed = succeeded(x_jobs("jobs", "list", "--dsn", dsn)).stdout
    assert {row[0], other} <= set(listed_ids(listed))
    shown = succeeded(x_jobs("jobs", "show", str(row[0]), "--dsn", dsn)).stdout
    assert re.search(r"^backoff\s+0:00:01 \.\. 999999999 days", shown, re.MULTILINE), shown
    doc = as_json(x_jobs("jobs", "show", str(row[0]), "--json", "--dsn", dsn))
    assert doc["job"]["backoff_max"] == timedelta.max.total_seconds()


def test_json_nested_deeper_than_python_reads_shows_as_its_text(dsn: str, conn: Conn) -> None:
    """jsonb holds 5,000 nested arrays, which Python's json cannot decode (and 500 levels are
    too deep to copy and encode back): jobs list and show print such a value as jsonb's own
    text, still valid JSON under --json, where they ended in a RecursionError."""
    deep_input = "[" * 5000 + "]" * 5000
    deep_output = '{"a": ' * 500 + "1" + "}" * 500
    row = conn.execute(
        "SELECT (x_jobs.enqueue('deep', input => %s::jsonb)).id", [deep_input]
    ).fetchone()
    assert row is not None
    job_id = row[0]
    conn.execute(
        "UPDATE x_jobs.job SET output = %s::jsonb, progress = %s::jsonb WHERE id = %s",
        [deep_output, deep_input, job_id],
    )
    other = enqueue(dsn, "shallow")
    # --input takes it too (Python cannot check it: the database does).
    typed = as_json(x_jobs("enqueue", "typed", "--input", deep_input, "--json", "--dsn", dsn))["id"]
    assert conn.execute("SELECT input::text FROM x_jobs.job WHERE id = %s", [typed]).fetchone() == (
        deep_input,
    )
    conn.execute("DELETE FROM x_jobs.job WHERE id = %s", [typed])

    listed = succeeded(x_jobs("jobs", "list", "--dsn", dsn)).stdout
    assert set(listed_ids(listed)) == {job_id, other}
    shown = succeeded(x_jobs("jobs", "show", str(job_id), "--dsn", dsn)).stdout
    assert "[" * 100 in shown
    assert '{"a": {"a": ' in shown

    # The documents are valid JSON, with the very values the table holds (PostgreSQL parses
    # them: Python's json could not).
    for command, path in [
        (["jobs", "list"], ["jobs", "1"]),  # newest first: "shallow" is 0
        (["jobs", "show", str(job_id)], ["job"]),
    ]:
        printed = succeeded(x_jobs(*command, "--json", "--dsn", dsn)).stdout
        same = conn.execute(
            "SELECT (%(doc)s::jsonb #> %(path)s) -> 'input' = input,"
            " (%(doc)s::jsonb #> %(path)s) -> 'output' = output,"
            " (%(doc)s::jsonb #> %(path)s) -> 'progress' = progress"
            " FROM x_jobs.job WHERE id = %(id)s",
            {"doc": printed, "path": path, "id": job_id},
        ).fetchone()
        assert same == (True, True, True), command
    shown_json = succeeded(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", dsn)).stdout
    assert conn.execute(
        "SELECT %s::jsonb -> 'progress' = progress FROM x_jobs.job WHERE id = %s",
        [shown_json, job_id],
    ).fetchone() == (True,)


def test_jobs_list_pages_with_before(dsn: str, conn: Conn) -> None:
    ids = [enqueue(dsn, f"job{n}") for n in range(5)]
    enqueue(dsn, "elsewhere", "--queue", "other")

    first = succeeded(x_jobs("jobs", "list", "--queue", "default", "--limit", "2", "--dsn", dsn))
    assert listed_ids(first.stdout) == [ids[4], ids[3]]  # newest first
    follow = f"x-jobs jobs list --queue default --limit 2 --before {ids[3]}"
    assert f"next page: {follow}" in first.stdout

    second = succeeded(x_jobs(*follow.split()[1:], "--dsn", dsn))
    assert listed_ids(second.stdout) == [ids[2], ids[1]]
    assert f"--before {ids[1]}" in second.stdout

    last = succeeded(
        x_jobs(
            "jobs",
            "list",
            "--queue",
            "default",
            "--limit",
            "2",
            "--before",
            str(ids[1]),
            "--dsn",
            dsn,
        )
    )
    assert listed_ids(last.stdout) == [ids[0]]
    assert "next page" not in last.stdout  # a partial page is the last one

    paged = as_json(x_jobs("jobs", "list", "--limit", "3", "--json", "--dsn", dsn))
    assert [job["id"] for job in paged["jobs"]] == [ids[4] + 1, ids[4], ids[3]]
    assert paged["next_before"] == ids[3]
    rest = as_json(x_jobs("jobs", "list", "--before", str(ids[3]), "--json", "--dsn", dsn))
    assert [job["id"] for job in rest["jobs"]] == [ids[2], ids[1], ids[0]]
    assert rest["next_before"] is None

    conn.execute("SELECT x_jobs.cancel(id => %s)", [ids[2]])
    cancelled = as_json(x_jobs("jobs", "list", "--state", "cancelled", "--json", "--dsn", dsn))
    assert [job["id"] for job in cancelled["jobs"]] == [ids[2]]
    nothing = succeeded(x_jobs("jobs", "list", "--state", "dead", "--dsn", dsn))
    assert nothing.stdout.strip() == "no jobs"


def test_jobs_list_fits_a_terminal_of_80_columns(dsn: str) -> None:
    for n in range(3):
        enqueue(dsn, f"send_email_{n}", "--queue", "mail")
    table = succeeded(x_jobs("jobs", "list", "--dsn", dsn, env={"COLUMNS": "80"})).stdout
    assert all(len(line) <= 80 for line in table.splitlines()), table
    assert [line.split()[1:3] for line in table.splitlines() if re.match(r"\s*\d", line)] == [
        [f"send_email_{n}", "mail"] for n in (2, 1, 0)
    ]


def test_jobs_show_prints_the_row_and_its_errors_oldest_first(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "send_email", "--max-attempts", "2", "--idempotency-key", "k1")
    fail_twice(conn, job_id)

    shown = succeeded(x_jobs("jobs", "show", str(job_id), "--dsn", dsn)).stdout
    fields = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in shown.split("errors, oldest first")[0].splitlines()
        if re.match(r"^[a-z]", line) and re.search(r"\S\s{2,}\S", line)
    )
    assert fields["id"] == str(job_id)
    assert fields["name"] == "send_email"
    assert fields["queue"] == "default"
    assert fields["state"] == "dead"
    assert fields["attempt"] == "2/2"
    assert fields["idempotency key"] == "k1"
    assert fields["lease until"] == "-"  # settled: no lease, no worker
    assert fields["claimed by"] == "-"
    assert fields["last error"] == "second boom"
    assert 'File "jobs.py", line 2' in shown

    errors = shown.split("errors, oldest first")[1]
    # Markup in an error is printed as it is, not read by rich.
    assert errors.index("first [red]boom[/red]") < errors.index("second boom")
    assert errors.index('File "jobs.py", line 1') < errors.index('File "jobs.py", line 2')
    assert re.search(r"^\s+1\s+\S+ \S+\s+w1\s+first", errors, re.MULTILINE), errors
    assert re.search(r"^\s+2\s+\S+ \S+\s+w2\s+second", errors, re.MULTILINE), errors

    doc = as_json(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", dsn))
    job = doc["job"]
    assert (job["id"], job["state"], job["attempt"], job["max_attempts"]) == (job_id, "dead", 2, 2)
    assert job["last_error"] == "second boom"
    assert job["last_error_stack"] == 'Traceback:\n  File "jobs.py", line 2'
    assert [
        {k: e[k] for k in ("attempt", "worker", "error", "error_stack")} for e in doc["errors"]
    ] == [
        {
            "attempt": 1,
            "worker": "w1",
            "error": "first [red]boom[/red]",
            "error_stack": 'Traceback:\n  File "jobs.py", line 1',
        },
        {
            "attempt": 2,
            "worker": "w2",
            "error": "second boom",
            "error_stack": 'Traceback:\n  File "jobs.py", line 2',
        },
    ]
    failed_at = [datetime.fromisoformat(e["failed_at"]) for e in doc["errors"]]
    assert failed_at == sorted(failed_at)

    # Every column of x_jobs.job is in the JSON row.
    columns = {
        str(name)
        for (name,) in conn.execute(
            "SELECT attname FROM pg_catalog.pg_attribute"
            " WHERE attrelid = 'x_jobs.job'::regclass AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
    }
    assert set(job) == columns

    fresh = succeeded(x_jobs("jobs", "show", str(enqueue(dsn, "clean")), "--dsn", dsn))
    assert "no errors recorded" in fresh.stdout


def test_jobs_retry_and_cancel_change_the_row(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "send_email", "--max-attempts", "2")
    fail_twice(conn, job_id)

    def row() -> tuple[Any, ...]:
        found = conn.execute(
            "SELECT state::text, attempt, claimed_by FROM x_jobs.job WHERE id = %s", [job_id]
        ).fetchone()
        assert found is not None
        return found

    assert row() == ("dead", 2, None)
    retried = succeeded(x_jobs("jobs", "retry", str(job_id), "--dsn", dsn))
    assert f"job {job_id} re-queued: ready" in retried.stdout
    assert row() == ("ready", 0, None)

    # A live job cannot be retried: the SQL's refusal, its message and hint.
    refused = failed(x_jobs("jobs", "retry", str(job_id), "--dsn", dsn), 1)
    line, hint = one_line_and_hint(refused)
    assert line == f"x-jobs: X_JOB_NOT_RETRYABLE: job {job_id} is ready"
    assert "Only dead, failed and cancelled jobs can be retried" in hint

    # Cancel a running job: it loses its worker at once.
    conn.execute("SELECT * FROM x_jobs.claim(queues => ARRAY['default'], worker => 'w3')")
    assert row() == ("running", 1, "w3")
    cancelled = succeeded(x_jobs("jobs", "cancel", str(job_id), "--dsn", dsn))
    assert cancelled.stdout.strip() == f"job {job_id} cancelled"
    assert row() == ("cancelled", 1, None)

    again = as_json(x_jobs("jobs", "cancel", str(job_id), "--json", "--dsn", dsn))
    assert again == {"id": job_id, "cancelled": False, "state": "cancelled"}
    said = succeeded(x_jobs("jobs", "cancel", str(job_id), "--dsn", dsn)).stdout.strip()
    assert said == f"job {job_id} had already finished (cancelled); nothing changed"

    back = as_json(x_jobs("jobs", "retry", str(job_id), "--json", "--dsn", dsn))
    assert back == {"id": job_id, "retried": True, "state": "ready"}
    assert row() == ("ready", 0, None)


def _bulk_fixture(dsn: str, conn: Conn) -> dict[str, list[int]]:
    """Jobs of two queues and names: mail's ready (two of send_email, one of digest), media's
    one ready; and a dead send_email of mail."""
    made = {
        "mail": [enqueue(dsn, "send_email", "--queue", "mail") for _ in range(2)],
        "digest": [enqueue(dsn, "digest", "--queue", "mail")],
        "media": [enqueue(dsn, "thumbnail", "--queue", "media")],
        "dead": [enqueue(dsn, "send_email", "--queue", "mail", "--max-attempts", "1")],
    }
    conn.execute(
        "SELECT x_jobs.claim(queues => ARRAY['mail'], worker => 'w1', qty => 10)"
    )  # every ready job of mail; those that are not dead are handed back below
    conn.execute("SELECT x_jobs.fail(id => %s, worker => 'w1', error => 'boom')", [made["dead"][0]])
    conn.execute(
        "SELECT x_jobs.release(ids => %s::bigint[], worker => 'w1')",
        [made["mail"] + made["digest"]],
    )
    return made


def _job_states(conn: Conn, ids: list[int]) -> list[str]:
    rows = conn.execute(
        "SELECT state::text FROM x_jobs.job WHERE id = ANY (%s) ORDER BY id", [ids]
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_jobs_cancel_and_retry_by_filter(dsn: str, conn: Conn) -> None:
    made = _bulk_fixture(dsn, conn)
    assert _job_states(conn, made["dead"]) == ["dead"]

    cancelled = succeeded(
        x_jobs("jobs", "cancel", "--queue", "mail", "--name", "send_email", "--yes", "--dsn", dsn)
    )
    assert cancelled.stdout.strip() == "2 jobs cancelled"
    assert _job_states(conn, made["mail"]) == ["cancelled", "cancelled"]
    assert _job_states(conn, made["digest"] + made["media"] + made["dead"]) == [
        "ready",
        "ready",
        "dead",
    ]

    doc = as_json(x_jobs("jobs", "cancel", "--queue", "mail", "--yes", "--json", "--dsn", dsn))
    assert doc == {"cancelled": 1}
    nothing = succeeded(x_jobs("jobs", "cancel", "--queue", "mail", "--yes", "--dsn", dsn))
    assert nothing.stdout.strip() == "no job to cancel matches queue=mail; nothing changed"
    assert as_json(x_jobs("jobs", "cancel", "--queue", "mail", "--json", "--dsn", dsn)) == {
        "cancelled": 0
    }  # nothing to confirm: no --yes needed

    # A bare retry of the queue takes its dead job, not those cancelled on purpose.
    retried = succeeded(x_jobs("jobs", "retry", "--queue", "mail", "--yes", "--dsn", dsn))
    assert retried.stdout.strip() == "1 job retried"
    assert _job_states(conn, made["dead"]) == ["ready"]
    assert _job_states(conn, made["mail"]) == ["cancelled", "cancelled"]
    doc = as_json(
        x_jobs(
            "jobs",
            "retry",
            "--queue",
            "mail",
            "--state",
            "cancelled",
            "--yes",
            "--json",
            "--dsn",
            dsn,
        )
    )
    assert doc == {"retried": 3}
    assert _job_states(conn, made["mail"] + made["digest"]) == ["ready"] * 3

    # The database's refusals of a filter: exit 1, its code and hint.
    refused = failed(x_jobs("jobs", "cancel", "--state", "done", "--yes", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(refused)
    assert line == "x-jobs: X_STATE_NOT_ALLOWED: cannot cancel jobs that are done"
    assert hint.startswith("hint: Cancel jobs that are ready, delayed, suspended or running")
    refused = failed(
        x_jobs(
            "jobs",
            "retry",
            "--created-after",
            "2030-01-02T00:00:00+00:00",
            "--created-before",
            "2030-01-01T00:00:00+00:00",
            "--yes",
            "--json",
            "--dsn",
            dsn,
        ),
        1,
    )
    assert json.loads(refused.stdout)["error"]["code"] == "X_RANGE_EMPTY"


def test_jobs_cancel_by_filter_without_a_terminal_needs_yes(dsn: str, conn: Conn) -> None:
    made = _bulk_fixture(dsn, conn)
    refused = failed(x_jobs("jobs", "cancel", "--queue", "mail", "--dsn", dsn), 2)
    line, hint = one_line_and_hint(refused)
    assert line == (
        "x-jobs: X_USAGE: cancelling 3 jobs matching queue=mail needs a confirmation, and stdin"
        " is not a terminal"
    )
    assert hint == "hint: Pass --yes to cancel them without asking."
    doc = json.loads(
        failed(x_jobs("jobs", "retry", "--state", "dead", "--json", "--dsn", dsn), 2).stdout
    )
    assert doc["error"]["code"] == "X_USAGE"
    assert doc["error"]["message"].startswith("X_USAGE: retrying 1 job matching state=dead ")
    assert _job_states(conn, made["mail"] + made["digest"] + made["dead"]) == [
        "ready",
        "ready",
        "ready",
        "dead",
    ]


def test_jobs_cancel_by_filter_works_in_batches(
    dsn: str, conn: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [enqueue(dsn, "many", "--queue", "bulk") for _ in range(7)]
    monkeypatch.setattr(_bulk, "BULK_BATCH", 2)
    done = succeeded(x_jobs("jobs", "cancel", "--queue", "bulk", "--yes", "--dsn", dsn))
    assert done.stdout.strip() == "7 jobs cancelled"
    assert _job_states(conn, ids) == ["cancelled"] * 7


def test_jobs_cancel_ids_and_filters_are_not_mixed(dsn: str) -> None:
    job_id = enqueue(dsn, "one")
    for args in (
        ["jobs", "cancel", str(job_id), "--queue", "default"],
        ["jobs", "retry", str(job_id), "--state", "dead"],
        ["jobs", "cancel"],
        ["jobs", "retry"],
    ):
        result = failed(x_jobs(*args, "--json", "--dsn", dsn), 2)
        assert json.loads(result.stdout)["error"]["code"] == "X_USAGE", args


def test_jobs_cancel_and_retry_several_ids(dsn: str, conn: Conn) -> None:
    first, second = enqueue(dsn, "a"), enqueue(dsn, "b")
    both = succeeded(x_jobs("jobs", "cancel", str(first), str(second), "--dsn", dsn))
    assert both.stdout.splitlines() == [f"job {first} cancelled", f"job {second} cancelled"]
    doc = as_json(x_jobs("jobs", "retry", str(first), str(second), "--json", "--dsn", dsn))
    assert doc == {
        "jobs": [
            {"id": first, "retried": True, "state": "ready"},
            {"id": second, "retried": True, "state": "ready"},
        ]
    }
    # One refusal changes none of them: the ids go in one transaction.
    refused = failed(x_jobs("jobs", "cancel", str(first), "424242", "--dsn", dsn), 1)
    assert one_line_and_hint(refused)[0] == "x-jobs: X_JOB_NOT_FOUND: no job has id 424242"
    assert _job_states(conn, [first, second]) == ["ready", "ready"]


def test_jobs_cancel_by_created_time_reads_a_time_without_offset_in_the_sessions_zone(
    dsn: str, conn: Conn
) -> None:
    early, late = enqueue(dsn, "early"), enqueue(dsn, "late")
    conn.execute(
        "UPDATE x_jobs.job SET created_at = CASE id WHEN %s THEN %s::timestamptz"
        " ELSE %s::timestamptz END WHERE id IN (%s, %s)",
        [early, "2030-01-01 00:30:00+00", "2030-01-01 01:30:00+00", early, late],
    )
    # 02:00 at UTC+1 is 01:00 UTC: only the early job was created before it.
    env = {"PGTZ": "Etc/GMT-1"}
    args = ["jobs", "cancel", "--created-before", "2030-01-01T02:00:00", "--yes", "--dsn", dsn]
    assert succeeded(x_jobs(*args, env=env)).stdout.strip() == "1 job cancelled"
    assert _job_states(conn, [early, late]) == ["cancelled", "ready"]


def _read_until(fd: int, marker: bytes) -> bytes:
    """What the terminal ``fd`` prints up to ``marker`` (fails after the test deadline)."""
    seen = b""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} on the terminal, only {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            seen += os.read(fd, 4096)
    return seen


@pytest.mark.parametrize("answer", ["y", "n"])
def test_jobs_cancel_by_filter_asks_on_a_terminal(dsn: str, conn: Conn, answer: str) -> None:
    """On a terminal, the count and a question; only the jobs counted are cancelled, even if
    more match by the time the answer comes."""
    counted = [enqueue(dsn, "send_email", "--queue", "mail") for _ in range(3)]
    env = {**os.environ, "DATABASE_URL": dsn}
    terminal, child_end = os.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "x_jobs", "jobs", "cancel", "--queue", "mail"],
            env=env,
            stdin=child_end,
            stderr=child_end,
            stdout=subprocess.PIPE,
            text=True,
        )
        os.close(child_end)
        shown = _read_until(terminal, b"[y/N]")
        assert b"Cancel 3 jobs matching queue=mail? [y/N]" in shown
        meanwhile = enqueue(dsn, "send_email", "--queue", "mail")
        os.write(terminal, f"{answer}\n".encode())
        out, _ = proc.communicate(timeout=DEADLINE_SECONDS)
    finally:
        os.close(terminal)
    assert proc.returncode == 0
    if answer == "y":
        assert out.strip() == "3 jobs cancelled"
        assert _job_states(conn, [*counted, meanwhile]) == ["cancelled"] * 3 + ["ready"]
    else:
        assert out.strip() == "nothing changed"
        assert _job_states(conn, [*counted, meanwhile]) == ["ready"] * 4


def test_jobs_list_by_name(dsn: str) -> None:
    wanted = [enqueue(dsn, "send_email", "--queue", q) for q in ("mail", "mail", "other")]
    enqueue(dsn, "digest", "--queue", "mail")
    listing = succeeded(x_jobs("jobs", "list", "--name", "send_email", "--dsn", dsn))
    assert listed_ids(listing.stdout) == wanted[::-1]
    doc = as_json(
        x_jobs("jobs", "list", "--name", "send_email", "--queue", "mail", "--json", "--dsn", dsn)
    )
    assert [job["id"] for job in doc["jobs"]] == wanted[1::-1]
    page = succeeded(x_jobs("jobs", "list", "--name", "send_email", "--limit", "1", "--dsn", dsn))
    assert f"next page: x-jobs jobs list --name send_email --limit 1 --before {wanted[2]}" in (
        page.stdout
    )


@pytest.fixture
def old_dsn(admin: Conn) -> Iterator[str]:
    """A database of this test's own with x_jobs 0.4.0, the last version without the readers
    this client reads through."""
    with fresh_database(admin, "template1", prefix="x_jobs_old") as conninfo:
        with psycopg.connect(conninfo, autocommit=True) as old:
            old.execute("CREATE EXTENSION x_jobs VERSION '0.4.0'")
        yield conninfo


def test_commands_on_a_database_before_0_4_1_are_refused_until_it_is_updated(
    old_dsn: str,
) -> None:
    """Each command, bulk forms and manifest included, is refused (exit 2) with the update in
    its hint, before it sends anything; updated in place, the database serves them all, the
    job enqueued before the update included."""
    with psycopg.connect(old_dsn, autocommit=True) as old:
        row = old.execute("SELECT id FROM x_jobs.enqueue('old')").fetchone()
        assert row is not None
        job_id = int(row[0])
        for args in (
            ["jobs", "list", "--name", "old"],
            ["jobs", "show", str(job_id)],
            ["jobs", "cancel", str(job_id)],
            ["jobs", "retry", "--state", "dead", "--yes"],
            ["outbox", "list"],
            ["manifest"],
        ):
            result = failed(x_jobs(*args, "--dsn", old_dsn), 2)
            line, hint = one_line_and_hint(result)
            assert line == (
                "x-jobs: X_VERSION_UNSUPPORTED: this client speaks x_jobs ['0.4.1', '0.4.2'], the"
                " database has 0.4.0"
            ), args
            assert "ALTER EXTENSION x_jobs UPDATE" in hint
        assert old.execute("SELECT state::text FROM x_jobs.result(%s)", [job_id]).fetchone() == (
            "ready",
        )
        old.execute("ALTER EXTENSION x_jobs UPDATE TO '0.4.1'")
    listing = succeeded(x_jobs("jobs", "list", "--name", "old", "--dsn", old_dsn))
    assert listed_ids(listing.stdout) == [job_id]
    shown = as_json(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", old_dsn))
    assert (shown["job"]["id"], shown["job"]["state"]) == (job_id, "ready")
    cancelled = succeeded(x_jobs("jobs", "cancel", str(job_id), "--dsn", old_dsn))
    assert cancelled.stdout.strip() == f"job {job_id} cancelled"


def test_queues_shows_counts_and_pause_resume_toggle_paused(dsn: str, conn: Conn) -> None:
    assert as_json(x_jobs("queues", "--json", "--dsn", dsn)) == {"queues": []}
    empty = succeeded(x_jobs("queues", "--dsn", dsn))
    assert empty.stdout.strip() == "no queue has live jobs or a pause"

    enqueue(dsn, "a", "--queue", "mail")
    enqueue(dsn, "b", "--queue", "mail")
    enqueue(dsn, "c", "--queue", "mail", "--delay", "3600")
    enqueue(dsn, "d", "--queue", "media")
    conn.execute("SELECT * FROM x_jobs.claim(queues => ARRAY['media'], worker => 'w1')")

    def stats() -> dict[str, list[Any]]:
        doc = as_json(x_jobs("queues", "--json", "--dsn", dsn))
        columns = ("ready", "delayed", "suspended", "running", "demand", "paused")
        return {q["queue"]: [q[k] for k in columns] for q in doc["queues"]}

    assert stats() == {"mail": [2, 1, 0, 0, 2, False], "media": [0, 0, 0, 1, 1, False]}
    table = succeeded(x_jobs("queues", "--dsn", dsn)).stdout
    header = [line.split() for line in table.splitlines() if "queue" in line]
    assert header == [["queue", "ready", "delayed", "suspended", "running", "demand", "paused"]]
    assert ["mail", "2", "1", "0", "0", "2", "no"] in [line.split() for line in table.splitlines()]
    assert ["media", "0", "0", "0", "1", "1", "no"] in [line.split() for line in table.splitlines()]

    paused = succeeded(x_jobs("queues", "pause", "mail", "--dsn", dsn))
    assert paused.stdout.strip() == "queue mail paused"
    assert stats()["mail"] == [2, 1, 0, 0, 0, True]  # a paused queue has no demand
    again = as_json(x_jobs("queues", "pause", "mail", "--json", "--dsn", dsn))
    assert again == {"queue": "mail", "paused": True, "changed": False}
    assert "paused already" in succeeded(x_jobs("queues", "pause", "mail", "--dsn", dsn)).stdout
    # Claims skip it now.
    assert conn.execute("SELECT * FROM x_jobs.claim(ARRAY['mail'], 'w2')").fetchall() == []

    # --dsn and --json given to `queues` count for its subcommand too.
    resumed = as_json(x_jobs("queues", "--json", "--dsn", dsn, "resume", "mail"))
    assert resumed == {"queue": "mail", "paused": False, "changed": True}
    assert stats()["mail"] == [2, 1, 0, 0, 2, False]
    not_paused = succeeded(x_jobs("queues", "resume", "mail", "--dsn", dsn))
    assert not_paused.stdout.strip() == "queue mail was not paused"


def put(
    conn: Conn,
    topic: str,
    payload: Any,
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> int:
    row = conn.execute(
        "SELECT x_jobs.outbox_put(topic => %s, payload => %s::jsonb, key => %s,"
        " headers => %s::jsonb)",
        [topic, json.dumps(payload), key, None if headers is None else json.dumps(headers)],
    ).fetchone()
    assert row is not None
    return int(row[0])


def relay_once(
    conn: Conn, *, dead: Mapping[int, str] | None = None, delivered: list[int] | None = None
) -> list[int]:
    """Claim every due message as relay 'r1' (one per key, for an hour), then settle some: the
    ``dead`` ones refused for good with their error, the ``delivered`` ones acked; the rest stay
    in flight. Answers the claimed ids, in id order."""
    claimed = sorted(
        int(message_id)
        for (message_id,) in conn.execute(
            "SELECT id FROM x_jobs.relay_outbox(relay => 'r1', qty => 1000, lease => '1 hour')"
        ).fetchall()
    )
    for message_id, error in (dead or {}).items():
        assert message_id in claimed
        state = conn.execute(
            "SELECT x_jobs.outbox_nack(id => %s, relay => 'r1', error => %s,"
            " retryable => false)::text",
            [message_id, error],
        ).fetchone()
        assert state == ("dead",)
    if delivered:
        acked = conn.execute(
            "SELECT x_jobs.outbox_ack(ids => %s::bigint[], relay => 'r1')", [delivered]
        ).fetchall()
        assert sorted(int(i) for (i,) in acked) == sorted(delivered)
    return claimed


BOOM = "HTTP 500: [red]boom[/red]\n<html>Internal Server Error</html>"


def outbox_of_five(conn: Conn) -> list[int]:
    """Five messages, one of each kind an operator meets: m1 dead (order.paid, key o-1, headers),
    m2 delivered (key o-2), m3 dead (user.created, no key), m4 pending behind m1 (key o-1), m5
    in flight on relay r1 (key o-3)."""
    m1 = put(conn, "order.paid", {"order": 1}, key="o-1", headers={"trace": "t-1"})
    m2 = put(conn, "order.paid", {"order": 2}, key="o-2")
    m3 = put(conn, "user.created", {"user": "ada"})
    m4 = put(conn, "order.paid", {"order": 1, "again": True}, key="o-1")
    m5 = put(conn, "order.paid", {"order": 3}, key="o-3")
    claimed = relay_once(conn, dead={m1: BOOM, m3: "HTTP 410: gone"}, delivered=[m2])
    assert claimed == [m1, m2, m3, m5]  # m4 waits behind m1, the head of its key
    return [m1, m2, m3, m4, m5]


def outbox_row(conn: Conn, message_id: int) -> tuple[Any, ...]:
    """state, attempt, relay, and whether it is due now, of an outbox message."""
    row = conn.execute(
        "SELECT state::text, attempt, relay, available_at <= x_jobs.now() FROM x_jobs.outbox"
        " WHERE id = %s",
        [message_id],
    ).fetchone()
    assert row is not None
    return row


def outbox_columns(conn: Conn) -> set[str]:
    return {
        str(name)
        for (name,) in conn.execute(
            "SELECT attname FROM pg_catalog.pg_attribute"
            " WHERE attrelid = 'x_jobs.outbox'::regclass AND attnum > 0 AND NOT attisdropped"
        ).fetchall()
    }


def test_outbox_list_filters_newest_first(dsn: str, conn: Conn) -> None:
    assert succeeded(x_jobs("outbox", "list", "--dsn", dsn)).stdout.strip() == "no messages"
    assert as_json(x_jobs("outbox", "list", "--json", "--dsn", dsn)) == {
        "messages": [],
        "next_before": None,
    }
    m1, m2, m3, m4, m5 = outbox_of_five(conn)

    table = succeeded(x_jobs("outbox", "list", "--dsn", dsn)).stdout
    assert listed_ids(table) == [m5, m4, m3, m2, m1]
    assert re.split(r"\s{2,}", table.splitlines()[0].strip()) == [
        "id",
        "topic",
        "key",
        "state",
        "attempt",
        "available at (UTC)",
        "last error",
    ]
    rows = {int(line.split()[0]): line for line in table.splitlines() if re.match(r"\s*\d", line)}
    assert rows[m1].split()[1:5] == ["order.paid", "o-1", "dead", "1/10"]
    # The first line of the error, its markup printed as it is.
    assert rows[m1].rstrip().endswith("HTTP 500: [red]boom[/red]")
    assert "<html>" not in table
    assert rows[m2].split()[1:5] == ["order.paid", "o-2", "delivered", "1/10"]
    assert rows[m3].split()[1:5] == ["user.created", "-", "dead", "1/10"]
    assert rows[m4].split()[1:5] == ["order.paid", "o-1", "pending", "0/10"]
    assert rows[m5].split()[1:5] == ["order.paid", "o-3", "inflight", "1/10"]
    lease = conn.execute("SELECT available_at FROM x_jobs.outbox WHERE id = %s", [m5]).fetchone()
    assert lease is not None
    assert lease[0].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") in rows[m5]
    assert "next page" not in table

    def ids(*options: str) -> list[int]:
        doc = as_json(x_jobs("outbox", "list", *options, "--json", "--dsn", dsn))
        return [message["id"] for message in doc["messages"]]

    assert ids("--state", "dead") == [m3, m1]
    assert ids("--state", "delivered") == [m2]
    assert ids("--topic", "order.paid") == [m5, m4, m2, m1]
    assert ids("--key", "o-1") == [m4, m1]
    assert ids("--state", "dead", "--topic", "order.paid", "--key", "o-1") == [m1]
    assert ids("--topic", "no.such.topic") == []
    nothing = succeeded(
        x_jobs("outbox", "list", "--state", "pending", "--key", "o-3", "--dsn", dsn)
    )
    assert nothing.stdout.strip() == "no messages"

    # The whole rows in JSON: every column, headers and payload as JSON, the error whole.
    doc = as_json(x_jobs("outbox", "list", "--state", "dead", "--json", "--dsn", dsn))
    assert doc["next_before"] is None
    dead_m3, dead_m1 = doc["messages"]
    assert set(dead_m1) == outbox_columns(conn)
    assert {k: dead_m1[k] for k in ("topic", "key", "state", "attempt", "max_attempts")} == {
        "topic": "order.paid",
        "key": "o-1",
        "state": "dead",
        "attempt": 1,
        "max_attempts": 10,
    }
    assert (dead_m1["headers"], dead_m1["payload"]) == ({"trace": "t-1"}, {"order": 1})
    assert (dead_m1["last_error"], dead_m1["relay"], dead_m1["delivered_at"]) == (BOOM, None, None)
    assert (dead_m3["key"], dead_m3["headers"], dead_m3["last_error"]) == (
        None,
        {},
        "HTTP 410: gone",
    )

    narrow = succeeded(x_jobs("outbox", "list", "--dsn", dsn, env={"COLUMNS": "80"})).stdout
    assert all(len(line) <= 80 for line in narrow.splitlines()), narrow
    assert listed_ids(narrow) == [m5, m4, m3, m2, m1]


def test_outbox_list_pages_with_before(dsn: str, conn: Conn) -> None:
    m1, m2, _, m4, m5 = outbox_of_five(conn)

    first = succeeded(
        x_jobs("outbox", "list", "--topic", "order.paid", "--limit", "2", "--dsn", dsn)
    )
    assert listed_ids(first.stdout) == [m5, m4]
    follow = f"x-jobs outbox list --topic order.paid --limit 2 --before {m4}"
    assert f"next page: {follow}" in first.stdout

    second = succeeded(x_jobs(*follow.split()[1:], "--dsn", dsn))
    assert listed_ids(second.stdout) == [m2, m1]
    follow = f"x-jobs outbox list --topic order.paid --limit 2 --before {m1}"
    assert f"next page: {follow}" in second.stdout  # a full page may have a next one
    last = succeeded(x_jobs(*follow.split()[1:], "--dsn", dsn))
    assert last.stdout.strip() == "no messages"

    # Every filter given is in the next page's command; a partial page is the last one.
    keyed = succeeded(
        x_jobs("outbox", "list", "--state", "pending", "--key", "o-1", "--limit", "1", "--dsn", dsn)
    )
    assert listed_ids(keyed.stdout) == [m4]
    assert f"next page: x-jobs outbox list --state pending --key o-1 --limit 1 --before {m4}" in (
        keyed.stdout
    )
    rest = succeeded(x_jobs("outbox", "list", "--key", "o-1", "--before", str(m4), "--dsn", dsn))
    assert listed_ids(rest.stdout) == [m1]
    assert "next page" not in rest.stdout

    paged = as_json(x_jobs("outbox", "list", "--limit", "3", "--json", "--dsn", dsn))
    assert [message["id"] for message in paged["messages"]] == [m5, m4, m4 - 1]
    assert paged["next_before"] == m4 - 1
    tail = as_json(x_jobs("outbox", "list", "--before", str(m4 - 1), "--json", "--dsn", dsn))
    assert [message["id"] for message in tail["messages"]] == [m2, m1]
    assert tail["next_before"] is None


def test_outbox_show_prints_every_column(dsn: str, conn: Conn) -> None:
    m1, m2, _, _, m5 = outbox_of_five(conn)

    def fields(output: str) -> dict[str, str]:
        return dict(
            re.split(r"\s{2,}", line.strip(), maxsplit=1)
            for line in output.splitlines()
            if re.match(r"^[a-z]", line) and re.search(r"\S\s{2,}\S", line)
        )

    shown = succeeded(x_jobs("outbox", "show", str(m1), "--dsn", dsn)).stdout
    created = conn.execute("SELECT created_at FROM x_jobs.outbox WHERE id = %s", [m1]).fetchone()
    assert created is not None
    assert {
        k: v for k, v in fields(shown).items() if k not in ("available at", "headers", "payload")
    } == {
        "id": str(m1),
        "topic": "order.paid",
        "key": "o-1",
        "state": "dead",
        "attempt": "1/10",
        "relay": "-",
        "created": created[0].astimezone(UTC).isoformat(sep=" ", timespec="seconds"),
        "delivered": "-",
        "last error": "HTTP 500: [red]boom[/red]",  # then its next lines, markup as it is
        "tenant": "none",
    }
    assert "<html>Internal Server Error</html>" in shown
    assert re.search(r'^headers\s+\{\s*$\s+"trace": "t-1"', shown, re.MULTILINE), shown
    assert re.search(r'^payload\s+\{\s*$\s+"order": 1', shown, re.MULTILINE), shown

    delivered = fields(succeeded(x_jobs("outbox", "show", str(m2), "--dsn", dsn)).stdout)
    assert (delivered["state"], delivered["last error"]) == ("delivered", "-")
    assert delivered["delivered"] != "-"
    inflight = fields(succeeded(x_jobs("outbox", "show", str(m5), "--dsn", dsn)).stdout)
    assert (inflight["state"], inflight["relay"]) == ("inflight", "r1")

    doc = as_json(x_jobs("outbox", "show", str(m1), "--json", "--dsn", dsn))
    message = doc["message"]
    assert set(message) == outbox_columns(conn)
    assert (message["id"], message["state"], message["attempt"]) == (m1, "dead", 1)
    assert (message["headers"], message["payload"], message["last_error"]) == (
        {"trace": "t-1"},
        {"order": 1},
        BOOM,
    )
    assert datetime.fromisoformat(message["created_at"]) == created[0]
    shipped = as_json(x_jobs("outbox", "show", str(m2), "--json", "--dsn", dsn))["message"]
    assert datetime.fromisoformat(shipped["delivered_at"]) >= created[0]


def test_an_unknown_message_id_exits_1_with_x_message_not_found(dsn: str) -> None:
    result = failed(x_jobs("outbox", "show", "424242", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(result)
    assert line == "x-jobs: X_MESSAGE_NOT_FOUND: no outbox message has id 424242"
    assert "x-jobs outbox list" in hint

    result = failed(x_jobs("outbox", "show", "424242", "--json", "--dsn", dsn), 1)
    assert json.loads(result.stdout) == {
        "error": {
            "code": "X_MESSAGE_NOT_FOUND",
            "sqlstate": None,  # the client's own check: no SQL raised it
            "message": "X_MESSAGE_NOT_FOUND: no outbox message has id 424242",
            "hint": hint.removeprefix("hint: "),
        }
    }


def test_outbox_redrive_by_id_and_by_topic_sends_dead_messages_again(dsn: str, conn: Conn) -> None:
    m1, m2, m3, m4, m5 = outbox_of_five(conn)

    # By id: the dead message named goes back; m4, pending, is no dead message.
    said = succeeded(x_jobs("outbox", "redrive", str(m1), str(m4), "--dsn", dsn)).stdout.strip()
    assert said == "1 dead message sent again; 1 of the ids named no dead message"
    assert outbox_row(conn, m1) == ("pending", 0, None, True)
    assert outbox_row(conn, m4) == ("pending", 0, None, True)
    assert outbox_row(conn, m3) == ("dead", 1, None, True)
    assert outbox_row(conn, m2)[0] == "delivered"
    assert outbox_row(conn, m5)[:3] == ("inflight", 1, "r1")

    again = as_json(x_jobs("outbox", "redrive", str(m1), "--json", "--dsn", dsn))
    assert again == {"redriven": 0, "ids": [m1], "topic": None, "limit": 1000}
    nothing = succeeded(x_jobs("outbox", "redrive", str(m2), "--dsn", dsn)).stdout.strip()
    assert nothing == "no dead message matched; nothing changed"

    # By topic: every dead message of it.
    doc = as_json(x_jobs("outbox", "redrive", "--topic", "user.created", "--json", "--dsn", dsn))
    assert doc == {"redriven": 1, "ids": [], "topic": "user.created", "limit": 1000}
    assert outbox_row(conn, m3) == ("pending", 0, None, True)

    # A relay takes them again: m1 heads its key again, m4 waits behind it.
    assert relay_once(conn) == [m1, m3]
    assert outbox_row(conn, m1)[:3] == ("inflight", 1, "r1")


def test_outbox_redrive_by_topic_goes_oldest_first_up_to_the_limit(dsn: str, conn: Conn) -> None:
    a1, a2, a3 = (put(conn, "audit", {"n": n}) for n in range(3))
    other = put(conn, "other", {})
    relay_once(conn, dead={a1: "e1", a2: "e2", a3: "e3", other: "e4"})

    said = succeeded(x_jobs("outbox", "redrive", "--topic", "audit", "--limit", "2", "--dsn", dsn))
    assert said.stdout.strip() == (
        "2 dead messages sent again; there may be more: run it again to send the next 2"
    )
    assert [outbox_row(conn, i)[:2] for i in (a1, a2, a3, other)] == [
        ("pending", 0),
        ("pending", 0),
        ("dead", 1),
        ("dead", 1),
    ]

    # Ids and a topic: only the ids of that topic.
    both = succeeded(
        x_jobs("outbox", "redrive", str(a3), str(other), "--topic", "audit", "--dsn", dsn)
    )
    assert both.stdout.strip() == "1 dead message sent again; 1 of the ids named no dead message"
    assert (outbox_row(conn, a3)[0], outbox_row(conn, other)[0]) == ("pending", "dead")


def test_outbox_redrive_by_ids_says_when_the_limit_cut_them_off(dsn: str, conn: Conn) -> None:
    a1, a2, a3 = (put(conn, "audit", {"n": n}) for n in range(3))
    relay_once(conn, dead={a1: "e1", a2: "e2", a3: "e3"})
    ids = [str(a1), str(a2), str(a3)]
    said = succeeded(x_jobs("outbox", "redrive", *ids, "--limit", "2", "--dsn", dsn))
    assert said.stdout.strip() == (
        "2 dead messages sent again; the --limit of 2 was reached: run it again for the other ids"
    )
    assert [outbox_row(conn, i)[0] for i in (a1, a2, a3)] == ["pending", "pending", "dead"]
    # Under the limit, ids that sent nothing named no dead message.
    said = succeeded(x_jobs("outbox", "redrive", *ids, "--limit", "5", "--dsn", dsn))
    assert said.stdout.strip() == "1 dead message sent again; 2 of the ids named no dead message"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["outbox", "redrive"], "give their IDs, --topic, or both"),
        (["outbox", "redrive", "--limit", "5"], "give their IDs, --topic, or both"),
        (["outbox", "redrive", "one"], "'ID'"),
        (["outbox", "show", "one"], "'ID'"),
        (["outbox", "show"], "ID"),
        (["outbox", "list", "--before", "x"], "'--before'"),
        (["outbox", "list", "--limit", "many"], "'--limit'"),
        (["outbox", "list", "--limit", "0"], "'--limit'"),
        (["outbox", "list", "--limit", "1001"], "'--limit'"),
        (["jobs", "list", "--limit", "0"], "'--limit'"),
        (["outbox", "redrive", "99999999999999999999"], "'ID'"),
        (["outbox", "redrive", "--topic", "audit", "--limit", "3000000000"], "'--limit'"),
        (["outbox", "show", "99999999999999999999"], "'ID'"),
        (["outbox", "list", "--before", "99999999999999999999"], "'--before'"),
    ],
)
def test_outbox_usage_errors_exit_2_and_change_nothing(
    dsn: str, conn: Conn, args: list[str], says: str
) -> None:
    dead = put(conn, "audit", {})
    relay_once(conn, dead={dead: "gone"})
    result = failed(x_jobs(*args, "--dsn", dsn), 2)
    assert says in result.stderr
    assert outbox_row(conn, dead)[:2] == ("dead", 1)  # a bare redrive sends nothing again


@pytest.mark.parametrize(
    ("args", "line", "hint"),
    [
        (
            ["outbox", "list", "--state", "nope"],
            "X_STATE_UNKNOWN: 'nope' is not an outbox state",
            "Use one of: pending, inflight, delivered, dead.",
        ),
        (
            ["outbox", "list", "--state", "ready"],  # a job state
            "X_STATE_UNKNOWN: 'ready' is not an outbox state",
            "Use one of: pending, inflight, delivered, dead.",
        ),
        (
            ["outbox", "redrive", "--topic", "audit", "--limit", "0"],
            "X_QTY_INVALID: max_rows 0 is outside 1..100000",
            "Redrive in batches of up to 100000, and call again for more.",
        ),
    ],
)
def test_outbox_refusals_exit_1_with_their_code_and_hint(
    dsn: str, args: list[str], line: str, hint: str
) -> None:
    said = one_line_and_hint(failed(x_jobs(*args, "--dsn", dsn), 1))
    assert said == (f"x-jobs: {line}", f"hint: {hint}")
    doc = json.loads(failed(x_jobs(*args, "--json", "--dsn", dsn), 1).stdout)["error"]
    assert (doc["code"], doc["message"], doc["hint"]) == (line.split(":", 1)[0], line, hint)


def claim(conn: Conn, job_id: int, worker: str) -> None:
    claimed = conn.execute(
        "SELECT id FROM x_jobs.claim(queues => ARRAY['default'], worker => %s, qty => 1)",
        [worker],
    ).fetchall()
    assert claimed == [(job_id,)]


def suspend_on_wait(conn: Conn, job_id: int, worker: str = "w1") -> None:
    """Claim the job as ``worker`` and suspend its run on step 'approve', a wait for the event
    'approved' with key 'k', as a workflow body would."""
    claim(conn, job_id, worker)
    step = conn.execute(
        "SELECT status::text FROM x_jobs.step_wait(id => %s, worker => %s, step => 'approve',"
        " event => 'approved', event_key => 'k')",
        [job_id, worker],
    ).fetchone()
    assert step == ("waiting",)
    assert job_state(conn, job_id) == "suspended"


def suspend_on_sleep(conn: Conn, job_id: int, worker: str, step: str) -> None:
    claim(conn, job_id, worker)
    slept = conn.execute(
        "SELECT status::text FROM x_jobs.step_sleep(id => %s, worker => %s, step => %s,"
        " duration => '1 day')",
        [job_id, worker, step],
    ).fetchone()
    assert slept == ("waiting",)
    assert job_state(conn, job_id) == "suspended"


def job_state(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT state::text FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return str(row[0])


def step_row(conn: Conn, job_id: int, name: str) -> tuple[Any, ...]:
    """status, output, event_id, resolved_by of a job's (non-compensation) step."""
    row = conn.execute(
        "SELECT status::text, output, event_id, resolved_by FROM x_jobs.step"
        " WHERE job_id = %s AND name = %s AND NOT compensation",
        [job_id, name],
    ).fetchone()
    assert row is not None
    return row


def test_events_publish_wakes_the_run_waiting_for_its_event_and_key(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "approval")
    suspend_on_wait(conn, job_id)

    # Another key resolves nothing: the run sleeps on.
    other = as_json(
        x_jobs("events", "publish", "approved", "--key", "other", "--json", "--dsn", dsn)
    )
    assert other["woken"] == 0
    assert job_state(conn, job_id) == "suspended"
    assert step_row(conn, job_id, "approve") == ("waiting", None, None, None)

    published = as_json(
        x_jobs(
            "events",
            "publish",
            "approved",
            "--key",
            "k",
            "--payload",
            '{"ok":true}',
            "--json",
            "--dsn",
            dsn,
        )
    )
    event = conn.execute(
        "SELECT id, name, key, payload FROM x_jobs.event WHERE key = 'k'"
    ).fetchone()
    assert event is not None
    assert published == {"event_id": event[0], "woken": 1}
    assert event[1:] == ("approved", "k", {"ok": True})
    assert other["event_id"] < published["event_id"]
    assert job_state(conn, job_id) == "ready"
    assert step_row(conn, job_id, "approve") == ("done", {"ok": True}, event[0], "event")


def test_events_publish_with_no_waiter_wakes_none(dsn: str, conn: Conn) -> None:
    said = succeeded(x_jobs("events", "publish", "order.paid", "--dsn", dsn)).stdout.strip()
    [(event_id, key, payload)] = conn.execute(
        "SELECT id, key, payload FROM x_jobs.event WHERE name = 'order.paid'"
    ).fetchall()
    assert said == f"event 'order.paid' published as id {event_id}: no run waited for it"
    assert (key, payload) == (None, None)  # no --payload: SQL NULL, the API's default

    doc = as_json(
        x_jobs("events", "publish", "order.paid", "--payload", "null", "--json", "--dsn", dsn)
    )
    assert doc == {"event_id": event_id + 1, "woken": 0}
    row = conn.execute(
        "SELECT payload IS NULL, jsonb_typeof(payload) FROM x_jobs.event WHERE id = %s",
        [doc["event_id"]],
    ).fetchone()
    assert row == (False, "null")  # --payload null: the JSON null


def test_steps_resolve_ends_a_sleep_and_the_run_is_ready(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "reminder")
    suspend_on_sleep(conn, job_id, "w1", "nap")

    human = succeeded(
        x_jobs("steps", "resolve", str(job_id), "nap", "--output", '{"early": true}', "--dsn", dsn)
    ).stdout
    fields = dict(
        re.split(r"\s{2,}", line.strip(), maxsplit=1)
        for line in human.splitlines()
        if re.search(r"\S\s{2,}\S", line)
    )
    assert {k: fields[k] for k in ("job", "step", "kind", "status", "resolved by")} == {
        "job": str(job_id),
        "step": "nap",
        "kind": "sleep",
        "status": "done",
        "resolved by": "operator",
    }
    assert human.splitlines()[-1] == f"job {job_id} is ready"
    assert job_state(conn, job_id) == "ready"
    assert step_row(conn, job_id, "nap") == ("done", {"early": True}, None, "operator")
    due = conn.execute(
        "SELECT run_at <= x_jobs.now() FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert due == (True,)  # due at once, not in a day

    # A resolved step cannot be resolved again.
    again = failed(x_jobs("steps", "resolve", str(job_id), "nap", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(again)
    assert line == f"x-jobs: X_STEP_NOT_WAITING: step 'nap' of job {job_id} is done"
    assert "Only a waiting step" in hint

    # The next sleep of the run, resolved without --output: SQL NULL.
    suspend_on_sleep(conn, job_id, "w2", "nap2")
    doc = as_json(x_jobs("steps", "resolve", str(job_id), "nap2", "--json", "--dsn", dsn))
    assert doc["state"] == "ready"
    step = doc["step"]
    assert {k: step[k] for k in ("job_id", "name", "kind", "status", "output", "resolved_by")} == {
        "job_id": job_id,
        "name": "nap2",
        "kind": "sleep",
        "status": "done",
        "output": None,
        "resolved_by": "operator",
    }
    assert step["compensation"] is False
    resolved_at = datetime.fromisoformat(step["resolved_at"])
    assert resolved_at >= datetime.fromisoformat(step["created_at"])
    assert job_state(conn, job_id) == "ready"


def test_steps_resolve_refusals_change_nothing(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "approval")
    claim(conn, job_id, "w1")

    # While a worker holds the run, its body may be about to record the step itself.
    held = failed(x_jobs("steps", "resolve", str(job_id), "approve", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(held)
    assert line == f"x-jobs: X_JOB_HELD: job {job_id} is running on worker 'w1'"
    assert "Resolve a step while its run is suspended" in hint
    doc = json.loads(
        failed(x_jobs("steps", "resolve", str(job_id), "approve", "--json", "--dsn", dsn), 1).stdout
    )
    assert (doc["error"]["code"], doc["error"]["sqlstate"]) == ("X_JOB_HELD", "XJ030")
    assert job_state(conn, job_id) == "running"

    conn.execute("SELECT x_jobs.release(ids => ARRAY[%s]::bigint[], worker => 'w1')", [job_id])
    suspend_on_wait(conn, job_id, "w2")
    unknown = failed(x_jobs("steps", "resolve", str(job_id), "aprove", "--dsn", dsn), 1)
    line, hint = one_line_and_hint(unknown)
    assert line == f"x-jobs: X_STEP_NOT_FOUND: job {job_id} has no step 'aprove'"
    assert "x-jobs jobs show" in hint
    doc = json.loads(
        failed(x_jobs("steps", "resolve", str(job_id), "aprove", "--json", "--dsn", dsn), 1).stdout
    )
    assert (doc["error"]["code"], doc["error"]["sqlstate"]) == ("X_STEP_NOT_FOUND", "XJ031")

    assert job_state(conn, job_id) == "suspended"
    assert step_row(conn, job_id, "approve") == ("waiting", None, None, None)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["events", "publish", "approved", "--payload", "{nope"], "'--payload'"),
        (["events", "publish", "approved", "--payload", "Infinity"], "'--payload'"),
        (["steps", "resolve", "1", "approve", "--output", "{nope"], "'--output'"),
        (["steps", "resolve", "1", "approve", "--output", "NaN"], "'--output'"),
        (["steps", "resolve", "one", "approve"], "'JOB'"),
        (["steps", "resolve", "1"], "STEP"),
    ],
)
def test_publish_and_resolve_usage_errors_exit_2_and_change_nothing(
    dsn: str, conn: Conn, args: list[str], says: str
) -> None:
    job_id = enqueue(dsn, "approval")
    suspend_on_wait(conn, job_id)
    result = failed(x_jobs(*args, "--dsn", dsn), 2)
    assert says in result.stderr
    assert conn.execute("SELECT count(*) FROM x_jobs.event").fetchone() == (0,)
    assert job_state(conn, job_id) == "suspended"
    assert step_row(conn, job_id, "approve") == ("waiting", None, None, None)


def test_jobs_show_prints_progress_and_steps_in_reached_order(dsn: str, conn: Conn) -> None:
    job_id = enqueue(dsn, "order")
    claim(conn, job_id, "w1")
    assert conn.execute(
        "SELECT x_jobs.progress(id => %s, worker => 'w1', done => 3, total => 10, note => 'n')",
        [job_id],
    ).fetchone() == (True,)
    for step, output, error, compensation in [
        ("fetch", json.dumps({"rows": "x" * 200}), None, False),
        ("charge", '{"charge": "ch_1"}', None, False),
        ("charge", None, "refund failed: card expired\nTraceback: ...", True),
    ]:
        conn.execute(
            "SELECT x_jobs.step_record(id => %s, worker => 'w1', step => %s, output => %s,"
            " error => %s, compensation => %s)",
            [job_id, step, output, error, compensation],
        )
    conn.execute(
        "SELECT x_jobs.step_wait(id => %s, worker => 'w1', step => 'approve',"
        " event => 'approved', event_key => 'k', timeout => '1 hour')",
        [job_id],
    )

    doc = as_json(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", dsn))
    progress = doc["progress"]
    assert {k: progress[k] for k in ("done", "total", "note")} == {
        "done": 3,
        "total": 10,
        "note": "n",
    }
    assert doc["job"]["progress"] == progress
    at = datetime.fromisoformat(progress["at"])
    columns = ("name", "compensation", "kind", "status", "attempt", "event", "event_key")
    assert [tuple(s[k] for k in columns) for s in doc["steps"]] == [
        ("fetch", False, "run", "done", 1, None, None),
        ("charge", False, "run", "done", 1, None, None),
        ("charge", True, "run", "failed", 1, None, None),
        ("approve", False, "wait", "waiting", 1, "approved", "k"),
    ]
    fetch, charge, refund, approve = doc["steps"]
    assert fetch["output"] == {"rows": "x" * 200}  # whole in JSON
    assert (charge["output"], charge["resolved_by"]) == ({"charge": "ch_1"}, "worker")
    assert refund["error"] == "refund failed: card expired\nTraceback: ..."
    assert approve["output"] is approve["resolved_by"] is approve["resolved_at"] is None
    timeout_at = datetime.fromisoformat(approve["timeout_at"])
    assert timeout_at - datetime.fromisoformat(approve["created_at"]) < timedelta(
        hours=1, seconds=5
    )

    shown = succeeded(x_jobs("jobs", "show", str(job_id), "--dsn", dsn)).stdout
    head, rest = shown.split("steps, in the order the run reached them")
    steps, _ = rest.split("no errors recorded")
    when = at.astimezone(UTC).isoformat(sep=" ", timespec="seconds")
    assert re.search(rf"^progress\s+3/10 \(30%\), n, at {re.escape(when)}\s*$", head, re.MULTILINE)
    rows = [line for line in steps.splitlines() if re.match(r"^[a-z]", line)]
    assert rows[0].split()[:4] == ["step", "kind", "status", "attempt"]  # the header
    assert [row.split()[0] for row in rows[1:]] == ["fetch", "charge", "charge", "approve"]
    fetch_row, charge_row, refund_row, approve_row = rows[1:]
    assert fetch_row.split()[1:4] == ["run", "done", "1"]
    # A long output is shortened to SHORT characters (--json has it whole).
    assert '{"rows": "xxxx' in fetch_row
    assert fetch_row.rstrip().endswith("x\u2026")
    assert len(fetch_row.rstrip().split("  ")[-1]) == 60
    assert "(compensation)" not in charge_row
    assert charge_row.rstrip().endswith('{"charge": "ch_1"}')
    assert refund_row.startswith("charge (compensation)")
    assert refund_row.rstrip().endswith("refund failed: card expired")  # its first line
    assert "Traceback" not in steps
    timeout = timeout_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert approve_row.split()[1:4] == ["wait", "waiting", "1"]
    assert re.search(rf"\sapproved key=k\s+{timeout}\s+-\s+-\s*$", approve_row), approve_row
    assert "worker " in charge_row  # resolved by the worker, then when

    # Published, the wait shows who resolved it and the payload.
    x_jobs("events", "publish", "approved", "--key", "k", "--payload", '{"ok": 1}', "--dsn", dsn)
    shown = succeeded(x_jobs("jobs", "show", str(job_id), "--dsn", dsn)).stdout
    [approve_row] = [line for line in shown.splitlines() if line.startswith("approve")]
    assert re.search(r"\sdone\s.*\sevent \S+ \S+\s+\{\"ok\": 1\}\s*$", approve_row), approve_row

    # A job with neither: a dash, no steps, and null and [] in JSON.
    plain = enqueue(dsn, "plain")
    doc = as_json(x_jobs("jobs", "show", str(plain), "--json", "--dsn", dsn))
    assert (doc["progress"], doc["steps"]) == (None, [])
    shown = succeeded(x_jobs("jobs", "show", str(plain), "--dsn", dsn)).stdout
    assert re.search(r"^progress\s+-\s*$", shown, re.MULTILINE)
    assert "no steps recorded" in shown


@pytest.mark.parametrize(
    "bad_dsn",
    [
        "not a dsn",  # not even conninfo
        "host=/nonexistent/x_jobs",  # no server on that socket
        "host=127.0.0.1 port=1 connect_timeout=5",  # nothing listens there
        "postgresql://localhost:99999/x",  # an impossible port
    ],
)
def test_a_bad_dsn_or_unreachable_server_exits_2_without_traceback(bad_dsn: str) -> None:
    commands = (["jobs", "list"], ["queues"], ["install"], ["jobs", "show", "1"])
    for command in (*commands, ["outbox", "list"], ["outbox", "redrive", "--topic", "t"]):
        result = failed(x_jobs(*command, "--dsn", bad_dsn), 2)
        line, hint = one_line_and_hint(result)
        assert line.startswith("x-jobs: X_CONNECT_FAILED: cannot connect to the database: ")
        assert "DATABASE_URL" in hint
        assert result.stdout == ""


def test_a_bad_dsn_in_a_real_process_prints_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "x_jobs", "queues", "--json", "--dsn", "host=/nonexistent/x_jobs"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("x-jobs: X_CONNECT_FAILED: ")
    assert len(proc.stderr.splitlines()) == 2
    assert json.loads(proc.stdout)["error"]["code"] == "X_CONNECT_FAILED"


def test_an_unknown_job_id_exits_1_with_x_job_not_found(dsn: str) -> None:
    hints = set()
    commands = [["jobs", command, "424242"] for command in ("show", "retry", "cancel")]
    commands.append(["steps", "resolve", "424242", "approve"])
    for command in commands:
        result = failed(x_jobs(*command, "--dsn", dsn), 1)
        line, hint = one_line_and_hint(result)
        assert line == "x-jobs: X_JOB_NOT_FOUND: no job has id 424242"
        hints.add(hint)
    assert len(hints) == 1  # show says what the SQL says for retry, cancel and resolve_step

    result = failed(x_jobs("jobs", "retry", "424242", "--json", "--dsn", dsn), 1)
    assert json.loads(result.stdout) == {
        "error": {
            "code": "X_JOB_NOT_FOUND",
            "sqlstate": "XJ014",
            "message": "X_JOB_NOT_FOUND: no job has id 424242",
            "hint": hints.pop().removeprefix("hint: "),
        }
    }


@pytest.mark.parametrize(
    ("args", "code", "hint"),
    [
        (["jobs", "list", "--state", "nope"], "X_STATE_UNKNOWN", "Use one of: ready, delayed"),
        (["enqueue", "a", "--input", "{}", "--priority", "99999"], "X_PRIORITY_INVALID", ""),
        (["enqueue", "", "--input", "{}"], "X_NAME_INVALID", ""),
        (["queues", "pause", ""], "X_QUEUE_INVALID", "Name the queue to pause"),
        (["events", "publish", ""], "X_EVENT_INVALID", "Name the event with a short text"),
    ],
)
def test_other_refusals_print_their_message_and_hint(
    dsn: str, args: list[str], code: str, hint: str
) -> None:
    result = failed(x_jobs(*args, "--dsn", dsn), 1)
    line, hint_line = one_line_and_hint(result)
    assert line.startswith(f"x-jobs: {code}: ")
    assert hint in hint_line


def test_a_database_without_x_jobs_says_how_to_install_it(plain_dsn: str) -> None:
    for command in (["jobs", "list"], ["queues"], ["enqueue", "a", "--input", "{}"]):
        result = failed(x_jobs(*command, "--dsn", plain_dsn), 2)
        line, hint = one_line_and_hint(result)
        assert line == "x-jobs: X_NOT_INSTALLED: x_jobs is not installed in this database"
        assert "CREATE EXTENSION x_jobs" in hint
        assert "x-jobs install" in hint


def test_the_dsn_defaults_to_database_url_then_libpq_environment(dsn: str) -> None:
    dbname = conninfo_to_dict(dsn)["dbname"]
    assert isinstance(dbname, str)
    first = as_json(x_jobs("enqueue", "a", "--input", "{}", "--json", env={"DATABASE_URL": dsn}))
    # DATABASE_URL wins over PGDATABASE...
    env: dict[str, str | None] = {"DATABASE_URL": dsn, "PGDATABASE": "x_jobs_no_such_db"}
    assert as_json(x_jobs("jobs", "list", "--json", env=env))["jobs"][0]["id"] == first["id"]
    # ...and without it, libpq's environment names the database.
    env = {"DATABASE_URL": None, "PGDATABASE": dbname}
    assert as_json(x_jobs("jobs", "list", "--json", env=env))["jobs"][0]["id"] == first["id"]
    # --dsn wins over both.
    env = {"DATABASE_URL": "host=/nonexistent/x_jobs", "PGDATABASE": "x_jobs_no_such_db"}
    assert as_json(x_jobs("queues", "--json", "--dsn", dsn, env=env))["queues"][0]["ready"] == 1


def test_commands_run_as_a_real_process(dsn: str, conn: Conn) -> None:
    env = {**os.environ, "DATABASE_URL": dsn}
    env.pop("COLUMNS", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "x_jobs", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return proc

    enqueued = json.loads(run("enqueue", "from_a_process", "--input", '{"n": 1}', "--json").stdout)
    assert conn.execute(
        "SELECT name, input FROM x_jobs.job WHERE id = %s", [enqueued["id"]]
    ).fetchone() == ("from_a_process", {"n": 1})
    listing = run("jobs", "list").stdout
    assert [line.split()[:4] for line in listing.splitlines() if re.match(r"\s*\d", line)] == [
        [str(enqueued["id"]), "from_a_process", "default", "ready"]
    ]
    assert run("queues", "pause", "default").stdout.strip() == "queue default paused"
    assert json.loads(run("queues", "--json").stdout)["queues"][0]["paused"] is True


def age_rows(conn: Conn) -> dict[str, list[str]]:
    """What is left of the rows test_maintain made, by kind: their names, sorted."""
    queries = {
        "jobs": "SELECT name FROM x_jobs.job",
        "errors": "SELECT e.error FROM x_jobs.job_error AS e",
        "events": "SELECT name FROM x_jobs.event",
        "outbox": "SELECT topic FROM x_jobs.outbox",
        "webhooks": "SELECT webhook_id FROM x_jobs.webhook_ledger",
    }
    return {
        kind: sorted(str(row[0]) for row in conn.execute(query).fetchall())
        for kind, query in queries.items()
    }


def make_aged_rows(conn: Conn) -> None:
    """Of each kind, rows past the defaults' retention ("old") and within it ("new"), and rows
    that no retention takes (live jobs, pending and dead messages)."""
    with conn.transaction():
        for name, state, finished in [
            ("old_done", "done", "8 days"),
            ("old_dead", "dead", "8 days"),
            ("old_cancelled", "cancelled", "30 days"),
            ("new_done", "done", "6 days"),
            ("ready", None, None),
        ]:
            row = conn.execute("SELECT id FROM x_jobs.enqueue(name => %s)", [name]).fetchone()
            assert row is not None
            job_id = row[0]
            if state is not None:
                conn.execute(
                    "UPDATE x_jobs.job SET state = %s::x_jobs.job_state, attempt = 1,"
                    " finished_at = now() - %s::interval WHERE id = %s",
                    [state, finished, job_id],
                )
                conn.execute(
                    "INSERT INTO x_jobs.job_error (job_id, attempt, error, failed_at)"
                    " VALUES (%s, 1, %s, now())",
                    [job_id, f"error of {name}"],
                )
        for name, age in [("old_event", "31 days"), ("new_event", "29 days")]:
            conn.execute("SELECT x_jobs.publish(event => %s)", [name])
            conn.execute(
                "UPDATE x_jobs.event SET published_at = now() - %s::interval WHERE name = %s",
                [age, name],
            )
        for topic, state, ago in [
            ("old_delivered", "delivered", "8 days"),
            ("new_delivered", "delivered", "6 days"),
            ("old_dead", "dead", "8 days"),
            ("pending", None, None),
        ]:
            conn.execute("SELECT x_jobs.outbox_put(topic => %s, payload => '{}')", [topic])
            if state is not None:
                conn.execute(
                    "UPDATE x_jobs.outbox SET state = %s::x_jobs.outbox_state,"
                    " delivered_at = CASE WHEN %s = 'delivered' THEN now() - %s::interval END"
                    " WHERE topic = %s",
                    [state, state, ago, topic],
                )
        for webhook, age in [("old_hook", "8 days"), ("new_hook", "6 days")]:
            conn.execute(
                "SELECT x_jobs.receive_webhook(source => 'stripe', webhook_id => %s,"
                " name => 'hook')",
                [webhook],
            )
            conn.execute(
                "UPDATE x_jobs.webhook_ledger SET received_at = now() - %s::interval"
                " WHERE webhook_id = %s",
                [age, webhook],
            )


def test_maintain_deletes_what_is_past_its_retention_in_batches(dsn: str, conn: Conn) -> None:
    make_aged_rows(conn)
    before = age_rows(conn)
    # Batches of 2: the three old jobs take two purge calls, the rest one.
    doc = as_json(x_jobs("maintain", "--batch-size", "2", "--json", "--dsn", dsn))
    assert doc["purged"] == {
        "jobs": {"older_than": 7 * 86400, "deleted": 3},
        "events": {"older_than": 30 * 86400, "deleted": 1},
        "outbox": {"older_than": 7 * 86400, "deleted": 1},
        "webhooks": {"older_than": 7 * 86400, "deleted": 1},
    }
    assert isinstance(doc["counters_folded"], int)
    after = age_rows(conn)
    # The hooks' jobs are live (ready): purge leaves them, as it leaves "ready".
    assert after == {
        "jobs": ["hook", "hook", "new_done", "ready"],
        "errors": ["error of new_done"],
        "events": ["new_event"],
        "outbox": ["new_delivered", "old_dead", "pending"],
        "webhooks": ["new_hook"],
    }
    assert len(before["jobs"]) == 7
    # Nothing else is past its retention: a second pass deletes nothing.
    again = as_json(x_jobs("maintain", "--json", "--dsn", dsn))
    assert {kind: p["deleted"] for kind, p in again["purged"].items()} == {
        "jobs": 0,
        "events": 0,
        "outbox": 0,
        "webhooks": 0,
    }
    assert age_rows(conn) == after


def test_maintain_ages_and_off_choose_what_goes(dsn: str, conn: Conn) -> None:
    make_aged_rows(conn)
    result = succeeded(
        x_jobs(
            "maintain",
            "--jobs",
            "5d",
            "--events",
            "off",
            "--outbox",
            "off",
            "--webhooks",
            "off",
            "--dsn",
            dsn,
        )
    )
    rows = {
        line.split("  ")[0]: line.split()[-1]
        for line in result.stdout.splitlines()
        if line and not line.startswith("rows")
    }
    assert rows["finished jobs"] == "4"
    assert rows["events"] == "-"
    after = age_rows(conn)
    assert after["jobs"] == ["hook", "hook", "ready"]
    assert after["events"] == ["new_event", "old_event"]
    assert len(after["outbox"]) == 4
    assert after["webhooks"] == ["new_hook", "old_hook"]


@pytest.mark.parametrize(
    "args",
    [
        ["--jobs", "7x"],
        ["--events", "7 days"],
        ["--outbox", "-1d"],
        ["--batch-size", "0"],
        # Past timedelta, past SQL's first timestamp, past SQL's integer.
        ["--jobs", "99999999999d"],
        ["--webhooks", "1000000w"],
        ["--batch-size", "3000000000"],
        # A day past the database's 1000 years: taken, it purged the jobs, then events failed.
        ["--events", "360001d"],
    ],
)
def test_maintain_usage_errors_exit_2_and_delete_nothing(
    dsn: str, conn: Conn, args: list[str]
) -> None:
    make_aged_rows(conn)
    before = age_rows(conn)
    result = failed(x_jobs("maintain", *args, "--dsn", dsn), 2)
    assert f"'{args[0]}'" in result.stderr
    assert age_rows(conn) == before


def test_maintain_takes_ages_up_to_the_bound_of_every_purge_function(dsn: str, conn: Conn) -> None:
    """The database's "1000 years" is 360000 days (an interval counts a month as 30 days): the
    client's bound is that one, which every purge function takes and a second more it refuses."""
    make_aged_rows(conn)
    before = age_rows(conn)
    ages = [arg for kind in PURGES for arg in (f"--{kind}", "360000d")]
    doc = as_json(x_jobs("maintain", *ages, "--json", "--dsn", dsn))
    assert doc["purged"] == {kind: {"older_than": 360_000 * 86400, "deleted": 0} for kind in PURGES}
    assert age_rows(conn) == before

    assert parse_age("360000d") == MAX_AGE == timedelta(days=360_000)
    for _, statement in PURGES.values():
        assert conn.execute(statement, [MAX_AGE, 1]).fetchone() == (0,)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(statement, [MAX_AGE + timedelta(seconds=1), 1])
        assert type(errors.translate(refused.value)) is errors.RetentionInvalid, statement


def test_maintain_needs_x_jobs_admin(dsn: str, conn: Conn, admin: Conn) -> None:
    make_aged_rows(conn)
    role = f"x_jobs_test_worker_{os.getpid()}"
    admin.execute(f'CREATE ROLE "{role}" LOGIN IN ROLE x_jobs_worker')
    try:
        as_worker = f"{dsn} user={role}"
        line, hint = one_line_and_hint(failed(x_jobs("maintain", "--dsn", as_worker), 2))
        assert "permission denied for function purge" in line
        assert "x_jobs_admin" in hint
    finally:
        admin.execute(f'DROP ROLE "{role}"')
    assert len(age_rows(conn)["jobs"]) == 7


BIG_ID = "99999999999999999999"  # past bigint


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["jobs", "retry", BIG_ID], "'ID'"),
        (["jobs", "cancel", BIG_ID], "'ID'"),
        (["jobs", "show", BIG_ID], "'ID'"),
        (["jobs", "list", "--before", BIG_ID], "'--before'"),
        (["jobs", "list", "--limit", "99999999999"], "'--limit'"),
        (["steps", "resolve", BIG_ID, "approve"], "'JOB'"),
    ],
)
def test_numbers_sql_cannot_carry_are_usage_errors(dsn: str, args: list[str], says: str) -> None:
    result = failed(x_jobs(*args, "--dsn", dsn), 2)
    assert says in result.stderr


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        ("worker", ["--concurrency", "0"], "'--concurrency'"),
        # A worker holds at most 1000 jobs (claim's qty), a relay 1000 messages (relay_outbox's).
        ("worker", ["--concurrency", "1001"], "1001 is outside 1..1000"),
        ("worker", ["--metrics-port", "0"], "free port"),
        ("worker", ["--prefetch", "-1"], "'--prefetch'"),
        ("worker", ["--log-level", "bogus"], "'--log-level'"),
        ("worker", ["--log-format", "yaml"], "'--log-format'"),
        ("worker", ["--metrics-port", "99999"], "'--metrics-port'"),
        ("worker", ["--lease", "nan"], "'--lease'"),
        ("worker", ["--lease", "0"], "'--lease'"),
        ("worker", ["--lease", "1e20"], "'--lease'"),
        ("worker", ["--poll", "0"], "'--poll'"),
        ("worker", ["--poll", "-1"], "'--poll'"),
        ("worker", ["--grace", "-5"], "'--grace'"),
        ("worker", ["--grace", "inf"], "'--grace'"),
        ("relay", ["--concurrency", "0"], "'--concurrency'"),
        ("relay", ["--concurrency", "1001"], "1001 is outside 1..1000"),
        ("relay", ["--log-level", "bogus"], "'--log-level'"),
        ("relay", ["--lease", "nan"], "'--lease'"),
        ("relay", ["--poll", "0"], "'--poll'"),
        ("relay", ["--grace", "-5"], "'--grace'"),
        ("relay", ["--metrics-port", "0"], "free port"),
        ("relay", ["--metrics-port", "99999"], "'--metrics-port'"),
        ("worker", ["--metrics-host", " "], "'--metrics-host'"),
        ("relay", ["--metrics-host", ""], "'--metrics-host'"),
    ],
)
def test_worker_and_relay_refuse_bad_values_before_they_start(
    command: str, args: list[str], says: str
) -> None:
    # Refused before the app is even looked for: this one does not exist.
    result = failed(x_jobs(command, "no_such_module_of_x_jobs:app", *args), 2)
    assert says in result.stderr
    assert "no_such_module" not in result.stderr


@pytest.mark.parametrize("level", ["DEBUG", "Warning", "warn", "critical"])
def test_worker_takes_the_log_levels_it_took_in_any_case(level: str) -> None:
    # Past the options: the app is looked for, and is missing.
    result = failed(x_jobs("worker", "no_such_module_of_x_jobs:app", "--log-level", level), 2)
    assert "cannot import 'no_such_module_of_x_jobs'" in result.stderr


def _shown_everywhere(
    dsn: str,
    conn: Conn,
    job: tuple[str, str, str],
    failure: tuple[str, str],
    message: tuple[str, dict[str, str], str],
) -> tuple[int, int, list[str]]:
    """A job (name, queue, the worker that claims it) failed with (error, stack), and an outbox
    message (topic, payload, key); answers their ids and what `jobs list`, `jobs show`,
    `queues`, `outbox list` and `outbox show` print about them."""
    name, queue, worker = job
    job_id = enqueue(dsn, name, "--queue", queue)
    conn.execute(
        "SELECT id FROM x_jobs.claim(queues => ARRAY[%s], worker => %s, qty => 1)",
        [queue, worker],
    )
    conn.execute(
        "SELECT x_jobs.fail(id => %s, worker => %s, error => %s, error_stack => %s,"
        " retry_delay => '0')",
        [job_id, worker, *failure],
    )
    topic, payload, key = message
    message_id = put(conn, topic, payload, key=key)
    outputs = [
        succeeded(x_jobs(*command, "--dsn", dsn)).stdout
        for command in (
            ["jobs", "list"],
            ["jobs", "show", str(job_id)],
            ["queues"],
            ["outbox", "list"],
            ["outbox", "show", str(message_id)],
        )
    ]
    return job_id, message_id, outputs


def test_tables_show_control_characters_as_escapes(dsn: str, conn: Conn) -> None:
    """ESC, BEL and C1's CSI from the database (a name, a queue, a handler's error) would steer
    the operator's terminal: tables show them as escapes, JSON as \\u escapes."""
    name, queue = "\x1b[31mRED\x1b[0m", "q\x1b]0;TITLE\x07"
    job_id, message, outputs = _shown_everywhere(
        dsn,
        conn,
        (name, queue, "w\x1b[2J"),
        ("bad\x9b2Jthing", "stack\x1b[1A"),
        ("t\x1b[5m", {"k": "\x9b"}, "k\x07"),
    )
    for output in outputs:
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", output), output
    listed, shown, queues, outbox, one = outputs
    assert "\\x1b[31mRED\\x1b[0m" in listed
    assert "q\\x1b]0;TITLE\\x07" in queues
    assert "bad\\x9b2Jthing" in shown
    assert "stack\\x1b[1A" in shown
    assert "w\\x1b[2J" in shown
    assert "t\\x1b[5m" in outbox
    assert '"\\u009b"' in one
    for command in (["jobs", "show", str(job_id)], ["outbox", "show", str(message)]):
        raw = succeeded(x_jobs(*command, "--json", "--dsn", dsn)).stdout
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", raw), raw
    doc = as_json(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", dsn))
    assert (doc["job"]["name"], doc["job"]["last_error"]) == (name, "bad\x9b2Jthing")


#: Unicode's Bidi_Control characters: they reorder what a terminal shows after them.
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_tables_show_bidirectional_controls_as_escapes(dsn: str, conn: Conn) -> None:
    """A right-to-left override and its kin (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
    U+061C) in database text would make a terminal show it in another order (invoice\\u202egpj.exe
    reads as invoiceexe.jpg): tables and error lines show them as \\u escapes, as control
    characters are shown, and --json writes them as JSON's \\u escapes."""
    name, queue = "invoice\u202egpj.exe", "q\u2066\u2067\u2068x\u2069"
    job_id, message, outputs = _shown_everywhere(
        dsn,
        conn,
        (name, queue, "w\u200e"),
        ("bad\u202athing\u202c", "stack\u202b\u202d\u200f\u061c"),
        ("t\u202e", {"k": "\u2066"}, "k\u200f"),
    )
    for output in outputs:
        assert not BIDI.search(output), ascii(output)
    listed, shown, queues, outbox, one = outputs
    assert "invoice\\u202egpj.exe" in listed
    assert "q\\u2066\\u2067\\u2068x\\u2069" in queues
    assert "bad\\u202athing\\u202c" in shown
    assert "stack\\u202b\\u202d\\u200f\\u061c" in shown
    assert "w\\u200e" in shown
    assert "t\\u202e" in outbox
    assert '"\\u2066"' in one
    for command in (["jobs", "show", str(job_id)], ["outbox", "show", str(message)]):
        raw = succeeded(x_jobs(*command, "--json", "--dsn", dsn)).stdout
        assert not BIDI.search(raw), ascii(raw)
    doc = as_json(x_jobs("jobs", "show", str(job_id), "--json", "--dsn", dsn))
    assert (doc["job"]["name"], doc["job"]["queue"]) == (name, queue)
    assert doc["errors"][0]["error"] == "bad\u202athing\u202c"
    # A refusal's line quotes what it was given: escaped too.
    refused = failed(x_jobs("outbox", "list", "--state", "dead\u202e", "--dsn", dsn), 1)
    assert not BIDI.search(refused.stderr), ascii(refused.stderr)
    assert "'dead\\u202e' is not an outbox state" in refused.stderr
    error = json.loads(
        failed(x_jobs("outbox", "list", "--state", "dead\u202e", "--json", "--dsn", dsn), 1).stdout
    )["error"]
    assert error["message"] == "X_STATE_UNKNOWN: 'dead\u202e' is not an outbox state"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["enqueue", "job", "--input", "{nope"], "'--input'"),
        (["enqueue", "job"], "'--input'"),
        (["jobs", "show", "seven"], "'ID'"),
        (["jobs", "list", "--limit", "many"], "'--limit'"),
        (["jobs", "list", "--bogus"], "--bogus"),
        (["jobs", "frobnicate"], "frobnicate"),
        (["outbox", "redrive"], "'ID' / '--topic'"),
        (["queues", "pause"], "'NAME'"),
    ],
)
def test_usage_errors_with_json_print_a_json_error(dsn: str, args: list[str], says: str) -> None:
    """With --json a usage error is the same JSON document as any other error (code X_USAGE),
    after one line and a hint on stderr, and exits 2; without it, click's message as before."""
    result = failed(x_jobs(*args, "--json", "--dsn", dsn), 2)
    line, hint = one_line_and_hint(result)
    error = json.loads(result.stdout)["error"]
    assert error == {
        "code": "X_USAGE",
        "sqlstate": None,
        "message": error["message"],
        "hint": hint[6:],
    }
    assert says in error["message"]
    assert line == f"x-jobs: {error['message']}"
    assert "--help" in error["hint"]
    plain = failed(x_jobs(*args, "--dsn", dsn), 2)
    assert plain.stdout == ""
    assert says in plain.stderr


def test_usage_errors_with_json_in_a_real_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "x_jobs", "jobs", "show", "seven", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "X_USAGE"
    assert "'ID'" in error["message"]
    assert "jobs show --help" in error["hint"]


def _start(command: str, app: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``x-jobs worker|relay APP ARGS`` as a real process, with tests/python importable (the
    apps.* modules); for a start that fails, so it ends by itself."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [tests, env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "x_jobs", command, app, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tests,
        env=env,
    )


def _ends_with_one_line_and_hint(proc: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """Exit 2, no traceback, and stderr (after the start-up log lines) ends with the error line
    and its hint."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    *_, line, hint = proc.stderr.splitlines()
    assert line.startswith("x-jobs: "), proc.stderr
    assert hint.startswith("hint: "), proc.stderr
    return line, hint


@pytest.mark.parametrize(
    ("command", "app"), [("worker", "apps.basic:app"), ("relay", "apps.relays:app")]
)
def test_worker_and_relay_that_cannot_connect_say_so_in_one_line(command: str, app: str) -> None:
    """They printed psycopg's OperationalError with its traceback (exit 1)."""
    proc = _start(command, app, "--dsn", "host=/nonexistent/x_jobs")
    line, hint = _ends_with_one_line_and_hint(proc)
    assert line.startswith("x-jobs: X_CONNECT_FAILED: cannot connect to the database: "), line
    assert "DATABASE_URL" in hint


def test_a_worker_whose_metrics_port_is_taken_says_so_in_one_line(dsn: str) -> None:
    """It died of the OSError of the metrics server's bind, with its traceback (exit 1)."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _start("worker", "apps.basic:app", "--metrics-port", str(port), "--dsn", dsn)
    line, hint = _ends_with_one_line_and_hint(proc)
    assert line.startswith(
        f"x-jobs: X_METRICS_PORT_UNAVAILABLE: cannot serve metrics on port {port}"
    ), line
    assert "--metrics-port" in hint


# --- manifest: the job declarations ------------------------------------------------------------


def test_manifest_of_an_app_prints_what_it_declares_without_a_database() -> None:
    doc = as_json(x_jobs("manifest", "apps.deploy:new", "--json", "--dsn", "host=/nonexistent"))
    by_name = {d["name"]: d for d in doc["declarations"]}
    assert sorted(by_name) == ["deploy.ping", "deploy.report"]
    report = by_name["deploy.report"]
    assert (report["queue"], report["max_attempts"], report["timeout"]) == (
        "deploy",
        3,
        "60.000000 seconds",
    )
    table = succeeded(x_jobs("manifest", "apps.deploy:new")).stdout
    assert re.search(r"deploy\.report\s+deploy\s+3\s+0\.05s\.\.0\.05s\s+yes\s+60s\s+-\s+yes", table)


def test_manifest_lists_the_declarations_who_serves_them_and_the_parked_jobs(
    dsn: str, conn: Conn
) -> None:
    conn.execute(
        "SELECT x_jobs.declare_job('deploy.report', queue => 'deploy', max_attempts => 3,"
        " timeout => '1 minute', concurrency_limit => 2, declared_by => 'host:1:new',"
        " build => 'v2')"
    )
    conn.execute(
        "SELECT x_jobs.announce_worker('host:1:new', ARRAY['deploy'],"
        " jobs => ARRAY['deploy.report'])"
    )
    conn.execute("SELECT x_jobs.enqueue('mystery', queue => 'deploy')")
    conn.execute(
        "SELECT x_jobs.hand_back(ARRAY(SELECT id FROM x_jobs.claim(ARRAY['deploy'], 'host:2:old')),"
        " 'host:2:old')"
    )

    doc = as_json(x_jobs("manifest", "--json", "--dsn", dsn))
    by_name = {t["name"]: t for t in doc["job_types"]}
    assert sorted(by_name) == ["deploy.report", "mystery"]
    report = by_name["deploy.report"]
    assert (report["max_attempts"], report["timeout"], report["concurrency_limit"]) == (3, 60.0, 2)
    assert (report["declared_by"], report["build"], report["served_by"]) == (
        "host:1:new",
        "v2",
        ["host:1:new"],
    )
    assert (by_name["mystery"]["declared_at"], by_name["mystery"]["parked"]) == (None, 1)

    table = succeeded(x_jobs("manifest", "--dsn", dsn)).stdout
    assert re.search(
        r"deploy\.report\s+deploy\s+3\s.*2 per key from the input.*host:1:new \(v2\)", table
    )
    assert re.search(r"mystery\s.*not declared\s+-\s+1$", table, re.M)
