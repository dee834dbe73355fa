"""The outbox relay as a real process: ``python -m x_jobs relay apps.relays:app``, against a real
database and, for webhooks, a real HTTP server on 127.0.0.1 (a :class:`Receiver` behind
wsgiref), with nothing mocked.

What the relays delivered is read from what their sinks recorded (``apps.relays``: the
``delivery`` table, the jobs they enqueued) and from what the endpoint saw; what they settled,
from ``x_jobs.outbox``.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, LiteralString
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIEnvironment

import psycopg
import pydantic
import pytest
from apps import relays as relay_app
from conftest import DEADLINE_SECONDS, Conn, Connect, wait_for
from netcut import Proxy
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import x_jobs
from x_jobs.relay import Relay
from x_jobs.webhooks import Receiver, new_secret

logger = logging.getLogger(__name__)

#: tests/python: the relays' working directory and PYTHONPATH, so that ``apps.*`` imports.
TESTS_DIR = Path(__file__).resolve().parent

SECRET = new_secret()
SOURCE = "relay-tests"
HOOKED = "hooked"

OUTBOX: LiteralString = """
    SELECT id, state::text, attempt, last_error FROM x_jobs.outbox WHERE id = ANY (%s) ORDER BY id
"""
STATES: LiteralString = """
    SELECT state::text, count(*) FROM x_jobs.outbox WHERE id = ANY (%s) GROUP BY state
"""


# --- relay processes ---------------------------------------------------------------------------


class RelayProcess:
    """One ``x-jobs relay`` process, its output in a log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log_path = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, signum: signal.Signals) -> None:
        os.kill(self.pid, signum)

    def cpu_share(self, seconds: float) -> float:
        """The CPU time the process (all its threads) used over the next ``seconds`` of wall
        time, per second: about 1 for a thread that spins."""

        def cpu() -> float:
            # /proc/<pid>/stat: utime and stime are the 14th and 15th fields, in clock ticks.
            fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        used, start = cpu(), time.monotonic()
        time.sleep(seconds)
        return (cpu() - used) / (time.monotonic() - start)

    def kill(self) -> None:
        """kill -9, and wait until the process is gone."""
        self.signal(signal.SIGKILL)
        self.wait()

    def wait(self, timeout: float = DEADLINE_SECONDS) -> int:
        """Wait for the process to exit; answer its exit status (negative: killed by a signal)."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"relay {self.pid} still runs after {timeout:.0f} s; its log:\n{self.log()}"
            )


class Relays:
    """The relay processes of one test, on the test's database; kills what still runs at the
    end."""

    def __init__(self, dsn: str, logs: Path) -> None:
        self.dsn = dsn
        self.dbname = str(conninfo_to_dict(dsn)["dbname"])
        self.logs = logs
        self.processes: list[RelayProcess] = []

    def __enter__(self) -> Relays:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(relay_app.SCHEMA)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for relay in self.processes:
            if relay.alive():
                relay.kill()

    def start(
        self,
        *,
        concurrency: int = 8,
        lease: float = 2.0,
        poll: float = 0.1,
        grace: float = 10.0,
        hook_url: str | None = None,
        app: str = "apps.relays:app",
        via: str | None = None,
    ) -> RelayProcess:
        """Start ``python -m x_jobs relay apps.relays:app`` (or ``app``) on this test's
        database; with ``hook_url``, its ``hooks`` topic posts there, signed with SECRET;
        ``via``: the DSN the relay reaches the database by (its sinks record the usual way)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("X_JOBS_TEST_HOOK_")}
        env.pop("DATABASE_URL", None)
        env["PGDATABASE"] = self.dbname
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
        env["PYTHONUNBUFFERED"] = "1"
        if hook_url is not None:
            env["X_JOBS_TEST_HOOK_URL"] = hook_url
            env["X_JOBS_TEST_HOOK_SECRET"] = SECRET
        log = self.logs / f"relay-{len(self.processes) + 1}.log"
        command = [
            sys.executable,
            "-m",
            "x_jobs",
            "relay",
            app,
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
            "--poll",
            str(poll),
            "--grace",
            str(grace),
        ]
        if via is not None:
            env["X_JOBS_TEST_RECORD_DSN"] = self.dsn
            command += ["--dsn", via]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, cwd=TESTS_DIR, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        relay = RelayProcess(proc, log)
        self.processes.append(relay)
        return relay

    def wait_for(
        self, condition: Callable[[], bool], what: str, timeout: float = DEADLINE_SECONDS
    ) -> None:
        """conftest's wait_for, failing with the relays' logs."""
        try:
            wait_for(condition, what, timeout)
        except pytest.fail.Exception as err:
            pytest.fail(f"{err}\n{self.report()}")

    def stop(self, relay: RelayProcess) -> None:
        """SIGTERM, and the exit status a drained relay has: 0."""
        relay.signal(signal.SIGTERM)
        code = relay.wait()
        assert code == 0, f"relay {relay.pid} exited {code}:\n{relay.log()}"

    def report(self) -> str:
        parts = []
        for relay in self.processes:
            status = "running" if relay.alive() else f"exited {relay.proc.returncode}"
            parts.append(f"--- relay {relay.pid} ({status}):\n{relay.log()[-4000:]}")
        return "\n".join(parts)


