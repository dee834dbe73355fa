"""What `x-jobs` shows a script, pinned: the ``--help`` text of every command and group at a
fixed terminal width, and the shape of every ``--json`` document (its keys and the JSON types
of their values, recursively; not the values, which hold ids and times) with the exit code of
each command, error cases included. Both are promises to the scripts that call x-jobs: a
change to either fails here, whatever the code that produces it looks like.

The snapshots live in tests/python/snapshots/cli/. After a deliberate change of the help text
or of a JSON document, write them anew with ``X_JOBS_UPDATE_SNAPSHOTS=1`` and review the diff.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import Conn, fresh_database
from typer.testing import CliRunner

from x_jobs.cli import cli

logger = logging.getLogger(__name__)

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots" / "cli"
UPDATE = os.environ.get("X_JOBS_UPDATE_SNAPSHOTS") == "1"
#: A terminal rich renders the same way on every machine: 100 columns, no colour.
HELP_ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}
runner = CliRunner(env={"COLUMNS": None})


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group of the app, as the words that name it (the root is ())."""
    paths: list[tuple[str, ...]] = []

    def walk(command: Any, path: tuple[str, ...]) -> None:
        paths.append(path)
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, (*path, name))

    walk(typer.main.get_command(cli), ())
    return paths


def snapshot_file(*parts: str) -> Path:
    return SNAPSHOTS.joinpath(*parts)


