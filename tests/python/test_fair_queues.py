"""Fair queues end to end: a queue made fair (``x_jobs.set_queue_policy``) shares its claims
across tenants in turns, so that one tenant's flood does not hold back the others' few jobs.

Worker processes logged in as a role granted x_jobs_worker alone drain a fair and a plain queue
loaded alike (a noisy neighbour's 2,000 jobs, then four tenants' 20): on the fair one the four
are served within the first turns, on the plain one after the flood. An App's worker honours
the weights; a bound worker claims only its tenant's rows; ``queue_demand`` stays exact; the
CLI sets and lists policies and refuses bad weights; ending fairness gives FIFO order back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, Connect, serving, wait_for
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.types.json import Jsonb
from typer.testing import CliRunner

import x_jobs
from x_jobs.cli import cli
from x_jobs.queues import queue_policies, set_queue_policy
from x_jobs.tenants import bind_tenant

#: The noisy neighbour: tenant 'a' floods first, then each quiet tenant enqueues a few.
FLOOD, FEW, QUIET = 2000, 20, ("b", "c", "d", "e")
#: The drain: CLAIMERS processes, each claiming QTY at a time and completing what it got.
CLAIMERS, QTY = 2, 5

# One claimer process: claim QTY and complete them until the queue has no ready row left (an
# empty claim alone does not say so: the other claimer may hold the rows this one picked).
CLAIMER = """
import sys
import psycopg
dsn, queue, worker, qty = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with psycopg.connect(dsn, autocommit=True) as conn:
    while True:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM x_jobs.claim(queues => ARRAY[%s], worker => %s,"
            " lease => '5 minutes', qty => %s) WHERE state = 'running'",
            [queue, worker, qty],
        )]
        if ids:
            conn.execute(
                "SELECT x_jobs.complete_many(ids => %s::bigint[], worker => %s)", [ids, worker]
            )
            continue
        left = conn.execute(
            "SELECT EXISTS (SELECT FROM x_jobs.job WHERE queue = %s AND state = 'ready')",
            [queue],
        ).fetchone()
        if not left[0]:
            break