@pytest.fixture
def relays(dsn: str, tmp_path: Path) -> Iterator[Relays]:
    with Relays(dsn, tmp_path) as relays:
        yield relays


# --- the webhook endpoint ----------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One request the endpoint answered."""

    webhook_id: str
    status: int
    answer: Mapping[str, Any]
    at: float


class Endpoint:
    """A :class:`Receiver` served over HTTP on 127.0.0.1 (its WSGI app on wsgiref, a thread per
    request), steered by the test: ``refuse`` answers that status without receiving (None: the
    receiver answers); ``hold_first`` keeps the answer to the first received request, after
    the receiver has committed its ledger row and job, until ``release`` is set."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.refuse: int | None = None
        self.hold_first = False
        self.received = threading.Event()
        self.release = threading.Event()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = make_server(
            "127.0.0.1", 0, self.wsgi, server_class=_ThreadingWSGIServer, handler_class=_Quiet
        )
        self.url = f"http://127.0.0.1:{self._server.server_port}/hooks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Endpoint:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(DEADLINE_SECONDS)

    def wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        webhook_id = str(environ.get("HTTP_WEBHOOK_ID", ""))
        refuse = self.refuse
        if refuse is not None:
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            self._seen(webhook_id, refuse, {})
            body = f"endpoint says {refuse}".encode()
            start_response(
                f"{refuse} {HTTPStatus(refuse).phrase}",
                [("content-type", "text/plain"), ("content-length", str(len(body)))],
            )
            return [body]

        answered: list[tuple[str, list[tuple[str, str]]]] = []

        def capture(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            answered.append((status, headers))
            return lambda data: None

        body = b"".join(self.receiver.wsgi(environ, capture))
        status, headers = answered[0]
        with self._lock:
            first = not any(r.status == 200 for r in self.requests)
        self._seen(webhook_id, int(status.split()[0]), json.loads(body))
        if self.hold_first and first:
            self.received.set()
            self.release.wait(DEADLINE_SECONDS)
        start_response(status, headers)
        return [body]

    def _seen(self, webhook_id: str, status: int, answer: Mapping[str, Any]) -> None:
        with self._lock:
            self.requests.append(Request(webhook_id, status, answer, time.monotonic()))

    def seen(self) -> list[Request]:
        with self._lock:
            return list(self.requests)


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("endpoint: %s", format % args)


@pytest.fixture
def receiving(dsn: str) -> Iterator[x_jobs.App]:
    """The receiving service's app: the test's database, where its jobs and ledger land."""
    app = x_jobs.App(dsn, pool_size=4)
    yield app
    app.close()


@pytest.fixture
def endpoint(receiving: x_jobs.App) -> Iterator[Endpoint]:
    receiver = Receiver(receiving, secret=SECRET, job=HOOKED, source=SOURCE)
    with Endpoint(receiver) as endpoint:
        yield endpoint


# --- helpers -----------------------------------------------------------------------------------


def put(conn: Conn, topic: str, payloads: Sequence[Any], key: str | None = None) -> list[int]:
    """Put messages of ``topic`` in one transaction; answers their ids."""
    with conn.transaction():
        return [relay_app.app.outbox.put(topic, p, key=key, conn=conn) for p in payloads]


def states(conn: Conn, ids: Sequence[int]) -> dict[str, int]:
    return {str(state): int(n) for state, n in conn.execute(STATES, [list(ids)])}


def all_delivered(conn: Conn, ids: Sequence[int]) -> Callable[[], bool]:
    return lambda: states(conn, ids) == {"delivered": len(ids)}


def outbox(conn: Conn, ids: Sequence[int]) -> list[tuple[int, str, int, str | None]]:
    """(id, state, attempt, last_error) of each message, by id."""
    return [(int(i), str(s), int(a), e) for i, s, a, e in conn.execute(OUTBOX, [list(ids)])]


def deliveries(conn: Conn, topic: str) -> list[tuple[int, int]]:
    """(message id, attempt) of every recorded delivery of ``topic``, in the order they ran."""
    rows = conn.execute(
        "SELECT message_id, attempt FROM public.delivery WHERE topic = %s ORDER BY seq", [topic]
    )
    return [(int(m), int(a)) for m, a in rows]


def received(conn: Conn) -> tuple[int, int]:
    """(ledger rows, jobs) the receiver wrote."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM x_jobs.webhook_ledger), (SELECT count(*) FROM x_jobs.job)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


