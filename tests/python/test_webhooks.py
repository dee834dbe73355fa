"""Signed webhooks out (WebhookSink) and in (Receiver), over real sockets and a real database.

The sink posts to http.server endpoints on 127.0.0.1 that answer what a test asks (a status, a
Retry-After, a stall) and count the requests in flight; the receiver runs against the test's own
database, through ``receive`` itself, its WSGI app served by ``serve``, and its ASGI app called
with an ASGI scope. Nothing of the HTTP client or of x_jobs is mocked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit
from wsgiref.simple_server import WSGIServer

import httpx
import psycopg
import pytest
from conftest import DEADLINE_SECONDS, Conn, wait_for
from pydantic import BaseModel
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

import x_jobs
from x_jobs.errors import QueueInvalid, TenantInvalid
from x_jobs.outbox import DeliveryError, OutboxMessage
from x_jobs.relay import Relay
from x_jobs.webhooks import Receiver, WebhookSink, new_secret, serve

logger = logging.getLogger(__name__)

# The Standard Webhooks test vector (the spec's libraries test their sign() with it).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TIMESTAMP = 1614265330
VECTOR_PAYLOAD = '{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

SECRET = new_secret()
SOURCE = "shop"


class Order(BaseModel):
    order_id: int
    note: str = ""


def signed(
    body: bytes | str,
    *,
    webhook_id: str = "msg_1",
    secret: str = SECRET,
    timestamp: float | None = None,
) -> dict[str, str]:
    """Standard Webhooks headers computed by the library itself, independent of WebhookSink,
    with the Content-Type a sender sends."""
    text = body.decode() if isinstance(body, bytes) else body
    stamp = int(time.time() if timestamp is None else timestamp)
    return {
        "Content-Type": "application/json",
        "Webhook-Id": webhook_id,
        "Webhook-Timestamp": str(stamp),
        "Webhook-Signature": Webhook(secret).sign(
            webhook_id, datetime.fromtimestamp(stamp, UTC), text
        ),
    }


def written(conn: Conn) -> tuple[int, int]:
    """(ledger rows, jobs) in the test's database."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM x_jobs.webhook_ledger), (SELECT count(*) FROM x_jobs.job)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.fixture
def app(dsn: str) -> Iterator[x_jobs.App]:
    app = x_jobs.App(dsn, pool_size=6)

    @app.job(name="orders.paid", queue="orders")
    def paid(input: Order) -> None:
        pass

    yield app
    app.close()


@pytest.fixture
def receiver(app: x_jobs.App) -> Receiver:
    return Receiver(app, secret=SECRET, job=app.lookup("orders.paid"), source=SOURCE)


# --- the signature ---------------------------------------------------------------------------


def test_the_spec_vector_signs_alike_in_the_library_and_the_sink() -> None:
    at = datetime.fromtimestamp(VECTOR_TIMESTAMP, UTC)
    assert Webhook(VECTOR_SECRET).sign(VECTOR_ID, at, VECTOR_PAYLOAD) == VECTOR_SIGNATURE
    # The secret without its whsec_ prefix is the same key.
    unprefixed = VECTOR_SECRET.removeprefix("whsec_")
    assert Webhook(unprefixed).sign(VECTOR_ID, at, VECTOR_PAYLOAD) == VECTOR_SIGNATURE

    sink = WebhookSink("http://127.0.0.1:9/", secret=VECTOR_SECRET)
    try:
        headers = sink.signature_headers(
            VECTOR_ID, VECTOR_PAYLOAD.encode(), timestamp=VECTOR_TIMESTAMP
        )
    finally:
        sink.close()
    assert headers == {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TIMESTAMP),
        "webhook-signature": VECTOR_SIGNATURE,
    }


def test_the_library_verifies_the_vector_signature_and_refuses_one_bit_off() -> None:
    # verify() also checks that the timestamp is within five minutes of now, so the vector's
    # id, payload and secret are signed at now (as the spec libraries' own tests do).
    webhook = Webhook(VECTOR_SECRET)
    headers = signed(VECTOR_PAYLOAD, webhook_id=VECTOR_ID, secret=VECTOR_SECRET)
    assert webhook.verify(VECTOR_PAYLOAD, headers) == {"test": 2432232314}
    # Key rotation: several signatures, unknown versions skipped, one valid is enough.
    rotated = dict(headers)
    rotated["Webhook-Signature"] = " ".join(
        [
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            headers["Webhook-Signature"],
        ]
    )
    assert webhook.verify(VECTOR_PAYLOAD, rotated) == {"test": 2432232314}
    # The vector's signature with its last base64 digit changed, at the vector's own time.
    stale = {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TIMESTAMP),
        "webhook-signature": VECTOR_SIGNATURE,
    }
    with pytest.raises(WebhookVerificationError, match="too old"):
        webhook.verify(VECTOR_PAYLOAD, stale)
    # The last digit before the padding, changed for another (always another: "A" or "E").
    signature = headers["Webhook-Signature"]
    other = "E" if signature[-2] == "A" else "A"
    flipped = headers | {"Webhook-Signature": signature[:-2] + other + "="}
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        webhook.verify(VECTOR_PAYLOAD, flipped)


# --- the receiver ----------------------------------------------------------------------------

BODY = b'{"order_id":7,"note":"paid"}'


def _tampered() -> tuple[dict[str, str], bytes]:
    return signed(BODY), b'{"order_id":8,"note":"paid"}'


def _wrong_secret() -> tuple[dict[str, str], bytes]:
    return signed(BODY, secret=new_secret()), BODY


def _stale() -> tuple[dict[str, str], bytes]:
    return signed(BODY, timestamp=time.time() - 301), BODY


