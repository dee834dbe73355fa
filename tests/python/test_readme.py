"""The README's error table is the catalogue: x_jobs.error_codes() and the Python classes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg

from x_jobs import errors

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