# --- the tests ---------------------------------------------------------------------------------


def test_only_committed_messages_go_out_once_each(
    relays: Relays, conn: Conn, connect: Connect
) -> None:
    relay = relays.start()
    app_conn = connect(autocommit=False, name="application")

    relay_app.app.outbox.put("record", {"n": 1}, conn=app_conn)
    app_conn.rollback()

    # Open: the relay claims around it, and delivers a message committed meanwhile.
    pending = relay_app.app.outbox.put("record", {"n": 2}, conn=app_conn)
    [committed] = put(conn, "record", [{"n": 3}])
    relays.wait_for(all_delivered(conn, [committed]), "the committed message to be delivered")
    assert deliveries(conn, "record") == [(committed, 1)]

    app_conn.commit()
    relays.wait_for(all_delivered(conn, [pending]), "the message committed late to be delivered")
    relays.stop(relay)

    assert deliveries(conn, "record") == [(committed, 1), (pending, 1)]
    # The rolled-back message left no row at all.
    assert conn.execute("SELECT payload FROM x_jobs.outbox ORDER BY id").fetchall() == [
        ({"n": 2},),
        ({"n": 3},),
    ]


def test_a_relay_killed_before_its_ack_is_covered_by_the_receivers_ledger(
    relays: Relays, endpoint: Endpoint, conn: Conn
) -> None:
    endpoint.hold_first = True
    first = relays.start(lease=2.0, hook_url=endpoint.url)
    [message] = put(conn, "hooks", [{"order": 7}], key="order-7")

    # The receiver has committed the ledger row and the job; the answer waits: kill the relay.
    if not endpoint.received.wait(DEADLINE_SECONDS):
        pytest.fail(f"the endpoint never received the webhook\n{relays.report()}")
    first.kill()
    endpoint.release.set()
    assert received(conn) == (1, 1)
    assert outbox(conn, [message]) == [(message, "inflight", 1, None)]

    # A second relay takes the message once the dead one's lease lapses, and sends it again.
    relays.start(lease=2.0, hook_url=endpoint.url)
    relays.wait_for(all_delivered(conn, [message]), "the second relay to deliver the message")

    seen = endpoint.seen()
    assert [(r.webhook_id, r.status, r.answer["duplicate"]) for r in seen] == [
        (f"msg_{message}", 200, False),
        (f"msg_{message}", 200, True),
    ]
    assert seen[0].answer["job_id"] == seen[1].answer["job_id"]
    # Not before the lease (claimed just before the first request) lapsed.
    assert seen[1].at - seen[0].at > 1.5
    assert outbox(conn, [message]) == [(message, "delivered", 2, None)]
    assert received(conn) == (1, 1)
    assert conn.execute(
        "SELECT l.source, l.webhook_id, j.name, j.input"
        " FROM x_jobs.webhook_ledger AS l JOIN x_jobs.job AS j ON j.id = l.job_id"
    ).fetchall() == [(SOURCE, f"msg_{message}", HOOKED, {"order": 7})]