def matches_snapshot(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: write it with X_JOBS_UPDATE_SNAPSHOTS=1"
    assert text == path.read_text(), f"{path} differs from what x-jobs prints now"


@pytest.mark.parametrize("path", command_paths(), ids=lambda path: " ".join(path) or "x-jobs")
def test_help_text_is_the_snapshot(path: tuple[str, ...]) -> None:
    result = runner.invoke(cli, [*path, "--help"], env=HELP_ENV)
    assert result.exit_code == 0, result.output
    name = "-".join(path) or "x-jobs"
    matches_snapshot(snapshot_file("help", f"{name}.txt"), result.stdout)


def test_groups_without_a_command_print_their_help_with_the_snapshot_exit_code() -> None:
    codes = {}
    for path in command_paths():
        result = runner.invoke(cli, list(path), env=HELP_ENV)
        if path and "Usage: x-jobs" not in result.output:
            continue  # a command that runs (queues) or needs arguments, not a bare group
        codes[" ".join(path) or "x-jobs"] = result.exit_code
    matches_snapshot(snapshot_file("bare-groups.json"), json.dumps(codes, indent=2) + "\n")


# --- the --json documents ---------------------------------------------------------------------


def shape(value: Any) -> Any:
    """The JSON types of ``value``: a type name for a scalar, {key: shape} for an object,
    ["list of", shape] for an array (the shapes of its items merged), "empty list"."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        if not value:
            return "empty list"
        merged = shape(value[0])
        for item in value[1:]:
            merged = merge(merged, shape(item))
        return ["list of", merged]
    if value is None:
        return "null"
    return {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def merge(a: Any, b: Any) -> Any:
    """Two shapes as one: objects with the same keys merged key by key, arrays item by item,
    else ["one of", the alternatives]."""
    if a == b:
        return a
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {key: merge(a[key], b[key]) for key in a}
    if isinstance(a, list) and isinstance(b, list) and a[0] == b[0] == "list of":
        return ["list of", merge(a[1], b[1])]
    found: list[Any] = []
    for option in [*alternatives(a), *alternatives(b)]:
        if option not in found:
            found.append(option)
    return ["one of", sorted(found, key=lambda s: json.dumps(s, sort_keys=True))]


def alternatives(shape_: Any) -> list[Any]:
    if isinstance(shape_, list) and shape_[0] == "one of":
        return list(shape_[1])
    return [shape_]


class Recorder:
    """Runs x-jobs commands with --json and keeps, per case, the exit code and the shape of
    the document (with the X_ code of an error document, part of the promise too)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.cases: dict[str, dict[str, Any]] = {}

    def run(self, case: str, *args: str, dsn: str | None = None, input: str | None = None) -> Any:
        argv = [*args, "--json", "--dsn", self.dsn if dsn is None else dsn]
        result = runner.invoke(cli, argv, input=input)
        assert isinstance(result.exception, SystemExit | None), repr(result.exception)
        doc = json.loads(result.stdout)
        entry: dict[str, Any] = {"exit_code": result.exit_code, "shape": shape(doc)}
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            entry["code"] = doc["error"]["code"]
        assert case not in self.cases
        self.cases[case] = entry
        return doc


@pytest.fixture
def plain_dsn(admin: Conn) -> Iterator[str]:
    """A database without x_jobs, for `install`."""
    with fresh_database(admin, "template1", prefix="x_jobs_plain") as conninfo:
        yield conninfo


def claim(conn: Conn, queue: str, worker: str) -> int:
    row = conn.execute(
        "SELECT id FROM x_jobs.claim(queues => ARRAY[%s], worker => %s, qty => 1)",
        [queue, worker],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_json_shapes_and_exit_codes_are_the_snapshot(dsn: str, conn: Conn, plain_dsn: str) -> None:
    x = Recorder(dsn)
    # Jobs of every kind an operator meets: ready, deduped, a run with progress and steps, a
    # dead one with an error, one asleep on a step.
    enqueued = x.run("enqueue", "enqueue", "send", "--input", '{"to": "ada"}', "--queue", "mail")
    mail = int(enqueued["id"])
    x.run("enqueue keyed", "enqueue", "send", "--input", "{}", "--idempotency-key", "k1")
    x.run("enqueue deduped", "enqueue", "send", "--input", "{}", "--idempotency-key", "k1")
    x.run("enqueue flow", "enqueue", "flow", "--input", "[1, 2.5, null]", "--queue", "flows")
    x.run(
        "enqueue fragile",
        "enqueue",
        "fragile",
        "--input",
        "{}",
        "--queue",
        "fragile",
        "--max-attempts",
        "1",
    )
    x.run("enqueue nap", "enqueue", "nap", "--input", "{}", "--queue", "naps", "--delay", "0")

    held = claim(conn, "flows", "w1")
    conn.execute(
        "SELECT x_jobs.progress(id => %s, worker => 'w1', done => 3, total => 10, note => 'n')",
        [held],
    )
    for step, output, error, compensation in [
        ("fetch", '{"rows": 2}', None, False),
        ("charge", None, "card expired", True),
    ]:
        conn.execute(
            "SELECT x_jobs.step_record(id => %s, worker => 'w1', step => %s, output => %s,"
            " error => %s, compensation => %s)",
            [held, step, output, error, compensation],
        )
    conn.execute(
        "SELECT x_jobs.step_wait(id => %s, worker => 'w1', step => 'approve',"
        " event => 'approved', event_key => 'k', timeout => '1 hour')",
        [held],
    )
    dead = claim(conn, "fragile", "w2")
    conn.execute(
        "SELECT x_jobs.fail(id => %s, worker => 'w2', error => 'boom',"
        " error_stack => 'Traceback', retry_delay => '0')",
        [dead],
    )
    asleep = claim(conn, "naps", "w3")
    conn.execute(
        "SELECT x_jobs.step_sleep(id => %s, worker => 'w3', step => 'nap', duration => '1 day')",
        [asleep],
    )
    state = conn.execute("SELECT state::text FROM x_jobs.job WHERE id = %s", [dead]).fetchone()
    assert state == ("dead",)

    x.run("jobs list", "jobs", "list")
    x.run("jobs list full page", "jobs", "list", "--limit", "2")
    x.run("jobs list by name", "jobs", "list", "--name", "send")
    x.run("jobs list empty", "jobs", "list", "--state", "cancelled")
    x.run("jobs show with steps", "jobs", "show", str(held))
    x.run("jobs show with errors", "jobs", "show", str(dead))
    x.run("jobs show unknown", "jobs", "show", "999999")
    x.run("jobs list unknown state", "jobs", "list", "--state", "bogus")

    x.run("events publish no waiter", "events", "publish", "nobody.waits")
    x.run("events publish", "events", "publish", "approved", "--payload", '{"ok": 1}', "--key", "k")
    x.run("steps resolve", "steps", "resolve", str(asleep), "nap", "--output", '"done"')
    x.run("steps resolve unknown", "steps", "resolve", str(asleep), "nope")

    x.run("jobs retry one", "jobs", "retry", str(dead))
    x.run("jobs cancel one", "jobs", "cancel", str(mail))
    x.run("jobs cancel finished", "jobs", "cancel", str(mail))
    x.run("jobs cancel several", "jobs", "cancel", str(mail), str(dead))
    x.run("jobs retry several", "jobs", "retry", str(mail), str(dead))
    x.run("jobs retry not retryable", "jobs", "retry", str(held))
    x.run("jobs retry unknown", "jobs", "retry", "999999")
    x.run("jobs retry by filter", "jobs", "retry", "--state", "cancelled", "--yes")
    x.run("jobs cancel by filter", "jobs", "cancel", "--queue", "mail", "--yes")
    x.run("jobs cancel by filter none", "jobs", "cancel", "--queue", "nowhere", "--yes")
    x.run("jobs cancel by filter no terminal", "jobs", "cancel", "--queue", "default")
    x.run("jobs cancel ids and filters", "jobs", "cancel", "1", "--queue", "default")

    x.run("queues", "queues")
    x.run("queues pause", "queues", "pause", "mail")
    x.run("queues pause again", "queues", "pause", "mail")
    x.run("queues resume", "queues", "resume", "mail")
    x.run("queues options before pause", "queues", "--json", "pause", "mail")
    x.run("queues policy empty", "queues", "policy")
    x.run("queues policy set", "queues", "policy", "shared", "--fair", "--weight", "acme=3")
    x.run("queues policy", "queues", "policy")
    x.run("queues policy of one", "queues", "policy", "shared")
    x.run("queues policy bad weight", "queues", "policy", "shared", "--weight", "acme=0")
    x.run("queues policy not a weight", "queues", "policy", "shared", "--weight", "acme")
    x.run("queues policy unfair", "queues", "policy", "shared", "--no-fair", "--clear-weights")

    x.run("schedules list empty", "schedules", "list")
    x.run("schedules sync", "schedules", "sync", "apps.scheduled:v1")
    x.run("schedules sync prune", "schedules", "sync", "apps.scheduled:v2", "--prune")
    x.run("schedules pause", "schedules", "pause", "report")
    x.run("schedules resume", "schedules", "resume", "report")
    x.run("schedules run", "schedules", "run", "report")
    x.run("schedules list", "schedules", "list")
    x.run("schedules show", "schedules", "show", "report")
    x.run("schedules show unknown", "schedules", "show", "nope")
    x.run("schedules run unknown", "schedules", "run", "nope")
    x.run(
        "schedules preview",
        "schedules",
        "preview",
        "*/15 9-17 * * MON-FRI",
        "--tz",
        "America/New_York",
        "--count",
        "3",
    )
    x.run("schedules preview after", "schedules", "preview", "@daily", "--after", "2030-01-01")
    x.run("schedules preview bad cron", "schedules", "preview", "61 * * * *")
    x.run("schedules preview bad zone", "schedules", "preview", "@daily", "--tz", "Mars/Base")
    x.run("tick", "tick")

    x.run("tenants list empty", "tenants", "list")
    x.run("tenants bind", "tenants", "bind", "x_jobs_worker", "acme")
    x.run("tenants list", "tenants", "list")
    x.run("tenants bind unknown role", "tenants", "bind", "x_jobs_no_such_role", "acme")
    x.run("tenants unbind", "tenants", "unbind", "x_jobs_worker", "acme")
    x.run("tenants unbind again", "tenants", "unbind", "x_jobs_worker", "acme")

    for topic, key in [("order.paid", "o-1"), ("order.paid", "o-2"), ("user.created", None)]:
        conn.execute(
            "SELECT x_jobs.outbox_put(topic => %s, payload => '{\"n\": 1}', key => %s,"
            ' headers => \'{"trace": "t"}\')',
            [topic, key],
        )
    claimed_messages = conn.execute(
        "SELECT id FROM x_jobs.relay_outbox(relay => 'r1', qty => 1, lease => '1 hour')"
    ).fetchall()
    (message,) = claimed_messages[0]
    conn.execute(
        "SELECT x_jobs.outbox_nack(id => %s, relay => 'r1', error => 'HTTP 500',"
        " retryable => false)",
        [message],
    )
    x.run("outbox list", "outbox", "list")
    x.run("outbox list full page", "outbox", "list", "--limit", "1")
    x.run("outbox list unknown state", "outbox", "list", "--state", "bogus")
    x.run("outbox show", "outbox", "show", str(message))
    x.run("outbox show unknown", "outbox", "show", "999999")
    x.run("outbox redrive", "outbox", "redrive", str(message))
    x.run("outbox redrive none", "outbox", "redrive", "--topic", "order.paid")
    x.run("outbox redrive nothing named", "outbox", "redrive")

    conn.execute(
        "SELECT x_jobs.declare_job('deploy.report', queue => 'deploy', max_attempts => 3,"
        " timeout => '1 minute', concurrency_limit => 2, declared_by => 'host:1:new',"
        " build => 'v2')"
    )
    conn.execute(
        "SELECT x_jobs.announce_worker('host:1:new', ARRAY['deploy'],"
        " jobs => ARRAY['deploy.report'])"
    )
    x.run("manifest", "manifest")
    x.run("manifest of an app", "manifest", "apps.deploy:new")
    x.run("maintain", "maintain")
    x.run("maintain off", "maintain", "--jobs", "off", "--outbox", "1h")

    x.run("not installed", "queues", dsn=plain_dsn)
    x.run("install", "install", dsn=plain_dsn)
    x.run("install current", "install", dsn=plain_dsn)
    x.run("install over the extension", "install")

    # Errors before any work: usage, input, connection.
    x.run("usage unknown option", "jobs", "list", "--nope")
    x.run("usage unknown command", "nope")
    x.run("input not json", "enqueue", "x", "--input", "{nope")
    x.run("input from a missing file", "enqueue", "x", "--input", "@/nonexistent/x.json")
    x.run(
        "run-at and delay",
        "enqueue",
        "x",
        "--input",
        "{}",
        "--delay",
        "1",
        "--run-at",
        "2030-01-01",
    )
    x.run("bad dsn", "jobs", "list", dsn="host=/nonexistent")

    text = json.dumps(x.cases, indent=2, sort_keys=True) + "\n"
    matches_snapshot(snapshot_file("json-shapes.json"), text)
