"""The docs hold what the code does: the error tables of docs/errors.md are the catalogue
(x_jobs.error_codes(), the Python classes, the client's own codes); the function table of
docs/sql-api.md and the role table of docs/roles.md are the schema's public functions and their
grants; and every ```sql and ```python block of README.md and docs/*.md runs against a database
of its own, unless the page marks it with a visible reason (an HTML comment
`<!-- not run: ... -->` on the line above)."""

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
import pytest
from conftest import wait_for

from x_jobs import App, errors

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
#: The pages whose examples run: the README, then every page under docs/.
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
ERRORS_PAGE = ROOT / "docs" / "errors.md"
ROW = re.compile(r"^\| (XJ\d{3}|\d{5}) \| (X_[A-Z_]+) \| (.+?) \| (\w+) \|$")
#: A fenced block: the line above it (a skip mark, or anything), its language, its text.
FENCE = re.compile(r"^(?P<above>[^\n]*)\n```(?P<lang>\w+)\n(?P<body>.*?)^```$", re.S | re.M)
NOT_RUN = re.compile(r"^<!-- not run: .+ -->$")


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def page_blocks(page: Path | str, language: str) -> list[str]:
    """The fenced blocks of one language in a page (a path, or one relative to the repository),
    in order, but those marked not to run."""
    path = page if isinstance(page, Path) else ROOT / page
    text = "\n" + path.read_text()
    return [
        m["body"]
        for m in FENCE.finditer(text)
        if m["lang"] == language and not NOT_RUN.match(m["above"].strip())
    ]


def readme_blocks(language: str) -> list[str]:
    """The README's blocks of one language (kept for the tests that read it by that name)."""
    return page_blocks(README, language)


def error_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in ERRORS_PAGE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            sqlstate, code, meaning, python = match.groups()
            rows.append((sqlstate, code, meaning, python))
    return rows