def test_four_relays_deliver_each_key_in_put_order_and_every_message_once(
    relays: Relays, conn: Conn
) -> None:
    rng = random.Random(20261130)
    # A generous lease: no delivery outlives it, so none may be sent twice.
    fleet = [relays.start(concurrency=8, lease=30.0) for _ in range(4)]
    messages: list[dict[str, Any]] = [
        {"topic": "record", "key": f"key-{rng.randrange(100)}", "payload": {"n": n}}
        for n in range(10_000)
    ]
    with conn.transaction():
        ids = relay_app.app.outbox.put_many(messages, conn=conn)
    # No ANALYZE: relay_outbox must walk its index in order without statistics too (it sorted
    # every pending message on each claim before it pinned enable_bitmapscan off).
    assert ids == sorted(ids)
    put_order: dict[str, list[int]] = {}
    for message, message_id in zip(messages, ids, strict=True):
        put_order.setdefault(message["key"], []).append(message_id)

    relays.wait_for(all_delivered(conn, ids), "the 10,000 messages to be delivered", timeout=60.0)
    for relay in fleet:
        relays.stop(relay)

    delivered = conn.execute(
        "SELECT key, array_agg(message_id ORDER BY seq), array_agg(DISTINCT attempt),"
        " array_agg(DISTINCT pid) FROM public.delivery GROUP BY key"
    ).fetchall()
    assert {key: order for key, order, _, _ in delivered} == put_order
    assert {a for _, _, attempts, _ in delivered for a in attempts} == {1}
    # Every relay took part.
    assert {p for _, _, _, pids in delivered for p in pids} == {r.pid for r in fleet}


def test_an_endpoint_that_is_down_gets_every_message_once_it_is_back(
    relays: Relays, endpoint: Endpoint, conn: Conn
) -> None:
    endpoint.refuse = 503
    keys = ["a", "b", "c"]
    by_key = {
        key: put(conn, "hooks", [{"key": key, "n": n} for n in (1, 2)], key=key) for key in keys
    }
    heads = [ids[0] for ids in by_key.values()]
    tails = [ids[1] for ids in by_key.values()]
    ids = heads + tails
    relays.start(hook_url=endpoint.url)

    def retried() -> bool:
        rows = outbox(conn, heads)
        return all(state == "pending" and attempt >= 2 for _, state, attempt, _ in rows)

    relays.wait_for(retried, "each key's first message to be refused twice")
    # Each key's second message waits behind its first: never sent while the first fails.
    assert [(state, attempt) for _, state, attempt, _ in outbox(conn, tails)] == [
        ("pending", 0)
    ] * 3
    endpoint.refuse = None
    relays.wait_for(all_delivered(conn, ids), "every message to arrive once the endpoint is back")

    for _, _, attempt, error in outbox(conn, heads):
        assert attempt >= 3
        assert error is not None and "503" in error
    assert [a for _, _, a, _ in outbox(conn, tails)] == [1, 1, 1]
    seen = endpoint.seen()
    accepted = [r.webhook_id for r in seen if r.status == 200]
    assert sorted(accepted) == sorted(f"msg_{i}" for i in ids)
    for key_ids in by_key.values():
        wanted = [f"msg_{i}" for i in key_ids]
        assert [w for w in accepted if w in wanted] == wanted
    assert {r.webhook_id for r in seen if r.status == 503} == {f"msg_{i}" for i in heads}
    assert received(conn) == (6, 6)


def test_a_refusing_endpoint_sends_messages_to_dead_and_redrive_sends_them_again(
    relays: Relays, endpoint: Endpoint, conn: Conn
) -> None:
    endpoint.refuse = 422
    ids = put(conn, "hooks", [{"n": n} for n in range(3)])
    relays.start(hook_url=endpoint.url)
    relays.wait_for(lambda: states(conn, ids) == {"dead": 3}, "the refused messages to be dead")

    for _, _, attempt, error in outbox(conn, ids):
        assert attempt == 1
        assert error is not None and "422" in error
    # No retry: one request per message.
    assert sorted(r.webhook_id for r in endpoint.seen()) == sorted(f"msg_{i}" for i in ids)

    endpoint.refuse = None
    assert conn.execute("SELECT x_jobs.outbox_redrive(topic => 'hooks')").fetchone() == (3,)
    relays.wait_for(all_delivered(conn, ids), "the redriven messages to be delivered")

    assert [(state, attempt) for _, state, attempt, _ in outbox(conn, ids)] == [
        ("delivered", 1)
    ] * 3
    assert sorted((r.webhook_id, r.status) for r in endpoint.seen()) == sorted(
        [(f"msg_{i}", 422) for i in ids] + [(f"msg_{i}", 200) for i in ids]
    )
    assert received(conn) == (3, 3)


