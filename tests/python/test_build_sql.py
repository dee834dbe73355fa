"""scripts/build-sql: the upgrade is written once, and the build refuses one that does not lead to
sql/src. A function edited in sql/src without its `--@function` directive, or dropped from it
without a DROP FUNCTION, fails the build with its name; with them it passes and the built
upgrade script carries the function. `build-sql release` freezes the expanded script with its
checksum. Every test works on a copy of sql/, never on the tree's."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build-sql"


def control_version(root: Path) -> str:
    text = (root / "sql" / "x_jobs.control").read_text()
    found = re.search(r"^default_version = '(.*)'$", text, re.MULTILINE)
    assert found is not None
    return found[1]


def open_upgrade(root: Path) -> tuple[str, str]:
    """(last released version, open version) from the upgrade source's header."""
    found = re.search(r"^-- (\S+) -> (\S+):", (root / "sql/src/upgrade.sql").read_text(), re.M)
    assert found is not None, "these tests need an open version in sql/src/upgrade.sql"
    return found[1], found[2]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the repository's SQL source and released scripts, built ones left out."""
    shutil.copytree(
        ROOT / "sql", tmp_path / "sql", ignore=shutil.ignore_patterns(".*"), symlinks=True
    )
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    released = {line.split()[-1] for line in (ROOT / "sql/RELEASED").read_text().splitlines()}
    for script in (tmp_path / "sql").glob("x_jobs--*.sql"):
        if f"sql/{script.name}" not in released:
            script.unlink()
    if not re.search(r"^-- \S+ -> \S+:", (tmp_path / "sql/src/upgrade.sql").read_text(), re.M):
        start_version(tmp_path)
    return tmp_path


def start_version(root: Path) -> None:
    """Open the version after the released default one in the copy, as docs/releasing.md says a
    version is started (when the tree has none open, just after a release)."""
    last = control_version(root)
    major, minor, patch = (int(part) for part in last.split("."))
    nxt = f"{major}.{minor}.{patch + 1}"
    edit(root / "sql/x_jobs.control", f"default_version = '{last}'", f"default_version = '{nxt}'")
    edit(root / "sql/src/30-helpers.sql", f"SELECT '{last}'::text", f"SELECT '{nxt}'::text")
    (root / "sql/src/upgrade.sql").write_text(
        f"\\echo Use \"ALTER EXTENSION x_jobs UPDATE TO '{nxt}'\" to load this file. \\quit\n\n"
        f"-- {last} -> {nxt}: opened by the test.\n\n"
        "--@function x_jobs.version\n\n"
        "SELECT x_jobs._adopt();\n"
    )
    with (root / ".gitignore").open("a") as ignore:
        ignore.write(f"/sql/x_jobs--{last}--{nxt}.sql\n")


def build(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BUILD), "--root", str(root), *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {path.name}"
    path.write_text(text.replace(old, new))


def name_in_upgrade(root: Path, line: str) -> None:
    """Put ``line`` just before the final SELECT x_jobs._adopt(); of the upgrade source."""
    edit(
        root / "sql/src/upgrade.sql",
        "SELECT x_jobs._adopt();",
        f"{line}\n\nSELECT x_jobs._adopt();",
    )


def test_the_tree_builds_and_its_upgrade_names_version(tree: Path) -> None:
    released, version = open_upgrade(tree)
    assert control_version(tree) == version
    done = build(tree)
    assert done.returncode == 0, done.stderr
    full = (tree / f"sql/x_jobs--{version}.sql").read_text()
    assert full.startswith('\\echo Use "CREATE EXTENSION x_jobs"')
    upgrade = (tree / f"sql/x_jobs--{released}--{version}.sql").read_text()
    assert f"SELECT '{version}'::text" in upgrade
    assert "--@function" not in upgrade
    assert upgrade.rstrip().endswith("SELECT x_jobs._adopt();")


