"""The webhook receiver against what can never succeed and against clients that hold it: real
HTTP against ``serve()`` (raw sockets where a client must misbehave), real logins.

- Its database login needs x_jobs_webhook: a producer's is refused receive_webhook (on 0.4.1 it
  recorded the id, and the real delivery was then a dropped duplicate).
- A correctly signed body nested hundreds deep is refused 400, before any parser, and writes
  nothing (it was answered 500, which the sender retries for ever).
- A Content-Type other than JSON is refused 415.
- A chunked body is read, chunk by chunk, within the size limit (it was read as empty and
  refused 401), and refused 411 under a WSGI server that hands on neither its chunks nor their
  end.
- A connection that sends nothing, or trickles its request, is answered 408 and closed at the
  read deadline (it held a thread for ever); beyond max_connections a connection is answered
  503 with Retry-After at once, and served again once a slot is free.
"""

from __future__ import annotations

import io
import json
import logging
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIServer

import httpx
import pytest
from conftest import DEADLINE_SECONDS, Conn, wait_for
from psycopg import sql
from standardwebhooks.webhooks import Webhook

import x_jobs
from x_jobs import errors
from x_jobs.webhooks import MAX_DEPTH, MAX_DEPTH_LIMIT, Receiver, new_secret, serve

logger = logging.getLogger(__name__)

SECRET = new_secret()
SOURCE = "shop"
#: An undeclared job: the body is its input as it is.
JOB = "hooks.received"


def signed(
    body: bytes, webhook_id: str, content_type: str | None = "application/json"
) -> dict[str, str]:
    stamp = int(time.time())
    headers = {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": Webhook(SECRET).sign(
            webhook_id, datetime.fromtimestamp(stamp, UTC), body.decode()
        ),
    }
    if content_type is not None:
        headers["content-type"] = content_type
    return headers


def written(conn: Conn) -> tuple[int, int]:
    """(ledger rows, jobs) in the test's database."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM x_jobs.webhook_ledger), (SELECT count(*) FROM x_jobs.job)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def nested(depth: int) -> bytes:
    """A JSON document ``depth`` arrays and objects deep: objects, then arrays, within."""
    objects = depth // 2
    arrays = depth - objects
    return ('{"a":' * objects + "[" * arrays + "1" + "]" * arrays + "}" * objects).encode()


@contextmanager
def login(admin: Conn, role: str) -> Iterator[str]:
    """A LOGIN role that is a member of ``role`` only; its name. Dropped afterwards."""
    name = f"x_jobs_test_{role.removeprefix('x_jobs_')}_{uuid.uuid4().hex[:8]}"
    admin.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(name), sql.Identifier(role)
        )
    )
    try:
        yield name
    finally:
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def app(admin: Conn, dsn: str) -> Iterator[x_jobs.App]:
    """An app whose login is granted x_jobs_webhook alone, as a receiver's is."""
    with login(admin, "x_jobs_webhook") as role:
        app = x_jobs.App(f"{dsn} user={role}", pool_size=4)
        try:
            yield app
        finally:
            app.close()


@pytest.fixture
def receiver(app: x_jobs.App) -> Receiver:
    return Receiver(app, secret=SECRET, job=JOB, source=SOURCE)


@contextmanager
def serving(receiver: Receiver, **options: Any) -> Iterator[tuple[str, int]]:
    """``serve(receiver, **options)`` on a free port, in a thread; yields (url, port)."""
    servers: queue.Queue[WSGIServer] = queue.Queue()
    thread = threading.Thread(
        target=serve,
        args=(receiver, "127.0.0.1", 0),
        kwargs={"ready": servers.put, **options},
        daemon=True,
    )
    thread.start()
    server = servers.get(timeout=DEADLINE_SECONDS)
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks", server.server_port
    finally:
        server.shutdown()
        thread.join(DEADLINE_SECONDS)