def test_the_job_sink_enqueues_one_job_per_message_even_when_sent_twice(
    relays: Relays, conn: Conn
) -> None:
    ids = put(conn, "jobs", [{"n": n} for n in range(3)])
    [lost] = put(conn, "jobs.lost", [{"n": 3}])
    relays.start()
    relays.wait_for(all_delivered(conn, [*ids, lost]), "the messages to be delivered")

    # The answer of the first attempt was lost: the relay sent the message again.
    assert deliveries(conn, "jobs.lost") == [(lost, 1), (lost, 2)]
    assert outbox(conn, [lost])[0][1:3] == ("delivered", 2)
    jobs = conn.execute(
        "SELECT name, queue, idempotency_key, input, state::text FROM x_jobs.job"
        " ORDER BY (input ->> 'n')::integer"
    ).fetchall()
    assert jobs == [
        ("relayed", "relayed", f"outbox:{i}", {"n": n}, "ready") for n, i in enumerate([*ids, lost])
    ]


def test_sigterm_lets_the_deliveries_in_flight_finish_and_ack(relays: Relays, conn: Conn) -> None:
    ids = put(conn, "gated", [{"gate": "drain", "n": n} for n in range(4)])
    relay = relays.start(concurrency=2)

    def begun() -> list[int]:
        return [int(r[0]) for r in conn.execute("SELECT message_id FROM public.begun ORDER BY 1")]

    relays.wait_for(lambda: len(begun()) == 2, "two deliveries to begin")
    in_flight = begun()
    # Full, its poll time past: it waits for a delivery to end, it does not spin (the gated
    # deliveries' own polling of their gate costs a few percent).
    assert relay.cpu_share(1.0) < 0.1
    relay.signal(signal.SIGTERM)
    relays.wait_for(lambda: "draining" in relay.log(), "the relay to start draining")
    # Draining: the same.
    assert relay.cpu_share(0.5) < 0.1
    assert relay.alive()

    conn.execute("INSERT INTO public.gate (name, open) VALUES ('drain', true)")
    code = relay.wait()
    assert code == 0, relay.log()

    # The two in flight were delivered and acked; nothing more was claimed.
    assert sorted(deliveries(conn, "gated")) == [(i, 1) for i in in_flight]
    assert {i: (s, a) for i, s, a, _ in outbox(conn, ids)} == {
        i: ("delivered", 1) if i in in_flight else ("pending", 0) for i in ids
    }
    assert begun() == in_flight
    assert "relay stopped" in relay.log()


class Order(pydantic.BaseModel):
    order: int


def test_the_job_sink_enqueues_a_batch_in_one_call_and_refuses_a_bad_input_alone(
    dsn: str, conn: Conn
) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="typed", queue="typed")
    def typed(input: Order) -> None: ...

    sink = app.outbox.to_job("orders", typed)
    messages = [
        x_jobs.OutboxMessage(id=n, topic="orders", key=None, payload=payload)
        for n, payload in ((1, {"order": 1}), (2, {"order": "not a number"}), (3, {"order": 3}))
    ]
    try:
        errors = sink.deliver_batch(messages)
        assert errors[0] is None and errors[2] is None
        assert isinstance(errors[1], x_jobs.DeliveryError) and not errors[1].retryable
        # Delivered again (a relay that died before its ack): the live jobs answer, no new ones.
        assert sink.deliver_batch([messages[0], messages[2]]) == [None, None]
    finally:
        app.close()
    rows = conn.execute(
        "SELECT idempotency_key, input FROM x_jobs.job WHERE name = 'typed' ORDER BY id"
    ).fetchall()
    assert rows == [("outbox:1", {"order": 1}), ("outbox:3", {"order": 3})]


