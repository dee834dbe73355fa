"""The README's error table is the catalogue: x_jobs.error_codes() and the Python classes."""

from __future__ import annotations

import re
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