def _from_the_future() -> tuple[dict[str, str], bytes]:
    return signed(BODY, timestamp=time.time() + 301), BODY


def _unsigned() -> tuple[dict[str, str], bytes]:
    headers = signed(BODY)
    del headers["Webhook-Signature"]
    return headers, BODY


def _garbled_signature() -> tuple[dict[str, str], bytes]:
    return signed(BODY) | {"Webhook-Signature": "v1"}, BODY


def _not_utf8() -> tuple[dict[str, str], bytes]:
    return signed(BODY), b"\xff" + BODY


def _the_vector_at_its_time() -> tuple[dict[str, str], bytes]:
    return {
        "webhook-id": VECTOR_ID,
        "webhook-timestamp": str(VECTOR_TIMESTAMP),
        "webhook-signature": VECTOR_SIGNATURE,
    }, VECTOR_PAYLOAD.encode()


#: webhook-signature entries that verify nothing: not base64, without a comma or a signature,
#: with two commas, of an unknown version.
MALFORMED_ENTRIES = [
    "v1,not-base64!!",
    "v1,AAA",
    "v1",
    "v1,",
    ",",
    "v1,AAAA,AAAA",
    "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
]


def _malformed_entries_and_a_wrong_signature() -> tuple[dict[str, str], bytes]:
    wrong = signed(BODY, secret=new_secret())["Webhook-Signature"]
    return signed(BODY) | {"Webhook-Signature": " ".join([*MALFORMED_ENTRIES, wrong])}, BODY


def _the_valid_signature_as_another_version() -> tuple[dict[str, str], bytes]:
    headers = signed(BODY)
    return headers | {"Webhook-Signature": headers["Webhook-Signature"].replace("v1,", "v2,")}, BODY


def _two_header_lines_neither_valid() -> tuple[httpx.Headers, bytes]:
    headers = signed(BODY)
    wrong = [signed(BODY, secret=new_secret())["Webhook-Signature"] for _ in range(2)]
    del headers["Webhook-Signature"]
    # httpx's Headers is a Mapping that answers the two lines joined by ", ".
    return httpx.Headers([*headers.items(), *(("webhook-signature", w) for w in wrong)]), BODY


@pytest.mark.parametrize(
    "request_of",
    [
        _tampered,
        _wrong_secret,
        _stale,
        _from_the_future,
        _unsigned,
        _garbled_signature,
        _not_utf8,
        _the_vector_at_its_time,
        _malformed_entries_and_a_wrong_signature,
        _the_valid_signature_as_another_version,
        _two_header_lines_neither_valid,
    ],
)
def test_unverified_webhooks_are_refused_and_write_nothing(
    app: x_jobs.App,
    receiver: Receiver,
    conn: Conn,
    request_of: Callable[[], tuple[Mapping[str, str], bytes]],
) -> None:
    headers, body = request_of()
    if request_of is _the_vector_at_its_time:
        receiver = Receiver(app, secret=VECTOR_SECRET, job="orders.paid", source=SOURCE)
    status, answer = receiver.receive(headers, body)
    assert status == 401
    assert answer["error"]
    assert written(conn) == (0, 0)


def test_a_tighter_tolerance_refuses_what_the_default_accepts(app: x_jobs.App, conn: Conn) -> None:
    strict = Receiver(app, secret=SECRET, job="orders.paid", source=SOURCE, tolerance=60)
    status, answer = strict.receive(signed(BODY, timestamp=time.time() - 120), BODY)
    assert (status, written(conn)) == (401, (0, 0))
    assert "60 s" in answer["error"]
    with pytest.raises(ValueError, match="tolerance"):
        Receiver(app, secret=SECRET, job="orders.paid", source=SOURCE, tolerance=600)


def test_a_webhook_becomes_one_job_and_its_redelivery_a_duplicate(
    receiver: Receiver, conn: Conn
) -> None:
    headers = signed(BODY, webhook_id="msg_order_7")
    status, answer = receiver.receive(headers, BODY)
    assert status == 200
    assert answer["duplicate"] is False
    job_id = answer["job_id"]
    row = conn.execute(
        "SELECT name, queue, input FROM x_jobs.job WHERE id = %s", [job_id]
    ).fetchone()
    assert row == ("orders.paid", "orders", {"order_id": 7, "note": "paid"})
    ledger = conn.execute("SELECT source, webhook_id, job_id FROM x_jobs.webhook_ledger").fetchall()
    assert ledger == [(SOURCE, "msg_order_7", job_id)]

    # The sender retries (a lost 200, say): same id, a fresh timestamp and signature.
    again = signed(BODY, webhook_id="msg_order_7", timestamp=time.time() + 1)
    assert receiver.receive(again, BODY) == (200, {"job_id": job_id, "duplicate": True})
    assert written(conn) == (1, 1)
    # The same id from another sender is another webhook.
    other = Receiver(receiver.app, secret=SECRET, job="orders.paid", source="billing")
    status, answer = other.receive(headers, BODY)
    assert (status, answer["duplicate"]) == (200, False)
    assert answer["job_id"] != job_id
    assert written(conn) == (2, 2)