"""


def _login(admin: Conn, dsn: str, prefix: str) -> tuple[str, str]:
    """A LOGIN role granted x_jobs_worker alone, and a DSN that logs in as it."""
    role = f"x_jobs_test_{prefix}_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_worker").format(sql.Identifier(role))
    )
    params: dict[str, Any] = conninfo_to_dict(dsn)
    params["user"] = role
    return role, make_conninfo("", **params)


@pytest.fixture
def worker_login(admin: Conn, dsn: str) -> Iterator[tuple[str, str]]:
    """(role, DSN) of a LOGIN role granted x_jobs_worker alone."""
    role, conninfo = _login(admin, dsn, "fair")
    try:
        yield role, conninfo
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _enqueue(conn: Conn, queue: str, tenants: list[str]) -> None:
    """One job per entry of ``tenants``, in that order, in one enqueue_many."""
    requests = [{"name": "work", "queue": queue, "tenant_id": t} for t in tenants]
    conn.execute("SELECT count(*) FROM x_jobs.enqueue_many(%s)", [Jsonb(requests)])


def _claim_one_at_a_time(conn: Conn, queue: str, worker: str) -> list[str]:
    """The tenants of the rows claims of qty 1 on ``conn`` (one session) take, until none is
    left."""
    order: list[str] = []
    while True:
        row = conn.execute(
            "SELECT tenant_id FROM x_jobs.claim(queues => ARRAY[%s], worker => %s, qty => 1)",
            [queue, worker],
        ).fetchone()
        if row is None:
            return order
        order.append(str(row[0]))


def _drain(dsn: str, queue: str) -> None:
    claimers = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER, dsn, queue, f"{queue}-claimer-{n}", str(QTY)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(CLAIMERS)
    ]
    for p in claimers:
        _, err = p.communicate(timeout=DEADLINE_SECONDS * 4)
        assert p.returncode == 0, err


def _starts(conn: Conn, queue: str) -> dict[str, list[datetime]]:
    """Each tenant's jobs' started_at, earliest first."""
    rows = conn.execute(
        "SELECT tenant_id, started_at FROM x_jobs.job WHERE queue = %s ORDER BY started_at, id",
        [queue],
    ).fetchall()
    starts: dict[str, list[datetime]] = {}
    for tenant, started_at in rows:
        assert started_at is not None, "a job was never started"
        starts.setdefault(str(tenant), []).append(started_at)
    return starts


def test_a_noisy_neighbour_delays_the_others_by_turns_on_a_fair_queue_not_by_its_flood(
    conn: Conn, worker_login: tuple[str, str]
) -> None:
    _, worker_dsn = worker_login
    set_queue_policy(conn, "fair", fair=True)
    flood_then_few = ["a"] * FLOOD + [t for t in QUIET for _ in range(FEW)]
    _enqueue(conn, "fair", flood_then_few)
    _enqueue(conn, "plain", flood_then_few)

    _drain(worker_dsn, "fair")
    _drain(worker_dsn, "plain")
    done = conn.execute(
        "SELECT queue, count(*) FROM x_jobs.job WHERE state = 'done' GROUP BY queue ORDER BY queue"
    ).fetchall()
    assert done == [("fair", FLOOD + FEW * len(QUIET)), ("plain", FLOOD + FEW * len(QUIET))]

    # Fair: while the five tenants all have ready rows, a claim of QTY = 5 visits each of them
    # and takes one row of each (a tenant takes max(weight, qty - tenants + 1) = 1 a turn). So
    # a claim starts at most one of a's jobs, and the quiet tenants' 80 are gone after about 20
    # claims (a few more where the two claimers race for the same rows, and a claim that comes
    # second skips what the first holds): about 20 of a's jobs start before the last of theirs,
    # ten times fewer than the 200 allowed here. A FIFO order would start all 2,000 first.
    fair = _starts(conn, "fair")
    a = fair.pop("a")
    last_quiet = max(s for starts in fair.values() for s in starts)
    assert sorted(fair) == list(QUIET)
    assert last_quiet < a[199], sum(s <= last_quiet for s in a)

    # Plain: FIFO, so a claim takes a quiet tenant's row only once a's rows before it are
    # taken. The other claimer's claim in flight meanwhile holds at most QTY of them (and takes
    # at most another QTY while this claim's statement runs): every quiet tenant's job starts
    # no earlier than the last 2 * QTY of a's.
    plain = _starts(conn, "plain")
    a = plain.pop("a")
    first_quiet = min(s for starts in plain.values() for s in starts)
    assert sorted(plain) == list(QUIET)
    assert first_quiet >= a[FLOOD - 2 * QTY - 1], sum(s > first_quiet for s in a)


def test_an_apps_worker_takes_a_weighted_tenants_turns(dsn: str, conn: Conn) -> None:
    """Weights {'a': 3}: a takes three rows a turn, b one. The worker claims one job at a time
    (concurrency 1, no prefetch), so its claims go on across claims of one session: the order it
    starts jobs in is the turns' exactly, a a a b, until both run out together."""
    set_queue_policy(conn, "weighted", fair=True, weights={"a": 3})
    app = x_jobs.App(dsn)
    started: list[str] = []

    @app.job(name="work", queue="weighted", tenant=lambda input: str(input["t"]))
    def work(input: dict[str, Any], ctx: x_jobs.JobContext) -> None:
        assert ctx.tenant_id == input["t"]
        started.append(ctx.tenant_id)

    try:
        app.enqueue_many(work, [{"t": "a"}] * 30 + [{"t": "b"}] * 10)
        with serving(app, concurrency=1, prefetch=0):
            wait_for(lambda: len(started) == 40, "the worker to run every job")
    finally:
        app.close()
    assert started == ["a", "a", "a", "b"] * 10