def read_all(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends until it closes the connection, failing after ``timeout``."""
    sock.settimeout(timeout)
    got = b""
    while piece := sock.recv(65536):
        got += piece
    return got


# --- the role ----------------------------------------------------------------------------------


def test_the_receiver_needs_the_webhook_role_and_a_producer_login_is_refused(
    admin: Conn, dsn: str, conn: Conn, receiver: Receiver
) -> None:
    body = b'{"order": 1}'
    with login(admin, "x_jobs_producer") as role:
        producing = x_jobs.App(f"{dsn} user={role}", pool_size=1)
        try:
            early = Receiver(producing, secret=SECRET, job=JOB, source=SOURCE)
            with pytest.raises(errors.PermissionDenied, match="receive_webhook"):
                early.receive(signed(body, "msg_1"), body)
        finally:
            producing.close()
    # Nothing was recorded ahead of the delivery: the receiver's own is a new webhook.
    assert written(conn) == (0, 0)
    status, answer = receiver.receive(signed(body, "msg_1"), body)
    assert (status, answer["duplicate"]) == (200, False)
    assert written(conn) == (1, 1)


# --- depth -------------------------------------------------------------------------------------


def test_a_deeply_nested_signed_body_is_refused_400_and_writes_nothing(
    receiver: Receiver, conn: Conn
) -> None:
    deep = nested(500)
    with serving(receiver) as (url, _):
        reply = httpx.post(url, content=deep, headers=signed(deep, "msg_deep"))
        assert reply.status_code == 400, reply.text
        assert f"deeper than {MAX_DEPTH} levels" in reply.json()["error"]
        assert written(conn) == (0, 0)

        # As deep as allowed is received; brackets within strings do not count.
        edge = nested(MAX_DEPTH)
        reply = httpx.post(url, content=edge, headers=signed(edge, "msg_edge"))
        assert reply.status_code == 200, reply.text
        quoted = json.dumps({"s": "[{" * 400 + '\\"[', "t": ["]"]}).encode()
        reply = httpx.post(url, content=quoted, headers=signed(quoted, "msg_quoted"))
        assert reply.status_code == 200, reply.text
    assert written(conn) == (2, 2)
    stored = conn.execute("SELECT input FROM x_jobs.job ORDER BY id").fetchall()
    assert stored == [(json.loads(edge),), (json.loads(quoted),)]


def test_the_deepest_max_depth_allowed_is_held_by_every_part_on_the_way(
    app: x_jobs.App, conn: Conn
) -> None:
    deepest = Receiver(app, secret=SECRET, job=JOB, source=SOURCE, max_depth=MAX_DEPTH_LIMIT)
    body = nested(MAX_DEPTH_LIMIT)
    assert deepest.receive(signed(body, "msg_deepest"), body)[0] == 200
    too_deep = nested(MAX_DEPTH_LIMIT + 1)
    assert deepest.receive(signed(too_deep, "msg_too_deep"), too_deep)[0] == 400
    assert written(conn) == (1, 1)
    with pytest.raises(ValueError, match="max_depth"):
        Receiver(app, secret=SECRET, job=JOB, source=SOURCE, max_depth=MAX_DEPTH_LIMIT + 1)


# --- content type ------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_content_type_other_than_json_is_refused_415(
    receiver: Receiver, conn: Conn, content_type: str | None
) -> None:
    body = b'{"order": 2}'
    with serving(receiver) as (url, _):
        headers = signed(body, "msg_type", content_type=content_type)
        if content_type is None:
            # httpx names no type for raw content; the request goes without the header.
            assert "content-type" not in httpx.Request("POST", url, content=body).headers
        reply = httpx.post(url, content=body, headers=headers)
    assert reply.status_code == 415, reply.text
    assert reply.headers["accept-post"] == "application/json"
    assert written(conn) == (0, 0)


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON; charset=utf-8", "application/cloudevents+json"],
)
def test_json_content_types_are_received(receiver: Receiver, conn: Conn, content_type: str) -> None:
    body = b'{"order": 3}'
    with serving(receiver) as (url, _):
        reply = httpx.post(url, content=body, headers=signed(body, "msg_json", content_type))
    assert reply.status_code == 200, reply.text
    assert written(conn) == (1, 1)


# --- chunked bodies ----------------------------------------------------------------------------


def test_a_chunked_body_is_read_whole(receiver: Receiver, conn: Conn) -> None:
    body = json.dumps({"order": 4, "note": "x" * 5000}).encode()

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(body), 1000):
            yield body[at : at + 1000]

    with serving(receiver) as (url, _):
        request = httpx.Request("POST", url, content=chunks(), headers=signed(body, "msg_chunked"))
        assert request.headers["transfer-encoding"] == "chunked"
        with httpx.Client() as client:
            reply = client.send(request)
    assert reply.status_code == 200, reply.text
    (stored,) = conn.execute("SELECT input FROM x_jobs.job").fetchall()
    assert stored == (json.loads(body),)


def test_a_chunked_body_over_the_limit_is_refused_413(app: x_jobs.App, conn: Conn) -> None:
    small = Receiver(app, secret=SECRET, job=JOB, source=SOURCE, max_body=1000)
    body = json.dumps({"note": "x" * 3000}).encode()
    with serving(small) as (_, port), socket.create_connection(("127.0.0.1", port)) as sock:
        head = "".join(f"{name}: {value}\r\n" for name, value in signed(body, "msg_big").items())
        sock.sendall(
            f"POST /hooks HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n{head}\r\n".encode()
        )
        for at in range(0, len(body), 500):
            piece = body[at : at + 500]
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sock.sendall(b"0\r\n\r\n")
        answer = read_all(sock, DEADLINE_SECONDS)
    assert answer.startswith(b"HTTP/1.0 413 "), answer
    assert written(conn) == (0, 0)


def _environ(body: bytes, **extra: Any) -> dict[str, Any]:
    headers = signed(body, "msg_wsgi")
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "CONTENT_TYPE": headers.pop("content-type"),
        "HTTP_TRANSFER_ENCODING": "chunked",
        "wsgi.input": io.BytesIO(body),
        **{"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()},
    }
    environ.update(extra)
    return environ


def test_under_another_wsgi_server_a_chunked_body_is_read_to_its_end_or_refused_411(
    receiver: Receiver, conn: Conn
) -> None:
    body = b'{"order": 5}'
    statuses: list[str] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: Any = None, /
    ) -> Callable[[bytes], object]:
        statuses.append(status)
        return lambda data: None

    # A server that hands on neither the chunks nor where they end: 411, final.
    answer = b"".join(receiver.wsgi(_environ(body), start_response))
    assert statuses[-1].startswith("411 "), answer
    assert "Content-Length" in json.loads(answer)["error"]
    # One that decoded them and ends the input there (wsgi.input_terminated): read to the end.
    answer = b"".join(
        receiver.wsgi(_environ(body, **{"wsgi.input_terminated": True}), start_response)
    )
    assert statuses[-1].startswith("200 "), answer
    assert written(conn) == (1, 1)


# --- idle and slow connections -----------------------------------------------------------------


def test_an_idle_connection_is_answered_408_and_closed_at_the_deadline(receiver: Receiver) -> None:
    with serving(receiver, read_timeout=1.0) as (_, port):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            answer = read_all(sock, 10.0)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.0 408 "), answer
    assert 0.9 <= took < 5.0, took


def test_a_trickled_request_is_cut_at_the_deadline_not_at_each_byte(receiver: Receiver) -> None:
    """A timeout per read would let a client that sends a byte every half second hold the
    connection for ever; the deadline counts from the accept."""
    with serving(receiver, read_timeout=1.5) as (_, port):
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.settimeout(10.0)
            request = b"POST /hooks HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            answer = b""
            for byte in request:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break  # closed by the server
                time.sleep(0.25)
                if time.monotonic() - started > 5.0:
                    break
            answer = read_all(sock, 10.0)
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.0 408 "), answer
    assert took < 5.0, took


def test_connections_beyond_the_bound_are_answered_503_and_served_once_a_slot_frees(
    receiver: Receiver, conn: Conn
) -> None:
    body = b'{"order": 6}'
    with serving(receiver, read_timeout=30.0, max_connections=2) as (url, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
        try:
            started = time.monotonic()
            reply = httpx.post(url, content=body, headers=signed(body, "msg_busy"), timeout=10.0)
            assert reply.status_code == 503, reply.text
            assert reply.headers["retry-after"] == "1"
            # At once, not after an idle connection's deadline.
            assert time.monotonic() - started < 5.0
            assert written(conn) == (0, 0)
        finally:
            for sock in idle:
                sock.close()

        # The idle connections closed, their slots are free again.
        def served() -> bool:
            answer = httpx.post(url, content=body, headers=signed(body, "msg_busy"), timeout=10.0)
            return answer.status_code == 200

        wait_for(served, "a slot to be free again")
    assert written(conn) == (1, 1)


def test_the_server_options_are_checked(receiver: Receiver) -> None:
    with pytest.raises(ValueError, match="read_timeout"):
        serve(receiver, "127.0.0.1", 0, read_timeout=0)
    with pytest.raises(ValueError, match="max_connections"):
        serve(receiver, "127.0.0.1", 0, max_connections=0)