def test_a_body_that_is_not_json_or_not_the_input_is_refused(
    app: x_jobs.App, receiver: Receiver, conn: Conn
) -> None:
    for body in (b"order 7 paid", b'{"order_id": NaN}'):
        status, answer = receiver.receive(signed(body), body)
        assert status == 400, answer
    body = b'{"order_id": "seven"}'
    status, answer = receiver.receive(signed(body), body)
    assert status == 422
    assert "X_INPUT_INVALID" in answer["error"]
    assert written(conn) == (0, 0)

    # A job this app does not declare (another service's workers run it) takes the body as
    # it is, in the receiver's queue.
    loose = Receiver(app, secret=SECRET, job="ledger.import", source=SOURCE, queue="imports")
    # JSON with a NUL, which jsonb cannot hold: it was answered 500 ("send it again later"), so
    # the sender retried it for ever.
    nul = b'{"order_id": "7\\u0000"}'
    status, answer = loose.receive(signed(nul, webhook_id="msg_nul"), nul)
    assert status == 400, answer
    assert written(conn) == (0, 0)
    status, answer = loose.receive(signed(body), body)
    assert status == 200
    row = conn.execute(
        "SELECT name, queue, input FROM x_jobs.job WHERE id = %s", [answer["job_id"]]
    ).fetchone()
    assert row == ("ledger.import", "imports", {"order_id": "seven"})


class Shipment(BaseModel):
    order_id: int
    shop: str
    lane: str = "standard"


def test_a_value_the_database_refuses_in_the_request_is_answered_422_for_good(
    app: x_jobs.App, conn: Conn, served: str
) -> None:
    """A tenant or concurrency key the job derives from the body, or a webhook-id, that the
    database refuses escaped ``receive`` and was answered 500: the sender sent it for ever."""

    @app.job(
        name="orders.shipped",
        tenant=lambda shipment: shipment["shop"],
        concurrency=x_jobs.Concurrency(key=lambda shipment: shipment["lane"]),
    )
    def shipped(input: Shipment) -> None:
        pass

    receiver = Receiver(app, secret=SECRET, job=shipped, source=SOURCE)
    for n, (body, code) in enumerate(
        [
            (b'{"order_id": 1, "shop": ""}', "X_TENANT_INVALID"),
            (b'{"order_id": 1, "shop": "acme", "lane": ""}', "X_CONCURRENCY_INVALID"),
            (b'{"order_id": 1, "shop": "acme"}', "X_WEBHOOK_INVALID"),
        ]
    ):
        webhook_id = "msg_" + "x" * 300 if code == "X_WEBHOOK_INVALID" else f"msg_{n}"
        status, answer = receiver.receive(signed(body, webhook_id=webhook_id), body)
        assert status == 422, answer
        assert answer["error"].startswith(f"{code}: ")
    assert written(conn) == (0, 0)

    # Over HTTP, through the served WSGI app: the final 4xx a sender gives up on.
    reply = httpx.post(served, content=BODY, headers=signed(BODY, webhook_id="msg_" + "y" * 300))
    assert reply.status_code == 422
    assert reply.json()["error"].startswith("X_WEBHOOK_INVALID: ")
    assert written(conn) == (0, 0)


def test_a_refusal_of_the_receivers_own_configuration_still_raises(
    app: x_jobs.App, conn: Conn
) -> None:
    """A job name, queue or fixed option the database refuses is the receiver's to fix: it
    raises (the adapters answer 500), so that the sender's retries get through once fixed."""

    @app.job(name="orders.fixed", tenant="")
    def fixed(input: Order) -> None:
        pass

    misconfigured: list[tuple[Receiver, type[Exception]]] = [
        (Receiver(app, secret=SECRET, job=fixed, source=SOURCE), TenantInvalid),
        (Receiver(app, secret=SECRET, job="ledger.import", source=SOURCE, queue=""), QueueInvalid),
    ]
    for receiver, refusal in misconfigured:
        with pytest.raises(refusal):
            receiver.receive(signed(BODY), BODY)
    assert written(conn) == (0, 0)


def _lock_waiters(conn: Conn) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_catalog.pg_stat_activity"
        " WHERE datname = pg_catalog.current_database() AND wait_event_type = 'Lock'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_receipt_that_races_an_uncommitted_one_waits_and_answers_duplicate(
    receiver: Receiver, conn: Conn, dsn: str
) -> None:
    answers: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
    headers = signed(BODY, webhook_id="msg_race")
    with psycopg.connect(dsn, autocommit=True) as holder:
        with holder.transaction():
            # The first receipt, not yet committed: the second waits for it on the lock of the
            # webhook id, then finds its ledger row.
            row = holder.execute(
                "SELECT job_id FROM x_jobs.receive_webhook(%s, 'msg_race', 'orders.paid',"
                " %s::jsonb, 'orders')",
                [SOURCE, BODY.decode()],
            ).fetchone()
            assert row is not None
            thread = threading.Thread(target=lambda: answers.put(receiver.receive(headers, BODY)))
            thread.start()
            wait_for(lambda: _lock_waiters(conn) == 1, "the second receipt to wait on the first")
        thread.join(DEADLINE_SECONDS)
    assert answers.get(timeout=DEADLINE_SECONDS) == (200, {"job_id": row[0], "duplicate": True})
    assert written(conn) == (1, 1)


def test_concurrent_receipts_of_one_id_make_one_job(receiver: Receiver, conn: Conn) -> None:
    racers = 5
    barrier = threading.Barrier(racers)
    answers: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
    headers = signed(BODY, webhook_id="msg_burst")

    def receive() -> None:
        barrier.wait(DEADLINE_SECONDS)
        answers.put(receiver.receive(headers, BODY))

    threads = [threading.Thread(target=receive) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_SECONDS)
    got = [answers.get_nowait() for _ in range(racers)]
    assert {status for status, _ in got} == {200}
    assert len({answer["job_id"] for _, answer in got}) == 1
    assert sorted(answer["duplicate"] for _, answer in got) == [False] + [True] * (racers - 1)
    assert written(conn) == (1, 1)


# --- the adapters ----------------------------------------------------------------------------


