"""The README's error tables are the catalogue: x_jobs.error_codes() and the Python classes, then
the codes of the client's own; and its examples run."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from conftest import wait_for

from x_jobs import App, errors

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| (XJ\d{3}|\d{5}) \| (X_[A-Z_]+) \| (.+?) \| (\w+) \|$")


def readme_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in README.read_text().splitlines():
        match = ROW.match(line)
        if match:
            sqlstate, code, meaning, python = match.groups()
            rows.append((sqlstate, code, meaning, python))
    return rows


def test_readme_error_table_is_the_catalogue(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    catalogue = [
        (str(sqlstate), str(code), str(meaning))
        for sqlstate, code, meaning in conn.execute(
            "SELECT sqlstate, code, meaning FROM x_jobs.error_codes() ORDER BY code"
        ).fetchall()
    ]
    table = sorted((sqlstate, code, meaning) for sqlstate, code, meaning, _ in readme_rows())
    assert table == sorted(catalogue)


def test_readme_names_the_python_class_of_every_code() -> None:
    rows = readme_rows()
    assert rows, "the README has no error table"
    for sqlstate, code, _, python in rows:
        cls = errors.BY_CODE[code]
        assert cls.__name__ == python
        assert cls.sqlstate == sqlstate


#: A row of the README's table of the client's own codes: code, Python class or -, when.
CLIENT_ROW = re.compile(r"^\| (X_[A-Z_]+) \| (\w+|-) \| (.+?) \|$")
#: The modules whose code raises ``X_`` codes by literal, beside the exception classes.
LITERAL_SOURCES = ("cli.py", "install.py", "metrics.py")


def client_codes() -> dict[str, str | None]:
    """The ``X_`` codes the package raises that no SQL function does, each with the name of
    its exception class (None: a literal of the command line alone)."""

    def subclasses(cls: type[errors.XJobsError]) -> Iterator[type[errors.XJobsError]]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    # Every module that defines an exception class, imported so that its classes are seen.
    for module in ("cli", "install", "metrics", "steps", "worker"):
        importlib.import_module(f"x_jobs.{module}")
    codes: dict[str, str | None] = {}
    for cls in subclasses(errors.XJobsError):
        # Only a class that names its own code (InvalidArgument, ClientError are bases); a
        # ClientError, or a class without a SQLSTATE of its own (PermissionDenied, StepTimeout).
        if "code" in vars(cls) and (issubclass(cls, errors.ClientError) or cls.sqlstate is None):
            codes[cls.code] = cls.__name__
    package = Path(errors.__file__).parent
    for name in LITERAL_SOURCES:
        text = (package / name).read_text()
        # Not a code: the name of an environment variable an option reads (X_JOBS_METRICS_HOST).
        env = set(re.findall(r"envvar=[\"'](X_[A-Z_]+)[\"']", text))
        for code in re.findall(r"(?<=[\"'])X_[A-Z_]*[A-Z]", text):
            if code not in env:
                codes.setdefault(code, None)
    return codes


def test_readme_client_code_table_is_what_the_package_raises(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    sql_codes = {str(code) for (code,) in conn.execute("SELECT code FROM x_jobs.error_codes()")}
    expected = {code: python for code, python in client_codes().items() if code not in sql_codes}
    rows = [CLIENT_ROW.match(line) for line in README.read_text().splitlines()]
    table = {m[1]: (None if m[2] == "-" else m[2]) for m in rows if m is not None}
    assert len(table) == sum(m is not None for m in rows), "a code is in the table twice"
    assert table == expected


def readme_blocks(language: str, section: str | None = None) -> list[str]:
    """The README's fenced blocks of one language, in order, optionally of one `## ` section."""
    text = README.read_text()
    if section is not None:
        start = text.index(f"## {section}\n")
        end = text.find("\n## ", start + 1)
        text = text[start : end if end != -1 else None]
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def test_the_sql_examples_run_in_order(dsn: str) -> None:
    blocks = readme_blocks("sql", "The SQL API")
    assert len(blocks) >= 5
    script = "\\set ON_ERROR_STOP on\n" + "\n".join(blocks)
    done = subprocess.run(
        ["psql", "-X", "-q", "-d", dsn, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_python_example_runs(dsn: str, conn: psycopg.Connection[tuple[object, ...]]) -> None:
    (example,) = readme_blocks("python", "Python")[:1]
    dbname = conn.info.dbname
    done = subprocess.run(
        [sys.executable, "-c", example],
        env=dict(os.environ, PGDATABASE=dbname),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = conn.execute(
        "SELECT count(*) FILTER (WHERE queue = 'mail'), count(DISTINCT idempotency_key)"
        " FROM x_jobs.job WHERE name = 'send_email'"
    ).fetchone()
    # One welcome, 1,000 batch mails and the receipt, each under its own key.
    assert rows == (1002, 1002)


def test_the_workflow_example_runs_in_a_worker(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The README's workflow, end to end: enqueued by running the example, served by a worker
    process, woken by a publish and by resolving its sleep."""
    example = readme_blocks("python", "Python")[1]
    (tmp_path / "readme_flow.py").write_text(example)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    # The checkout's package under test (PYTHONPATH) stays importable after the example.
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env.update(PGDATABASE=conn.info.dbname, PYTHONPATH=path)
    enqueued = subprocess.run(
        [sys.executable, "readme_flow.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = int(enqueued.stdout.strip())

    worker = subprocess.Popen(
        [sys.executable, "-m", "x_jobs", "worker", "readme_flow:app", "--poll", "0.1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def waiting_on(step: str) -> bool:
            row = conn.execute(
                "SELECT j.state::text, s.status::text FROM x_jobs.job AS j"
                " JOIN x_jobs.step AS s ON s.job_id = j.id AND s.name = %s WHERE j.id = %s",
                [step, job_id],
            ).fetchone()
            return row == ("suspended", "waiting")

        wait_for(lambda: waiting_on("paid"), "the run to wait for its payment")
        conn.execute(
            "SELECT x_jobs.publish(event => 'order.paid', key => '42',"
            " payload => '{\"amount\": 10}')"
        )
        wait_for(lambda: waiting_on("cool-off"), "the run to sleep")
        conn.execute("SELECT x_jobs.resolve_step(job => %s, step => 'cool-off')", [job_id])
        client = App(dsn)
        try:
            assert client.result(job_id, timeout=60) == {"charge": "ch_42", "paid": "10"}
        finally:
            client.close()
    finally:
        worker.terminate()
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr


def test_the_outbox_example_puts_its_messages(conn: psycopg.Connection[Any]) -> None:
    example = readme_blocks("python", "Python")[2]
    done = subprocess.run(
        [sys.executable, "-c", example],
        env=dict(os.environ, PGDATABASE=conn.info.dbname),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = conn.execute(
        "SELECT topic, key, payload, state::text FROM x_jobs.outbox ORDER BY id"
    ).fetchall()
    assert rows == [
        ("orders.created", "order-42", {"order": 42}, "pending"),
        ("orders.audit", "order-42", {"order": 42}, "pending"),
    ]