def test_error_table_is_the_catalogue(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    catalogue = [
        (str(sqlstate), str(code), str(meaning))
        for sqlstate, code, meaning in conn.execute(
            "SELECT sqlstate, code, meaning FROM x_jobs.error_codes() ORDER BY code"
        ).fetchall()
    ]
    table = sorted((sqlstate, code, meaning) for sqlstate, code, meaning, _ in error_rows())
    assert table == sorted(catalogue)


def test_error_table_names_the_python_class_of_every_code() -> None:
    rows = error_rows()
    assert rows, "docs/errors.md has no error table"
    for sqlstate, code, _, python in rows:
        cls = errors.BY_CODE[code]
        assert cls.__name__ == python
        assert cls.sqlstate == sqlstate


#: A row of the table of the client's own codes: code, Python class or -, when.
CLIENT_ROW = re.compile(r"^\| (X_[A-Z_]+) \| (\w+|-) \| (.+?) \|$")
#: The modules (or packages) whose code raises ``X_`` codes by literal, beside the classes.
LITERAL_SOURCES = ("cli", "install", "metrics")


def literal_sources(package: Path) -> Iterator[Path]:
    for name in LITERAL_SOURCES:
        module = package / f"{name}.py"
        yield from [module] if module.exists() else sorted((package / name).rglob("*.py"))


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
    for path in literal_sources(Path(errors.__file__).parent):
        text = path.read_text()
        # Not a code: the name of an environment variable an option reads (X_JOBS_METRICS_HOST).
        env = set(re.findall(r"envvar=[\"'](X_[A-Z_]+)[\"']", text))
        for code in re.findall(r"(?<=[\"'])X_[A-Z_]*[A-Z]", text):
            if code not in env:
                codes.setdefault(code, None)
    return codes


def test_client_code_table_is_what_the_package_raises(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    sql_codes = {str(code) for (code,) in conn.execute("SELECT code FROM x_jobs.error_codes()")}
    expected = {code: python for code, python in client_codes().items() if code not in sql_codes}
    rows = [CLIENT_ROW.match(line) for line in ERRORS_PAGE.read_text().splitlines()]
    table = {m[1]: (None if m[2] == "-" else m[2]) for m in rows if m is not None}
    assert len(table) == sum(m is not None for m in rows), "a code is in the table twice"
    assert table == expected


#: A row of docs/sql-api.md's signature table: function, parameters, answers, role.
SIGNATURE_ROW = re.compile(r"^\| `(\w+)` \| .+ \| .+ \| ([\w, -]+) \|$")
#: Which role a function is granted to: the first of the chain's three that may call it, else
#: x_jobs_webhook (which stands apart from the chain), and pg_monitor beside it when it may too.
GRANTED_TO = """
    SELECT p.proname, concat_ws(', ',
        CASE WHEN has_function_privilege('x_jobs_producer', p.oid, 'EXECUTE') THEN 'x_jobs_producer'
             WHEN has_function_privilege('x_jobs_worker', p.oid, 'EXECUTE') THEN 'x_jobs_worker'
             WHEN has_function_privilege('x_jobs_admin', p.oid, 'EXECUTE') THEN 'x_jobs_admin'
             WHEN has_function_privilege('x_jobs_webhook', p.oid, 'EXECUTE') THEN 'x_jobs_webhook'
             ELSE '-' END,
        CASE WHEN has_function_privilege('pg_monitor', p.oid, 'EXECUTE') THEN 'pg_monitor' END)
    FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
    WHERE n.nspname = 'x_jobs' AND p.proname NOT LIKE '\\_%'
"""


def test_the_sql_api_page_lists_every_public_function_and_its_role(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    """A public function the page leaves out, or a grant that moved, fails here."""
    lines = (ROOT / "docs" / "sql-api.md").read_text().splitlines()
    table = [(m[1], m[2]) for m in map(SIGNATURE_ROW.match, lines) if m is not None]
    assert len(table) == len(dict(table)), "a function is in the table twice"
    granted = {str(fn): str(role) for fn, role in conn.execute(GRANTED_TO).fetchall()}
    assert dict(table) == granted


def test_the_roles_page_lists_what_each_role_may_call(
    conn: psycopg.Connection[tuple[object, ...]],
) -> None:
    """docs/roles.md's table: each role's row names what it may call beyond the role before
    (x_jobs_webhook and pg_monitor, outside the chain: all they may call)."""
    rows = {}
    for line in (ROOT / "docs" / "roles.md").read_text().splitlines():
        match = re.match(r"^\| `(x_jobs_\w+|pg_monitor)` \| (.+) \|$", line)
        if match:
            rows[match[1]] = set(re.findall(r"`(\w+)`", match[2]))
    may: dict[str, set[str]] = {}
    for role in (
        "x_jobs_producer",
        "x_jobs_worker",
        "x_jobs_admin",
        "x_jobs_webhook",
        "pg_monitor",
    ):
        may[role] = {
            str(fn)
            for (fn,) in conn.execute(
                "SELECT p.proname FROM pg_catalog.pg_proc AS p"
                " JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace"
                " WHERE n.nspname = 'x_jobs' AND p.proname NOT LIKE '\\_%%'"
                " AND has_function_privilege(%s, p.oid, 'EXECUTE')",
                [role],
            )
        }
    assert rows == {
        "x_jobs_producer": may["x_jobs_producer"],
        "x_jobs_worker": may["x_jobs_worker"] - may["x_jobs_producer"],
        "x_jobs_admin": may["x_jobs_admin"] - may["x_jobs_worker"],
        "x_jobs_webhook": may["x_jobs_webhook"],
        "pg_monitor": may["pg_monitor"],
    }


# --- the examples -------------------------------------------------------------------------------


def test_the_pages_have_their_examples() -> None:
    """A page that lost its examples (a renamed page, a broken fence) would pass by running none."""
    assert len(page_blocks(README, "sql")) >= 1
    assert len(page_blocks(README, "python")) >= 1
    assert len(page_blocks("docs/sql-api.md", "sql")) >= 8
    assert len(page_blocks("docs/operations.md", "promql")) == 1


SQL_PAGES = [page for page in PAGES if page_blocks(page, "sql")]


@pytest.mark.parametrize("page", SQL_PAGES, ids=[name(page) for page in SQL_PAGES])
def test_the_sql_examples_of_a_page_run_in_order(page: Path, dsn: str) -> None:
    script = "\\set ON_ERROR_STOP on\n" + "\n".join(page_blocks(page, "sql"))
    done = subprocess.run(
        ["psql", "-X", "-q", "-d", dsn, "-f", "-"],
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


#: The Python examples a test of their own runs and checks further (below).
CHECKED = {
    ("docs/python.md", 0),
    ("docs/workflows.md", 0),
    ("docs/outbox-webhooks.md", 0),
}
PYTHON_EXAMPLES = [
    (page, index)
    for page in PAGES
    for index, _ in enumerate(page_blocks(page, "python"))
    if (name(page), index) not in CHECKED
]


def run_example(example: str, dbname: str, cwd: Path | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(PGDATABASE=dbname)
    done = subprocess.run(
        [sys.executable, "-c", example],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(
    ("page", "index"), PYTHON_EXAMPLES, ids=[f"{name(p)}[{i}]" for p, i in PYTHON_EXAMPLES]
)
def test_a_python_example_runs(
    page: Path, index: int, conn: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Exits 0: the README's tour, for one, waits for its job's result (ResultTimeout or
    JobFailed would fail it), so its worker ran the job to completion."""
    run_example(page_blocks(page, "python")[index], conn.info.dbname)


def test_the_python_example_enqueues(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    run_example(page_blocks("docs/python.md", "python")[0], conn.info.dbname)
    rows = conn.execute(
        "SELECT count(*) FILTER (WHERE queue = 'mail'), count(DISTINCT idempotency_key)"
        " FROM x_jobs.job WHERE name = 'send_email'"
    ).fetchone()
    # One welcome, 1,000 batch mails and the receipt, each under its own key.
    assert rows == (1002, 1002)


def test_the_workflow_example_runs_in_a_worker(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """The workflow of docs/workflows.md, end to end: enqueued by running the example, served
    by a worker process, woken by a publish and by resolving its sleep."""
    example = page_blocks("docs/workflows.md", "python")[0]
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
    run_example(page_blocks("docs/outbox-webhooks.md", "python")[0], conn.info.dbname)
    rows = conn.execute(
        "SELECT topic, key, payload, state::text FROM x_jobs.outbox ORDER BY id"
    ).fetchall()
    assert rows == [
        ("orders.created", "order-42", {"order": 42}, "pending"),
        ("orders.audit", "order-42", {"order": 42}, "pending"),
    ]