@pytest.fixture
def served(receiver: Receiver) -> Iterator[str]:
    """The receiver's WSGI app on wsgiref, through ``serve``; yields its URL."""
    servers: queue.Queue[WSGIServer] = queue.Queue()
    thread = threading.Thread(
        target=serve, args=(receiver, "127.0.0.1", 0), kwargs={"ready": servers.put}
    )
    thread.start()
    server = servers.get(timeout=DEADLINE_SECONDS)
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks/orders"
    finally:
        server.shutdown()
        thread.join(DEADLINE_SECONDS)


def test_the_sink_and_the_served_receiver_agree_end_to_end(served: str, conn: Conn) -> None:
    sink = WebhookSink(served, secret=SECRET, headers={"X-Sender": "x_jobs tests"})
    message = OutboxMessage(
        id=42, topic="orders.paid", key="order-7", payload={"order_id": 7, "note": "é"}
    )
    try:
        sink.deliver(message)
        # A redelivery (the relay died before its ack): the same webhook-id, still one job.
        sink.deliver(dataclasses.replace(message, attempt=2))
    finally:
        sink.close()
    rows = conn.execute(
        "SELECT l.source, l.webhook_id, j.name, j.input"
        " FROM x_jobs.webhook_ledger AS l JOIN x_jobs.job AS j ON j.id = l.job_id"
    ).fetchall()
    assert rows == [(SOURCE, "msg_42", "orders.paid", {"order_id": 7, "note": "é"})]
    assert written(conn) == (1, 1)

    # A sender with another secret is refused for good; a body the job refuses too.
    impostor = WebhookSink(served, secret=new_secret())
    wrong_input = WebhookSink(served, secret=SECRET)
    try:
        with pytest.raises(DeliveryError, match="401") as refused:
            impostor.deliver(OutboxMessage(id=43, topic="orders.paid", key=None, payload={}))
        assert refused.value.retryable is False
        with pytest.raises(DeliveryError, match="422") as invalid:
            wrong_input.deliver(OutboxMessage(id=44, topic="orders.paid", key=None, payload={}))
        assert invalid.value.retryable is False
    finally:
        impostor.close()
        wrong_input.close()
    assert written(conn) == (1, 1)

    # Only POST.
    answer = httpx.get(served)
    assert (answer.status_code, answer.headers["allow"]) == (405, "POST")