def test_a_failure_the_database_cannot_store_does_not_stop_the_relay(dsn: str, conn: Conn) -> None:
    """A sink's error with a NUL byte made outbox_nack raise (PostgreSQL stores no NUL): the
    relay died with it, its delivered messages unacked and the key stuck."""
    app = x_jobs.App(dsn)

    @app.outbox.sink("nul")
    def deliver(message: x_jobs.OutboxMessage) -> None:
        if message.payload.get("bad"):
            raise ValueError("upstream said \x00")

    bad = app.outbox.put("nul", {"bad": True}, key="k", max_attempts=1)
    other = app.outbox.put("nul", {"bad": False}, key="other")
    relay = Relay(app, lease=5, poll_interval=0.1)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM x_jobs.outbox WHERE state IN ('pending', 'inflight')"
                ).fetchone()
                == (0,)
            ),
            "both messages to be settled",
        )
        assert thread.is_alive()
        rows = dict(
            (r[0], r[1:])
            for r in conn.execute("SELECT id, state::text, last_error FROM x_jobs.outbox")
        )
        assert rows[bad] == ("dead", "ValueError: upstream said \\x00")
        assert rows[other] == ("delivered", None)
    finally:
        relay.stop()
        relay.stop()
        thread.join(30)
        app.close()


# --- what a sink, the database or a signal may do to a relay ----------------------------------

#: The relay app with the sinks the tests below need besides apps.relays' (slow, hang).
EDGES = "apps.relay_edges:app"


def begun(conn: Conn) -> list[int]:
    """The message ids whose delivery began, once per delivery, in id order."""
    return [int(r[0]) for r in conn.execute("SELECT message_id FROM public.begun ORDER BY 1")]


def unsettled(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM x_jobs.outbox WHERE state IN ('pending', 'inflight')"
    ).fetchone()
    assert row is not None
    return int(row[0])