def test_a_bound_worker_claims_only_its_tenants_rows_from_a_fair_queue(
    admin: Conn, dsn: str, conn: Conn
) -> None:
    set_queue_policy(conn, "shared", fair=True)
    _enqueue(conn, "shared", ["a"] * 20 + ["b"] * 5 + ["a"] * 20)
    role, bound_dsn = _login(admin, dsn, "bound")
    try:
        bind_tenant(conn, role, "b")
        claimed: list[str] = []
        with psycopg.connect(bound_dsn, autocommit=True) as bound:
            while True:
                rows = bound.execute(
                    "SELECT tenant_id FROM x_jobs.claim(queues => ARRAY['shared'],"
                    " worker => 'bound-1', qty => 3)"
                ).fetchall()
                if not rows:
                    break
                claimed.extend(str(r[0]) for r in rows)
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    # Every one of b's jobs, and none of a's, which wait as they were.
    assert claimed == ["b"] * 5
    left = conn.execute(
        "SELECT tenant_id, state::text, count(*) FROM x_jobs.job WHERE queue = 'shared'"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()
    assert left == [("a", "ready", 40), ("b", "running", 5)]


def test_the_cli_sets_and_lists_a_policy_and_refuses_bad_weights(dsn: str, conn: Conn) -> None:
    runner = CliRunner(env={"COLUMNS": None})
    empty = runner.invoke(cli, ["queues", "policy", "--dsn", dsn])
    assert empty.exit_code == 0, empty.output
    assert empty.stdout.strip() == "no queue has a policy"

    argv = ["queues", "policy", "mail", "--fair", "--weight", "acme=3", "--weight", "b=c=2"]
    made = runner.invoke(cli, [*argv, "--json", "--dsn", dsn])
    assert made.exit_code == 0, made.output
    doc = json.loads(made.stdout)
    assert (doc["queue"], doc["fair"], doc["weights"], doc["index_ready"]) == (
        "mail",
        True,
        {"acme": 3, "b=c": 2},  # the last '=' divides: a tenant id may hold one
        True,
    )
    # It is the database's policy, as the SQL and the Python API read it.
    (policy,) = queue_policies(conn)
    assert (policy.queue, policy.fair, policy.weights) == ("mail", True, {"acme": 3, "b=c": 2})
    assert policy.fair_index == doc["fair_index"] and policy.index_ready is True

    listed = runner.invoke(cli, ["queues", "policy", "--json", "--dsn", dsn])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.stdout)["policies"]
    assert row == doc
    table = runner.invoke(cli, ["queues", "policy", "--dsn", dsn])
    assert table.exit_code == 0, table.output
    assert "mail" in table.stdout and "acme=3 b=c=2" in table.stdout

    # A weight out of 1..1000: refused by the database, coded, exit 1, nothing changed.
    for bad in ("acme=0", "acme=1001"):
        refused = runner.invoke(cli, ["queues", "policy", "mail", "--weight", bad, "--dsn", dsn])
        assert refused.exit_code == 1, refused.output
        assert refused.stderr.startswith("x-jobs: X_QUEUE_POLICY_INVALID: "), refused.stderr
        assert "\nhint: " in refused.stderr
    as_json = runner.invoke(
        cli, ["queues", "policy", "mail", "--weight", "acme=0", "--json", "--dsn", dsn]
    )
    assert as_json.exit_code == 1
    error = json.loads(as_json.stdout)["error"]
    assert (error["code"], error["sqlstate"]) == ("X_QUEUE_POLICY_INVALID", "XJ066")
    # Not TENANT=N: a usage error before anything is sent.
    usage = runner.invoke(cli, ["queues", "policy", "mail", "--weight", "acme", "--dsn", dsn])
    assert usage.exit_code == 2, usage.output
    (policy,) = queue_policies(conn)
    assert (policy.fair, policy.weights) == (True, {"acme": 3, "b=c": 2})

    # The Python API raises the typed error for the same refusal, and for weights of no object.
    with pytest.raises(x_jobs.QueuePolicyInvalid) as caught:
        set_queue_policy(conn, "mail", weights={"acme": 0})
    assert caught.value.code == "X_QUEUE_POLICY_INVALID" and caught.value.hint
    with pytest.raises(psycopg.Error) as raw:
        conn.execute("SELECT x_jobs.set_queue_policy('mail', weights => '[3]')")
    assert isinstance(x_jobs.translate(raw.value), x_jobs.QueuePolicyInvalid)

    cleared = runner.invoke(
        cli, ["queues", "policy", "mail", "--no-fair", "--clear-weights", "--json", "--dsn", dsn]
    )
    assert cleared.exit_code == 0, cleared.output
    doc = json.loads(cleared.stdout)
    assert (doc["fair"], doc["weights"], doc["fair_index"], doc["index_ready"]) == (
        False,
        {},
        None,
        None,
    )


def test_setting_a_policy_needs_an_admin(conn: Conn, worker_login: tuple[str, str]) -> None:
    """A worker may read the policies, not set one (X_PERMISSION_DENIED, exit 2)."""
    _, worker_dsn = worker_login
    set_queue_policy(conn, "mail", fair=True)
    runner = CliRunner(env={"COLUMNS": None})
    listed = runner.invoke(cli, ["queues", "policy", "--json", "--dsn", worker_dsn])
    assert listed.exit_code == 0, listed.output
    assert [p["queue"] for p in json.loads(listed.stdout)["policies"]] == ["mail"]
    refused = runner.invoke(cli, ["queues", "policy", "mail", "--no-fair", "--dsn", worker_dsn])
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.startswith("x-jobs: X_PERMISSION_DENIED: "), refused.stderr
    with (
        psycopg.connect(worker_dsn, autocommit=True) as worker,
        pytest.raises(x_jobs.PermissionDenied),
    ):
        set_queue_policy(worker, "mail", fair=False)
    assert [(p.queue, p.fair) for p in queue_policies(conn)] == [("mail", True)]