def _call_asgi(
    receiver: Receiver, method: str, headers: Iterable[tuple[str, str]], chunks: list[bytes]
) -> tuple[int, Any]:
    """The receiver's ASGI app called as a server calls it: each header line as its own pair,
    the body in ``chunks``. Answers the status and the JSON answer."""
    events: list[MutableMapping[str, Any]] = [
        {"type": "http.request", "body": chunk, "more_body": n < len(chunks) - 1}
        for n, chunk in enumerate(chunks)
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return events.pop(0) if events else {"type": "http.disconnect"}

    async def send(event: MutableMapping[str, Any]) -> None:
        sent.append(event)

    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "path": "/hooks",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    asyncio.run(receiver.asgi(scope, receive, send))
    assert [event["type"] for event in sent] == ["http.response.start", "http.response.body"]
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    return int(sent[0]["status"]), json.loads(sent[1]["body"])


def test_the_asgi_app_answers_a_signed_request(receiver: Receiver, conn: Conn) -> None:
    body = b'{"order_id": 9}'

    def call(method: str, headers: dict[str, str], chunks: list[bytes]) -> tuple[int, Any]:
        return _call_asgi(receiver, method, headers.items(), chunks)

    # The body in two chunks, as a server streams it.
    status, answer = call("POST", signed(body, webhook_id="msg_asgi"), [body[:5], body[5:]])
    assert status == 200
    assert answer["duplicate"] is False
    assert written(conn) == (1, 1)
    assert call("POST", signed(body, webhook_id="msg_asgi"), [body])[1]["duplicate"] is True
    assert call("POST", signed(body, secret=new_secret()), [body])[0] == 401
    assert call("GET", {}, [b""])[0] == 405
    assert written(conn) == (1, 1)


# --- signature headers as senders and servers write them -------------------------------------


@pytest.mark.parametrize("malformed", MALFORMED_ENTRIES)
def test_a_malformed_signature_entry_does_not_hide_a_valid_one(
    receiver: Receiver, conn: Conn, malformed: str
) -> None:
    """An entry of the webhook-signature header that is no ``v1,<base64>`` made the whole
    verification fail, so the valid signature after it was answered 401 (final: the sender
    gave the webhook up). Every well-formed v1 entry is tried; the others are skipped."""
    headers = signed(BODY, webhook_id="msg_rotated")
    headers["Webhook-Signature"] = f"{malformed} {headers['Webhook-Signature']}"
    status, answer = receiver.receive(headers, BODY)
    assert status == 200, answer
    assert written(conn) == (1, 1)


def test_signatures_on_several_header_lines_are_all_tried(
    receiver: Receiver, conn: Conn, served: str
) -> None:
    """A sender rotating its secret may send the new signature and the old one on two
    webhook-signature lines. They reached the verification joined by commas (wsgiref's
    environ, httpx's Headers), which it could not parse, or as the last line alone (the ASGI
    adapter): the valid signature was refused."""
    stamp = time.time()

    def lines(webhook_id: str) -> list[tuple[str, str]]:
        valid = signed(BODY, webhook_id=webhook_id, timestamp=stamp)
        old = signed(BODY, webhook_id=webhook_id, timestamp=stamp, secret=new_secret())
        return [
            ("content-type", "application/json"),
            ("webhook-id", webhook_id),
            ("webhook-timestamp", valid["Webhook-Timestamp"]),
            ("webhook-signature", valid["Webhook-Signature"]),
            ("webhook-signature", old["Webhook-Signature"]),
        ]

    # A multi-valued mapping (httpx's Headers answers the lines joined by ", ").
    status, answer = receiver.receive(httpx.Headers(lines("msg_mapping")), BODY)
    assert status == 200, answer
    # The served WSGI app: wsgiref joins the lines with "," in the environ.
    reply = httpx.post(served, content=BODY, headers=lines("msg_wsgi"))
    assert reply.status_code == 200, reply.text
    # The ASGI app, which gets each line as its own pair.
    status, answer = _call_asgi(receiver, "POST", lines("msg_asgi"), [BODY])
    assert status == 200, answer
    assert written(conn) == (3, 3)


# --- JSON numbers as they were written -------------------------------------------------------

#: JSON numbers a Python float changes: more digits than a double holds, an integer written
#: with an exponent, beyond a double's range both ways, an integer Python does not read.
EXACT = (
    b'{"price": 0.10000000000000000001, "big": 12345678901234567890e0, "tiny": 1e-400,'
    b' "huge": 1E400, "long": 1' + b"0" * 5000 + b', "plain": [7, -0.5, "x"]}'
)


def test_a_body_taken_as_it_is_keeps_its_numbers(app: x_jobs.App, conn: Conn) -> None:
    """The receiver read the body into floats: 0.10000000000000000001 became 0.1 in the job's
    input, 12345678901234567890e0 became 12345678901234567000, 1e-400 became 0, and 1E400
    (infinity) or a 5000-digit integer was refused. jsonb holds every one of them."""
    loose = Receiver(app, secret=SECRET, job="ledger.import", source=SOURCE, queue="imports")
    status, answer = loose.receive(signed(EXACT), EXACT)
    assert status == 200, answer
    row = conn.execute(
        "SELECT input = %s::jsonb, input->>'price', input->>'big' FROM x_jobs.job WHERE id = %s",
        [EXACT.decode(), answer["job_id"]],
    ).fetchone()
    assert row == (True, "0.10000000000000000001", "12345678901234567890")


# --- the sink against scripted endpoints ---------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Endpoint:
    """What a scripted endpoint saw, and the gates its /hold and /stall paths wait at."""

    url: str
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    release: threading.Event = field(default_factory=threading.Event)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: Endpoint


#: How long a trickling endpoint waits between two bytes (seconds), and how many it sends:
#: 20 s in all, unless the endpoint is released.
TRICKLE_GAP, TRICKLE_BYTES = 0.2, 100


class _Scripted(BaseHTTPRequestHandler):
    """POST /<status>?<header>=<value>&...: answers that status with those headers and a short
    body. /hold and /stall wait for the endpoint's release first (then answer 200).
    /trickle/<status> sends its status and headers at once, then its body a byte at a time;
    /drip sends a status line, then its headers a byte at a time (until released)."""

    def do_POST(self) -> None:
        endpoint = cast(_Server, self.server).endpoint
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        with endpoint.lock:
            endpoint.seen.append(
                Seen(url.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            endpoint.in_flight += 1
            endpoint.peak = max(endpoint.peak, endpoint.in_flight)
        try:
            name = url.path.strip("/")
            if name.startswith("trickle"):
                self._trickle(endpoint, int(name.removeprefix("trickle").strip("/") or 200))
                return
            if name == "drip":
                self._drip(endpoint)
                return
            if name in {"hold", "stall"}:
                endpoint.release.wait(DEADLINE_SECONDS)
            status = int(name) if name.isdigit() else 200
            reply = f"endpoint says {status}".encode()
            self.send_response(status)
            for header, value in parse_qsl(url.query):
                self.send_header(header, value)
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        except OSError:
            pass  # the sink gave up (its timeout) and closed the connection
        finally:
            with endpoint.lock:
                endpoint.in_flight -= 1

    def _trickle(self, endpoint: Endpoint, status: int) -> None:
        self.send_response(status)
        self.send_header("content-length", str(TRICKLE_BYTES))
        self.end_headers()
        for _ in range(TRICKLE_BYTES):
            if endpoint.release.wait(TRICKLE_GAP):
                return
            self.wfile.write(b"x")

    def _drip(self, endpoint: Endpoint) -> None:
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for byte in b"x-slow: " + b"a" * TRICKLE_BYTES:
            if endpoint.release.wait(TRICKLE_GAP):
                return
            self.wfile.write(bytes([byte]))
        self.wfile.write(b"\r\ncontent-length: 0\r\n\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("endpoint: %s", format % args)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = _Server(("127.0.0.1", 0), _Scripted)
    server.endpoint = Endpoint(url=f"http://127.0.0.1:{server.server_port}")
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield server.endpoint
    finally:
        server.endpoint.release.set()
        server.shutdown()
        server.server_close()
        thread.join(DEADLINE_SECONDS)


def _message(n: int = 1) -> OutboxMessage:
    return OutboxMessage(
        id=n, topic="orders.paid", key=None, payload={"n": n}, headers={"X-Tenant": "acme"}
    )


@pytest.mark.parametrize("status", [200, 201, 204])
def test_a_2xx_delivers_a_signed_compact_json_post(endpoint: Endpoint, status: int) -> None:
    sink = WebhookSink(f"{endpoint.url}/{status}", secret=SECRET, headers={"X-Static": "on"})
    try:
        sink.deliver(_message(5))
    finally:
        sink.close()
    (seen,) = endpoint.seen
    assert seen.body == b'{"n":5}'
    assert seen.headers["content-type"] == "application/json"
    assert (seen.headers["x-static"], seen.headers["x-tenant"]) == ("on", "acme")
    assert seen.headers["webhook-id"] == "msg_5"
    assert abs(int(seen.headers["webhook-timestamp"]) - time.time()) < 60
    assert Webhook(SECRET).verify(seen.body, seen.headers) == {"n": 5}


def test_message_headers_cannot_override_the_signature(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, secret=SECRET, headers={"Webhook-Id": "static"})
    message = OutboxMessage(
        id=6, topic="t", key=None, payload=[], headers={"webhook-signature": "v1,forged"}
    )
    try:
        sink.deliver(message)
    finally:
        sink.close()
    (seen,) = endpoint.seen
    assert seen.headers["webhook-id"] == "msg_6"
    Webhook(SECRET).verify(seen.body, seen.headers)


@pytest.mark.parametrize(
    ("path", "retryable", "retry_at"),
    [
        ("/500", True, None),
        ("/502", True, None),
        ("/429?Retry-After=120", True, timedelta(seconds=120)),
        # An HTTP-date half an hour ahead, made when the test runs (within max_retry_after).
        ("/503?Retry-After={date}", True, "date"),
        ("/408", True, None),
        ("/400", False, None),
        ("/404", False, None),
        ("/410?Retry-After=5", False, None),
        ("/301?Location=/200", False, None),
    ],
)
def test_failures_say_whether_and_when_to_retry(
    endpoint: Endpoint,
    path: str,
    retryable: bool,
    retry_at: timedelta | datetime | str | None,
) -> None:
    if retry_at == "date":
        retry_at = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=30)
        path = path.format(date=format_datetime(retry_at, usegmt=True))
    sink = WebhookSink(endpoint.url + path, secret=SECRET)
    before = datetime.now(UTC)
    try:
        with pytest.raises(DeliveryError) as failed:
            sink.deliver(_message())
    finally:
        sink.close()
    error = failed.value
    status = urlsplit(path).path.strip("/")
    assert f"answered {status}" in str(error)
    assert f"endpoint says {status}" in str(error)
    assert error.retryable is retryable
    if isinstance(retry_at, timedelta):
        assert error.retry_at is not None
        assert before + retry_at <= error.retry_at <= datetime.now(UTC) + retry_at
    else:
        assert error.retry_at == retry_at
    assert len(endpoint.seen) == 1  # a redirect is not followed


def test_a_refused_connection_is_retryable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sink = WebhookSink(f"http://127.0.0.1:{port}/", secret=SECRET, timeout=2)
    try:
        with pytest.raises(DeliveryError, match="ConnectError") as failed:
            sink.deliver(_message())
    finally:
        sink.close()
    assert failed.value.retryable is True
    assert failed.value.retry_at is None


def test_a_timeout_is_retryable(endpoint: Endpoint) -> None:
    sink = WebhookSink(f"{endpoint.url}/stall", secret=SECRET, timeout=0.2)
    started = time.monotonic()
    try:
        with pytest.raises(DeliveryError, match="ReadTimeout") as failed:
            sink.deliver(_message())
    finally:
        sink.close()
    assert failed.value.retryable is True
    assert time.monotonic() - started < DEADLINE_SECONDS / 2


def test_the_url_credentials_stay_out_of_errors(endpoint: Endpoint) -> None:
    sink = WebhookSink(
        endpoint.url.replace("//", "//user:pw@") + "/500?token=s3cret", secret=SECRET
    )
    try:
        with pytest.raises(DeliveryError) as failed:
            sink.deliver(_message())
    finally:
        sink.close()
    assert "s3cret" not in str(failed.value)
    assert "pw" not in str(failed.value)


def test_max_concurrent_bounds_the_requests_in_flight(endpoint: Endpoint) -> None:
    deliveries, limit = 6, 2
    sink = WebhookSink(f"{endpoint.url}/hold", secret=SECRET, max_concurrent=limit)
    errors: queue.Queue[BaseException] = queue.Queue()

    def deliver(n: int) -> None:
        try:
            sink.deliver(_message(n))
        except BaseException as err:
            errors.put(err)

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(deliveries)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: endpoint.in_flight == limit, f"{limit} requests in flight")
        # The other four are queued in the sink: give them a chance to (wrongly) get through.
        time.sleep(0.3)
        assert (endpoint.in_flight, len(endpoint.seen)) == (limit, limit)
    finally:
        endpoint.release.set()
        for thread in threads:
            thread.join(DEADLINE_SECONDS)
        sink.close()
    assert errors.empty()
    assert endpoint.peak == limit
    assert sorted(seen.headers["webhook-id"] for seen in endpoint.seen) == [
        f"msg_{n}" for n in range(deliveries)
    ]


def test_bad_arguments_are_refused_up_front() -> None:
    app = x_jobs.App("dbname=never_connected")
    for url in ("ftp://example.com/", "example.com/hooks"):
        with pytest.raises(ValueError, match="http"):
            WebhookSink(url, secret=SECRET)
    with pytest.raises(ValueError, match="max_concurrent"):
        WebhookSink("http://127.0.0.1/", secret=SECRET, max_concurrent=0)
    with pytest.raises(ValueError, match="secret"):
        WebhookSink("http://127.0.0.1/", secret="")
    with pytest.raises(ValueError, match="secret"):
        Receiver(app, secret="", job="orders.paid", source=SOURCE)
    with pytest.raises(ValueError, match="source"):
        Receiver(app, secret=SECRET, job="orders.paid", source="")


def test_a_delivery_is_signed_when_it_goes_out_not_while_it_queues(endpoint: Endpoint) -> None:
    """Signed before it waited for a free slot, a delivery queued behind slow ones carried the
    time it was queued, and a receiver would refuse it as stale (401, final)."""
    sink = WebhookSink(f"{endpoint.url}/hold", secret=SECRET, max_concurrent=1)
    first = threading.Thread(target=sink.deliver, args=(_message(1),))
    second = threading.Thread(target=sink.deliver, args=(_message(2),))
    try:
        first.start()
        wait_for(lambda: len(endpoint.seen) == 1, "the first delivery to be held")
        second.start()  # waits for the only slot
        time.sleep(2.5)
        released = time.time()
        endpoint.release.set()
        first.join(DEADLINE_SECONDS)
        second.join(DEADLINE_SECONDS)
    finally:
        sink.close()
    stamps = [int(seen.headers["webhook-timestamp"]) for seen in endpoint.seen]
    assert len(stamps) == 2
    assert stamps[1] >= int(released), stamps


# --- one deadline per delivery, a capped Retry-After, headers that cannot frame the request ---


@pytest.mark.parametrize("status", [200, 503])
def test_a_trickling_answer_is_read_only_until_the_deadline(
    endpoint: Endpoint, status: int
) -> None:
    """httpx's timeout bounds each read: an answer trickling a byte every 0.2 s held a delivery
    with a 1 s timeout for the 20 s of its body. A 2xx is delivered once its headers came."""
    sink = WebhookSink(f"{endpoint.url}/trickle/{status}", secret=SECRET, timeout=1)
    started = time.monotonic()
    try:
        if status == 200:
            sink.deliver(_message())
        else:
            with pytest.raises(DeliveryError, match="answered 503") as failed:
                sink.deliver(_message())
            assert failed.value.retryable is True
    finally:
        sink.close()
    # Well before the trickle's 20 s: about the timeout, on a slow machine a few times it.
    assert time.monotonic() - started < 6
    assert len(endpoint.seen) == 1


def test_a_relay_sends_a_slowly_answered_message_once(
    dsn: str, conn: Conn, endpoint: Endpoint
) -> None:
    """The relay refuses a lease not above the sink's timeout, as if the timeout bounded a
    delivery; with a trickling answer it did not, the lease lapsed, and the message went out
    again while its first delivery still ran."""
    app = x_jobs.App(dsn)
    app.outbox.webhook("slow", f"{endpoint.url}/trickle", secret=SECRET, timeout=1)
    message = app.outbox.put("slow", {"n": 1})
    relay = Relay(app, lease=2, poll_interval=0.1)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(
            lambda: (
                conn.execute(
                    "SELECT state::text, attempt FROM x_jobs.outbox WHERE id = %s", [message]
                ).fetchone()
                == ("delivered", 1)
            ),
            "the message to be delivered at its first attempt",
        )
        assert [seen.headers["webhook-id"] for seen in endpoint.seen] == [f"msg_{message}"]
        assert endpoint.peak == 1
    finally:
        relay.stop()
        relay.stop()
        thread.join(DEADLINE_SECONDS)
        app.close()


def test_a_delivery_waiting_for_a_slot_gives_up_at_its_deadline(endpoint: Endpoint) -> None:
    """A delivery queued for one of the ``max_concurrent`` slots waited without a deadline, for
    as long as the one ahead ran: here one whose headers trickle in, which overruns its own
    deadline (the limit the WebhookSink docstring admits). The queued one now gives up."""
    sink = WebhookSink(f"{endpoint.url}/drip", secret=SECRET, timeout=1, max_concurrent=1)
    outcomes: queue.Queue[tuple[int, BaseException | None]] = queue.Queue()

    def deliver(n: int) -> None:
        try:
            sink.deliver(_message(n))
        except DeliveryError as err:
            outcomes.put((n, err))
        else:
            outcomes.put((n, None))

    first = threading.Thread(target=deliver, args=(1,))
    second = threading.Thread(target=deliver, args=(2,))
    try:
        first.start()
        wait_for(lambda: len(endpoint.seen) == 1, "the first delivery to be under way")
        second.start()
        second.join(DEADLINE_SECONDS / 3)
        assert not second.is_alive(), "the queued delivery still waits for a slot"
        n, error = outcomes.get_nowait()
        assert n == 2
        assert isinstance(error, DeliveryError)
        assert "slots were busy" in str(error)
        assert error.retryable is True
        assert len(endpoint.seen) == 1
    finally:
        endpoint.release.set()
        first.join(DEADLINE_SECONDS)
        second.join(DEADLINE_SECONDS)
        sink.close()


@pytest.mark.parametrize(
    "retry_after", ["86400000", "1" + "0" * 30, "Sun, 04 May 2031 03:02:01 GMT"]
)
@pytest.mark.parametrize("max_retry_after", [None, 60])
def test_a_retry_after_is_capped_at_max_retry_after(
    endpoint: Endpoint, retry_after: str, max_retry_after: float | None
) -> None:
    """``Retry-After: 86400000`` parked the message, and every later one of its key, for 1000
    days (and a delay too long for a timedelta was ignored)."""
    url = f"{endpoint.url}/503?{urlencode({'Retry-After': retry_after})}"
    sink = (
        WebhookSink(url, secret=SECRET)
        if max_retry_after is None
        else WebhookSink(url, secret=SECRET, max_retry_after=max_retry_after)
    )
    cap = timedelta(seconds=max_retry_after or 3600)
    before = datetime.now(UTC)
    try:
        with pytest.raises(DeliveryError) as failed:
            sink.deliver(_message())
    finally:
        sink.close()
    assert failed.value.retryable is True
    assert failed.value.retry_at is not None
    assert before + cap <= failed.value.retry_at <= datetime.now(UTC) + cap
    with pytest.raises(ValueError, match="max_retry_after"):
        WebhookSink(endpoint.url, secret=SECRET, max_retry_after=0)


#: Headers no message or sink may set: they frame the request or steer the connection (httpx
#: sets them), or they cannot be sent as written.
UNSENDABLE = [
    ("Content-Length", "2"),
    ("Transfer-Encoding", "chunked"),
    ("Host", "elsewhere.example"),
    ("Connection", "close"),
    ("Keep-Alive", "timeout=5"),
    ("TE", "trailers"),
    ("Trailer", "x-sum"),
    ("Upgrade", "h2c"),
    ("Proxy-Authorization", "Basic eDp5"),
    ("X-Customer", "Zoë"),
    ("X-Note", "one\r\nx-injected: 1"),
    ("X-Note", "a NUL \x00"),
    ("X Note", "a space in the name"),
]


@pytest.mark.parametrize(("name", "value"), UNSENDABLE)
def test_a_message_header_that_cannot_be_sent_as_written_sends_it_to_dead(
    endpoint: Endpoint, name: str, value: str
) -> None:
    """A Content-Length shorter than the body raised an untyped error, a Transfer-Encoding sent
    a chunked frame inside a body sent with its length, a non-ASCII value a UnicodeEncodeError:
    retried for ever, or sent wrong. Now a final DeliveryError naming the header."""
    sink = WebhookSink(endpoint.url, secret=SECRET)
    message = OutboxMessage(
        id=9, topic="t", key=None, payload={"order": 42, "pad": "x" * 20}, headers={name: value}
    )
    try:
        with pytest.raises(DeliveryError, match=re.escape(repr(name))) as refused:
            sink.deliver(message)
    finally:
        sink.close()
    assert refused.value.retryable is False
    assert endpoint.seen == []


@pytest.mark.parametrize(("name", "value"), UNSENDABLE)
def test_a_sink_header_that_cannot_be_sent_is_refused_up_front(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(name))):
        WebhookSink("http://127.0.0.1:9/", secret=SECRET, headers={name: value})


def test_the_sink_sends_exact_numbers_exactly_and_signs_those_bytes(
    endpoint: Endpoint, app: x_jobs.App, conn: Conn
) -> None:
    """A payload holding Decimals (numbers read from jsonb with every digit) raised TypeError
    in json.dumps, retried for ever. They go out as the numbers they are, in the bytes signed;
    a float and the rest of the body are written as before."""
    payload = {
        "price": Decimal("0.10000000000000000001"),
        "big": Decimal("12345678901234567890E0"),
        "tiny": Decimal("-1E-400"),
        "plain": [7, 0.5, "é", None, True],
    }
    message = OutboxMessage(id=11, topic="t", key=None, payload=payload)
    sink = WebhookSink(endpoint.url, secret=SECRET)
    try:
        sink.deliver(message)
    finally:
        sink.close()
    sent = (
        '{"price":0.10000000000000000001,"big":12345678901234567890,"tiny":-1E-400,'
        '"plain":[7,0.5,"é",null,true]}'
    )
    (seen,) = endpoint.seen
    assert seen.body == sent.encode()
    Webhook(SECRET).verify(seen.body, seen.headers, json_parse=False)
    # A receiver that takes the body as it is stores the very numbers.
    loose = Receiver(app, secret=SECRET, job="ledger.import", source=SOURCE, queue="imports")
    status, answer = loose.receive(seen.headers, seen.body)
    assert status == 200, answer
    row = conn.execute(
        "SELECT input = %s::jsonb, input->>'price' FROM x_jobs.job WHERE id = %s",
        [sent, answer["job_id"]],
    ).fetchone()
    assert row == (True, "0.10000000000000000001")


def test_a_relayed_payload_keeps_its_numbers(dsn: str, conn: Conn, endpoint: Endpoint) -> None:
    """The way out through a relay: jsonb holds 0.10000000000000000001 and a 30-digit integer;
    the relay read the payload as floats, and the sink sent 0.1. It sends the digits jsonb holds,
    and signs those bytes, while a function sink still gets plain floats."""
    app = x_jobs.App(dsn)
    app.outbox.webhook("exact", endpoint.url, secret=SECRET)
    conn.execute(
        "SELECT x_jobs.outbox_put(topic => 'exact', payload => %s::jsonb)",
        ['{"price": 0.10000000000000000001, "big": 1e30, "n": [1, 2.50]}'],
    )
    relay = Relay(app, poll_interval=0.1)
    thread = threading.Thread(target=relay.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(endpoint.seen) == 1, "the message to be delivered")
    finally:
        relay.stop()
        thread.join(DEADLINE_SECONDS)
        app.close()
    (seen,) = endpoint.seen
    # In jsonb's key order (shortest first), every digit as jsonb keeps it (2.50 included).
    assert seen.body == (
        b'{"n":[1,2.50],"big":1000000000000000000000000000000,"price":0.10000000000000000001}'
    )
    Webhook(SECRET).verify(seen.body, dict(seen.headers))


def test_whitespace_around_a_header_value_is_no_part_of_it(endpoint: Endpoint) -> None:
    sink = WebhookSink(endpoint.url, secret=SECRET, headers={"X-Static": " on\t"})
    message = OutboxMessage(id=10, topic="t", key=None, payload={}, headers={"X-Tenant": " acme "})
    try:
        sink.deliver(message)
    finally:
        sink.close()
    (seen,) = endpoint.seen
    assert (seen.headers["x-static"], seen.headers["x-tenant"]) == ("on", "acme")