class Weird(BaseException):
    """A library's own BaseException, no Exception."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception's str() fails")


def test_a_sink_raising_what_is_no_exception_still_frees_its_room(dsn: str, conn: Conn) -> None:
    """A BaseException that is no Exception, or an exception whose str() raises, left its
    delivery without an outcome: the message counted as in flight for good, and once half the
    concurrency was lost so, the relay claimed nothing more."""
    app = x_jobs.App(dsn)
    raises: dict[str, BaseException] = {
        "exit": SystemExit(3),
        "interrupt": KeyboardInterrupt(),
        "weird": Weird("a library's own"),
        "unprintable": Unprintable(),
    }

    @app.outbox.sink("odd")
    def deliver(message: x_jobs.OutboxMessage) -> None:
        kind = message.payload.get("raise")
        if kind is not None:
            raise raises[kind]

    odd = {kind: app.outbox.put("odd", {"raise": kind}, max_attempts=1) for kind in raises}
    fine = [app.outbox.put("odd", {"n": n}) for n in range(3)]
    # Two at once: the first two odd ones alone used to stop it.
    relay = Relay(app, concurrency=2, lease=5, poll_interval=0.1, grace=3600)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: unsettled(conn) == 0, "every message to be settled")
        assert states(conn, fine) == {"delivered": 3}
        errors = {i: (s, e) for i, s, _, e in outbox(conn, list(odd.values()))}
        assert {kind: errors[i] for kind, i in odd.items()} == {
            "exit": ("dead", "SystemExit: 3"),
            "interrupt": ("dead", "KeyboardInterrupt"),
            "weird": ("dead", "Weird: a library's own"),
            "unprintable": ("dead", "Unprintable (its message could not be read)"),
        }
        # Nothing left in flight: the first stop drains at once, not after the grace (an hour).
        relay.stop()
        assert relay.wait_stopped(DEADLINE_SECONDS), "the drain waited for deliveries long over"
        assert (relay.delivered, relay.failed) == (3, 4)
    finally:
        relay.stop()
        relay.stop()
        thread.join(DEADLINE_SECONDS)
        app.close()


def test_the_job_sink_fails_only_the_messages_whose_job_is_refused(dsn: str, conn: Conn) -> None:
    """One message whose job the database refused (an empty tenant derived from its payload)
    failed the whole batch's enqueue_many: every message of the batch was retried, claimed
    together again, and all went dead. A tenant function raising (KeyError) failed them too."""
    app = x_jobs.App(dsn)

    @app.job(name="index_order", queue="orders", tenant=lambda p: p["tenant"])
    def index_order(order: dict[str, Any]) -> None: ...

    app.outbox.to_job("orders", index_order)
    with conn.transaction():
        good = [
            app.outbox.put("orders", {"tenant": "acme", "order": n}, max_attempts=3, conn=conn)
            for n in range(4)
        ]
        empty = app.outbox.put("orders", {"tenant": "", "order": 98}, max_attempts=3, conn=conn)
        missing = app.outbox.put("orders", {"order": 99}, max_attempts=3, conn=conn)
    relay = Relay(app, lease=5, poll_interval=0.1)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: unsettled(conn) == 0, "every message to be settled")
    finally:
        relay.stop()
        relay.stop()
        thread.join(DEADLINE_SECONDS)
        app.close()
    rows = {i: (s, a, e) for i, s, a, e in outbox(conn, [*good, empty, missing])}
    assert [rows[i] for i in good] == [("delivered", 1, None)] * 4
    # Dead at the first attempt, for good, each saying why.
    state, attempt, error = rows[empty]
    assert (state, attempt) == ("dead", 1)
    assert error is not None and "X_TENANT_INVALID" in error
    state, attempt, error = rows[missing]
    assert (state, attempt) == ("dead", 1)
    assert error is not None and "KeyError" in error
    jobs = conn.execute(
        "SELECT idempotency_key, tenant_id, input FROM x_jobs.job ORDER BY id"
    ).fetchall()
    assert jobs == [
        (f"outbox:{i}", "acme", {"tenant": "acme", "order": n}) for n, i in enumerate(good)
    ]


def test_a_delivery_slower_than_the_lease_goes_out_once_as_its_lease_is_extended(
    relays: Relays, conn: Conn
) -> None:
    """Without a heartbeat, a delivery slower than the lease was claimed again once the lease
    lapsed, and sent a second time while the first still ran."""
    # Each delivery takes three leases; two relays, either may take a lapsed message.
    ids = put(conn, "slow", [{"sleep": 6.0, "n": n} for n in range(3)])
    fleet = [relays.start(app=EDGES, lease=2.0, concurrency=4) for _ in range(2)]
    relays.wait_for(all_delivered(conn, ids), "the slow messages to be delivered")
    for relay in fleet:
        relays.stop(relay)

    # Each began once and was delivered once, at its first attempt.
    assert begun(conn) == sorted(ids)
    assert sorted(deliveries(conn, "slow")) == [(i, 1) for i in ids]
    assert [(s, a) for _, s, a, _ in outbox(conn, ids)] == [("delivered", 1)] * 3


def test_a_read_only_database_pauses_the_relay_and_loses_no_outcome(
    relays: Relays, conn: Conn
) -> None:
    """A refusal that is no lost connection (ReadOnlySqlTransaction, as during a failover)
    escaped the claim and the settlement, and ended the relay."""
    dbname = conn.info.dbname
    relay = relays.start(app=EDGES, lease=3.0)
    [held] = put(conn, "gated", [{"gate": "ro"}])
    relays.wait_for(lambda: begun(conn) == [held], "the gated delivery to begin")

    # New sessions are read-only; the relay's is ended, so it reconnects to a read-only one.
    try:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(
                sql.Identifier(dbname)
            )
        )
        conn.execute(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
            " WHERE datname = pg_catalog.current_database() AND application_name = 'x_jobs relay'"
        )
        # The delivery ends (the sink's own session predates the change): its ack is refused.
        conn.execute("INSERT INTO public.gate (name, open) VALUES ('ro', true)")
        relays.wait_for(
            lambda: deliveries(conn, "gated") == [(held, 1)], "the gated delivery to end"
        )
        relays.wait_for(
            lambda: relay.log().count("was refused; retrying") >= 2,
            "the relay to be refused, and to retry",
        )
        assert relay.alive(), relay.log()
        assert outbox(conn, [held]) == [(held, "inflight", 1, None)]
    finally:
        conn.execute(
            sql.SQL("ALTER DATABASE {} RESET default_transaction_read_only").format(
                sql.Identifier(dbname)
            )
        )

    # Writable again: the outcome kept is acked (not delivered again), and claims go on.
    relays.wait_for(all_delivered(conn, [held]), "the kept outcome to be acked")
    [later] = put(conn, "record", [{"n": 1}])
    relays.wait_for(all_delivered(conn, [later]), "a later message to be delivered")
    assert deliveries(conn, "gated") == [(held, 1)]
    assert outbox(conn, [held]) == [(held, "delivered", 1, None)]
    relays.stop(relay)


@pytest.mark.parametrize("how", ["grace", "second signal"])
def test_a_sink_that_never_returns_does_not_keep_a_stopped_relay_alive(
    relays: Relays, conn: Conn, how: str
) -> None:
    """The pool's threads were joined at exit: past the grace the relay said "relay stopped",
    and its process lived on, whatever the signals."""
    relay = relays.start(app=EDGES, grace=1.0 if how == "grace" else 3600.0)
    [stuck] = put(conn, "hang", [{}])
    relays.wait_for(lambda: begun(conn) == [stuck], "the hanging delivery to begin")

    relay.signal(signal.SIGTERM)
    if how == "second signal":
        relays.wait_for(lambda: "draining" in relay.log(), "the relay to start draining")
        relay.signal(signal.SIGTERM)
    assert relay.wait() == 0, relay.log()
    log = relay.log()
    assert "left to their leases" in log and "relay stopped" in log, log
    # Not acked: its lease lapses, and another relay sends it again.
    assert outbox(conn, [stuck]) == [(stuck, "inflight", 1, None)]


def test_a_relay_cut_off_from_the_database_abandons_its_call_and_relays_again(
    relays: Relays, conn: Conn, proxy: Proxy
) -> None:
    """The relay's network goes silent (no reset: its call is never answered, its connects
    never complete): it waited in that call for good. It abandons the call, gives up on each
    connect, and once the network is back delivers what was put meanwhile."""
    relay = relays.start(lease=4.0, via=proxy.dsn(relays.dbname))
    [first] = put(conn, "record", [{"n": 1}])
    relays.wait_for(all_delivered(conn, [first]), "the relay to deliver through the proxy")

    proxy.cut()
    [second] = put(conn, "record", [{"n": 2}])
    relays.wait_for(lambda: "its connection is abandoned" in relay.log(), "the call abandoned")
    relays.wait_for(
        lambda: (
            "unreachable; retrying" in relay.log()
            and "connection timeout expired" in relay.log().rpartition("abandoned")[2]
        ),
        "a reconnect to time out",
    )
    assert states(conn, [second]) == {"pending": 1}

    proxy.heal()
    relays.wait_for(all_delivered(conn, [second]), "the relay to deliver once healed")
    assert deliveries(conn, "record") == [(first, 1), (second, 1)]
    relays.stop(relay)


def test_a_sigterm_while_the_database_is_away_stops_at_the_end_of_the_grace(
    relays: Relays, conn: Conn, admin: Conn
) -> None:
    """A delivery that ended while the database was away left an outcome to settle, and the
    relay retried reconnecting for ever: the grace was ignored, only a second signal ended it."""
    dbname = sql.Identifier(conn.info.dbname)
    relay = relays.start(app=EDGES, grace=3.0)
    [held] = put(conn, "gated", [{"gate": "away"}])
    relays.wait_for(lambda: begun(conn) == [held], "the gated delivery to begin")
    try:
        # The database goes away for the relay: its sessions ended, new ones refused. (The
        # sink's own session, and this test's, stay.)
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(dbname))
        conn.execute(
            "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity"
            " WHERE datname = pg_catalog.current_database()"
            " AND application_name IN ('x_jobs relay', 'x_jobs relay listener')"
        )
        relay.signal(signal.SIGTERM)
        relays.wait_for(lambda: "draining" in relay.log(), "the relay to start draining")
        # The delivery ends: an outcome to ack, and no database to ack it.
        conn.execute("INSERT INTO public.gate (name, open) VALUES ('away', true)")
        assert relay.wait() == 0, relay.log()
    finally:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(dbname))
    log = relay.log()
    assert "database unreachable" in log and "left to their leases" in log, log
    assert deliveries(conn, "gated") == [(held, 1)]
    assert outbox(conn, [held]) == [(held, "inflight", 1, None)]