def test_a_bound_admin_may_not_set_a_queues_policy(admin: Conn, dsn: str, conn: Conn) -> None:
    """A queue serves every tenant: a role bound to one is refused (X_CROSS_TENANT, exit 1),
    and the policy stays as it was."""
    role = f"x_jobs_test_admin_{uuid.uuid4().hex[:8]}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN IN ROLE x_jobs_admin").format(sql.Identifier(role)))
    try:
        bind_tenant(conn, role, "b")
        params: dict[str, Any] = conninfo_to_dict(dsn)
        params["user"] = role
        bound_dsn = make_conninfo("", **params)
        runner = CliRunner(env={"COLUMNS": None})
        refused = runner.invoke(cli, ["queues", "policy", "mail", "--fair", "--dsn", bound_dsn])
        assert refused.exit_code == 1, refused.output
        assert refused.stderr.startswith("x-jobs: X_CROSS_TENANT: "), refused.stderr
        with (
            psycopg.connect(bound_dsn, autocommit=True) as bound,
            pytest.raises(x_jobs.errors.CrossTenant),
        ):
            set_queue_policy(bound, "mail", fair=True)
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    assert queue_policies(conn) == []


def _demand(conn: Conn, queue: str) -> int:
    row = conn.execute(
        "SELECT demand FROM x_jobs.queue_demand() WHERE queue = %s", [queue]
    ).fetchone()
    return 0 if row is None else int(row[0])


def _wanted(conn: Conn, queue: str) -> int:
    """What the queue asks of its workers, counted from the table: its due rows (ready, or
    delayed with run_at now or past) and its running rows (no worker drains here)."""
    row = conn.execute(
        "SELECT count(*) FROM x_jobs.job WHERE queue = %s AND ("
        " (state IN ('ready', 'delayed') AND run_at <= x_jobs.now()) OR state = 'running')",
        [queue],
    ).fetchone()
    assert row is not None
    return int(row[0])


def _claim(conn: Conn, queue: str, qty: int) -> list[int]:
    rows = conn.execute(
        "SELECT id FROM x_jobs.claim(queues => ARRAY[%s], worker => 'w1', qty => %s)",
        [queue, qty],
    ).fetchall()
    return [int(r[0]) for r in rows]


def _complete(conn: Conn, ids: list[int]) -> None:
    conn.execute("SELECT x_jobs.complete_many(ids => %s::bigint[], worker => 'w1')", [ids])


def test_queue_demand_counts_a_fair_queues_due_jobs_exactly(conn: Conn) -> None:
    set_queue_policy(conn, "fd", fair=True, weights={"a": 2})
    _enqueue(conn, "fd", ["a"] * 30 + ["b"] * 5 + ["c"] * 5)
    # Not due: delayed an hour.
    for t in "abcab":
        conn.execute(
            "SELECT x_jobs.enqueue('work', queue => 'fd', tenant_id => %s,"
            " run_at => x_jobs.now() + interval '1 hour')",
            [t],
        )
    assert _wanted(conn, "fd") == 40
    assert _demand(conn, "fd") == 40

    # Claimed, the rows are still the queue's work (running); completed, they are not.
    held = _claim(conn, "fd", 7)
    assert len(held) == 7
    assert _demand(conn, "fd") == 40 == _wanted(conn, "fd")
    _complete(conn, held)
    assert _demand(conn, "fd") == 33 == _wanted(conn, "fd")

    # Exact in the sense that matters to a scaler too: what it counts is what claims hand out.
    claimed = 0
    while held := _claim(conn, "fd", 4):
        claimed += len(held)
        _complete(conn, held)
        assert _demand(conn, "fd") == 33 - claimed == _wanted(conn, "fd")
    assert claimed == 33
    assert _demand(conn, "fd") == 0


def test_ending_fairness_gives_fifo_order_back(conn: Conn, connect: Connect) -> None:
    # Fair: A A A A B B C claimed one at a time comes out A B C A B A A.
    made = set_queue_policy(conn, "back", fair=True)
    assert made.fair and made.index_ready
    _enqueue(conn, "back", list("AAAABBC"))
    assert _claim_one_at_a_time(conn, "back", "w1") == list("ABCABAA")

    ended = set_queue_policy(conn, "back", fair=False)
    assert (ended.fair, ended.fair_index, ended.index_ready) == (False, None, None)
    # The index is gone with the fairness.
    assert conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_class WHERE relname = %s", [made.fair_index]
    ).fetchone() == (0,)
    # FIFO again, in the session whose cursor stood on the queue and in a new one alike.
    _enqueue(conn, "back", list("AAAABBC"))
    assert _claim_one_at_a_time(conn, "back", "w1") == list("AAAABBC")
    _enqueue(conn, "back", list("CBA"))
    assert _claim_one_at_a_time(connect(), "back", "w2") == list("CBA")