def test_a_function_changed_without_its_directive_fails_the_build(tree: Path) -> None:
    released, version = open_upgrade(tree)
    # The open upgrade may name the claim already; this test writes its own directive.
    upgrade_source = tree / "sql/src/upgrade.sql"
    lines = upgrade_source.read_text().splitlines(keepends=True)
    upgrade_source.write_text("".join(x for x in lines if x != "--@function x_jobs.claim\n"))
    claim = tree / "sql/src/50-claim.sql"
    text = claim.read_text()
    # A comment inside the body is part of the function: pg_proc keeps it, a dump shows it.
    body = text.index("AS $$", text.index("CREATE FUNCTION x_jobs.claim("))
    claim.write_text(text[:body] + "AS $$\n    -- a changed claim\n" + text[body + 6 :])

    refused = build(tree)
    assert refused.returncode == 1
    assert (
        f"x_jobs.claim(text[], text, interval, integer) differs from {released}" in refused.stderr
    )
    assert "x_jobs.release(" not in refused.stderr  # only the changed function is named
    assert not (tree / f"sql/x_jobs--{version}.sql").exists()

    name_in_upgrade(tree, "--@function x_jobs.claim")
    done = build(tree)
    assert done.returncode == 0, done.stderr
    upgrade = (tree / f"sql/x_jobs--{released}--{version}.sql").read_text()
    assert upgrade.count("CREATE OR REPLACE FUNCTION x_jobs.claim(") == 1
    assert "-- a changed claim" in upgrade
    # The directive's expansion sits where the directive was: before the final _adopt().
    assert upgrade.index("x_jobs.claim(") < upgrade.rindex("SELECT x_jobs._adopt();")


def test_a_new_function_needs_its_directive_and_a_gone_one_its_drop(tree: Path) -> None:
    released, version = open_upgrade(tree)
    declarations = tree / "sql/src/87-declarations.sql"
    edit(
        declarations,
        "CREATE FUNCTION x_jobs.drop_job_type(",
        "CREATE FUNCTION x_jobs.later_reader(kind text DEFAULT NULL)\nRETURNS integer\n"
        "LANGUAGE sql\nSTABLE\nAS $$ SELECT 1 $$;\n\nCREATE FUNCTION x_jobs.gone_job_type(",
    )
    refused = build(tree)
    assert refused.returncode == 1
    assert "x_jobs.later_reader(text) is new" in refused.stderr
    assert "x_jobs.gone_job_type(text) is new" in refused.stderr
    assert f"x_jobs.drop_job_type(text) of {released} is gone from sql/src" in refused.stderr

    name_in_upgrade(
        tree,
        "DROP FUNCTION x_jobs.drop_job_type(text);\n"
        "--@function x_jobs.later_reader\n--@function x_jobs.gone_job_type",
    )
    done = build(tree)
    assert done.returncode == 0, done.stderr
    upgrade = (tree / f"sql/x_jobs--{released}--{version}.sql").read_text()
    assert "CREATE OR REPLACE FUNCTION x_jobs.later_reader(kind text DEFAULT NULL)" in upgrade

    name_in_upgrade(tree, "--@function x_jobs.no_such_function")
    refused = build(tree)
    assert refused.returncode == 1
    assert "x_jobs.no_such_function is named but sql/src creates no such function" in refused.stderr


def test_release_freezes_the_expanded_upgrade_and_records_it(tree: Path) -> None:
    released, version = open_upgrade(tree)
    assert build(tree).returncode == 0
    name = f"x_jobs--{released}--{version}.sql"
    expanded = (tree / "sql" / name).read_bytes()

    done = build(tree, "release")
    assert done.returncode == 0, done.stderr
    frozen = tree / "sql" / name
    assert frozen.read_bytes() == expanded
    control = tree / f"sql/x_jobs--{version}.control"
    assert re.search(r"^superuser = ", control.read_text(), re.MULTILINE)
    recorded = (tree / "sql/RELEASED").read_text().splitlines()[-2:]
    assert recorded == [
        f"{hashlib.sha256(frozen.read_bytes()).hexdigest()}  sql/{name}",
        f"{hashlib.sha256(control.read_bytes()).hexdigest()}  sql/{control.name}",
    ]
    assert f"/sql/{name}\n" not in (tree / ".gitignore").read_text()
    assert "--@function" not in (tree / "sql/src/upgrade.sql").read_text().replace(
        "`--@function", ""
    )
    subprocess.run(["sha256sum", "--check", "--quiet", "sql/RELEASED"], cwd=tree, check=True)

    # The released version builds from sql/src with no upgrade open; a change to a function is
    # then refused until the next version is started.
    assert build(tree).returncode == 0
    edit(tree / "sql/src/30-helpers.sql", f"SELECT '{version}'::text", "SELECT 'next'::text")
    refused = build(tree)
    assert refused.returncode == 1
    assert f"x_jobs.version() differs from {version}: {version} is released" in refused.stderr
