"""Signed webhooks out of the outbox and into the queue, in the Standard Webhooks format
(https://www.standardwebhooks.com): the headers ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature`` (``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body`` under a shared
secret). Signing and verifying are the maintained ``standardwebhooks`` package's; this module
only carries the bytes.

Out: :class:`WebhookSink` is the outbox sink behind ``app.outbox.webhook(topic, url,
secret=...)``. It POSTs each message's payload as JSON; the ``webhook-id`` is ``msg_<id>`` in
every attempt of one message, so the receiving end dedupes redeliveries by it.

In: :class:`Receiver` turns a signed POST into a job. It verifies the signature and the
timestamp, then calls ``x_jobs.receive_webhook``, which writes the ledger row and the job in one
transaction: a redelivered webhook (same id) answers its first job, marked duplicate, and
enqueues nothing. Mount ``receiver.wsgi`` or ``receiver.asgi`` in any framework, or run
:func:`serve`. The answers: 200 (job id, duplicate), 400 (not JSON, or nested deeper than
``max_depth``), 401 (signature or timestamp refused; nothing written), 405 (not a POST), 408
(the request was not read within ``read_timeout``, :func:`serve`), 411 (a chunked body the
server cannot read), 413 (too large), 415 (a Content-Type other than JSON), 422 (input does not
validate, or the database refuses a value the request sets: the ``X_`` code says which), 503
with Retry-After (:func:`serve` holds ``max_connections`` already). Every 4xx is final: the
request can never succeed as it is, and a sender that retries it only repeats the refusal.

The receiver's database login needs the role ``x_jobs_webhook`` (``GRANT x_jobs_webhook TO
receiver_login``): it is the only role that may call ``x_jobs.receive_webhook``. A producer
login is refused it (42501, :class:`~x_jobs.errors.PermissionDenied`), since whoever records a
webhook id decides that the real delivery of it is a duplicate.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, LiteralString
from wsgiref.simple_server import WSGIServer
from wsgiref.simple_server import make_server as _wsgiref_server
from wsgiref.types import StartResponse, WSGIEnvironment

import httpx
from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook, WebhookVerificationError

from x_jobs import _webhook_wire as wire
from x_jobs._webhook_wire import BUSY_RETRY_AFTER, MAX_CONNECTIONS, READ_TIMEOUT
from x_jobs.errors import (
    ConcurrencyInvalid,
    DeliveryError,
    InputInvalid,
    InvalidArgument,
    PayloadTooLarge,
    TenantInvalid,
    WebhookInvalid,
    unstorable_as,
)
from x_jobs.jobs import Job, JobsApp
from x_jobs.sinks import OutboxMessage

logger = logging.getLogger(__name__)

__all__ = [
    "BUSY_RETRY_AFTER",
    "MAX_CONNECTIONS",
    "MAX_DEPTH",
    "MAX_DEPTH_LIMIT",
    "READ_TIMEOUT",
    "Receiver",
    "WebhookSink",
    "make_server",
    "new_secret",
    "serve",
]

#: How much of a refusing endpoint's body a DeliveryError quotes.
BODY_HEAD_BYTES = 512

#: The largest timestamp tolerance: standardwebhooks refuses timestamps more than five minutes
#: away from now whatever we ask, so a wider window could not be honoured.
MAX_TOLERANCE = 300.0

#: The longest wait a Retry-After header gets by default (seconds): the outbox's own backoff cap.
#: A message waiting out a Retry-After holds back every later message of its key.
MAX_RETRY_AFTER = 3600.0

#: How deep a received body may nest arrays and objects by default: far more than any webhook
#: payload needs, and far less than what makes the parsers on the way (Python's, pydantic's,
#: the database's) fail with an error that reads as an outage, which the sender would retry for
#: ever. Deeper bodies are answered 400, before anything parses them.
MAX_DEPTH = 64

#: The most ``max_depth`` may be: every parser on the way still takes it.
MAX_DEPTH_LIMIT = 256

#: Headers that frame the request or steer its connection. httpx sets them from the body and the
#: URL; one from a message or the sink's options contradicts them (a Content-Length shorter than
#: the body, a Transfer-Encoding on a body sent with its length), so they are refused. So is every
#: ``proxy-*`` header: a proxy and its credentials belong in the sink's ``client``.
FRAMING_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "host",
        "keep-alive",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)

#: A header name (an RFC 9110 token) and a value httpx sends as it is (printable ASCII, tabs).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")

RECEIVE: LiteralString = """
    SELECT job_id, duplicate
    FROM x_jobs.receive_webhook(source => %s, webhook_id => %s, name => %s, input => %s,
                                queue => %s, request => %s)
"""


def new_secret() -> str:
    """A fresh shared secret in the Standard Webhooks form: ``whsec_`` + base64 of 32 random
    bytes. Give the same string to the sender and the receiver."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def _webhook(secret: str | bytes) -> Webhook:
    try:
        return Webhook(secret)
    except (ValueError, EmptyWebhookSecretError) as err:
        raise ValueError(
            "a webhook secret is base64 (optionally prefixed whsec_) or raw bytes, not empty; "
            "make one with x_jobs.webhooks.new_secret()"
        ) from err


# --- out ------------------------------------------------------------------------------------


class WebhookSink:
    """An outbox sink that POSTs each message to ``url``, signed with ``secret``.

    The body is the payload as compact JSON, a Decimal written as the exact number it is. The
    headers are the sink's ``headers``, then the message's own, then ``content-type`` and the
    three Standard Webhooks headers (which nothing overrides); names are sent lower-case.
    Headers that frame the request or steer the connection (:data:`FRAMING_HEADERS`,
    ``proxy-*``) are refused, as are names that are no HTTP token and values that are not
    printable ASCII: in ``headers`` with a ValueError, in a message's with a final
    :class:`DeliveryError` (the message goes to dead, naming the header).

    ``timeout`` (seconds) is one deadline for each delivery, counted from the call: the wait for
    one of the ``max_concurrent`` slots (at most that many requests to the endpoint run at once,
    however many relay threads deliver), connecting, sending, and reading the answer. A 2xx is
    delivered once its headers arrived; its body is read only until the deadline. One limit
    remains: httpx bounds each read, not a sequence of reads, so a response whose status line
    and headers trickle in (each piece within the time left when the request started) can hold
    a delivery past its deadline, and a relay's lease with it. Bounding that would take a
    watchdog thread closing the socket, which httpx gives no hold of on a pooled connection.

    2xx is delivered. 408, 429, 5xx, a network error, a timeout or no free slot by the deadline
    raise a retryable :class:`DeliveryError`, with ``retry_at`` from a Retry-After header when
    there is one, capped at ``max_retry_after`` seconds from now (default an hour, the outbox's
    own backoff cap: a waiting message holds back the later ones of its key); any other status
    (3xx are not followed, 4xx) raises a final one. ``client`` replaces the sink's own httpx
    client (for proxies or TLS settings; the sink's deadline still sets each request's
    timeouts); the sink then does not close it.
    """

    def __init__(
        self,
        url: str,
        *,
        secret: str | bytes,
        timeout: float = 10.0,
        max_concurrent: int = 8,
        headers: Mapping[str, str] | None = None,
        client: httpx.Client | None = None,
        max_retry_after: float = MAX_RETRY_AFTER,
    ) -> None:
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent is {max_concurrent}; it must be 1 or more")
        if not math.isfinite(timeout) or not timeout > 0:
            raise ValueError(f"timeout is {timeout}; it must be above 0 seconds")
        if not math.isfinite(max_retry_after) or not max_retry_after > 0:
            raise ValueError(f"max_retry_after is {max_retry_after}; it must be above 0 seconds")
        for name, value in (headers or {}).items():
            if (problem := _header_problem(name, value)) is not None:
                raise ValueError(f"webhook header {name!r} {problem}")
        target = httpx.URL(url)
        if target.scheme not in {"http", "https"} or not target.host:
            raise ValueError(f"webhook url {url!r} is not an http:// or https:// URL")
        self.url = url
        #: The URL without credentials, query or fragment: what error messages name.
        self.endpoint = f"{target.scheme}://{target.netloc.decode('ascii')}{target.path}"
        self.timeout = timeout
        self.max_concurrent = max_concurrent
        self.max_retry_after = float(max_retry_after)
        self.headers = {name.lower(): value.strip(" \t") for name, value in (headers or {}).items()}
        self._webhook = _webhook(secret)
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._owns_client = client is None
        self.client = client or httpx.Client(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(
                max_connections=max_concurrent, max_keepalive_connections=max_concurrent
            ),
            follow_redirects=False,
        )

    def signature_headers(
        self, webhook_id: str, body: str | bytes, *, timestamp: int | None = None
    ) -> dict[str, str]:
        """The Standard Webhooks headers for one body: its id, the timestamp (now unless
        given, in seconds since the epoch) and the signature over both and the body."""
        text = body.decode("utf-8") if isinstance(body, bytes) else body
        stamp = int(time.time()) if timestamp is None else timestamp
        signature = self._webhook.sign(webhook_id, datetime.fromtimestamp(stamp, UTC), text)
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(stamp),
            "webhook-signature": signature,
        }

    def deliver(self, message: OutboxMessage) -> None:
        # One deadline for all of it: the relay's lease must outlast a delivery, and it is
        # checked against this timeout (the wait for a slot included).
        deadline = time.monotonic() + self.timeout
        own = self._message_headers(message)
        # Numbers as jsonb holds them (the relay's text of the payload, or Decimals) are
        # written with every digit; the signature below is over these very bytes.
        payload = message.payload
        if message.payload_json is not None:
            payload = wire.loads_exact(message.payload_json)
        body = wire.dumps_exact(payload)
        if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise self._busy()
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._busy()
            # Signed once it has a slot, not before: a delivery that queued behind slow ones
            # would arrive with a timestamp past the receiver's tolerance, and its 401 is final.
            headers = {
                **self.headers,
                **own,
                "content-type": "application/json",
                # The id is the message's, not the attempt's: the receiver's dedupe key.
                **self.signature_headers(f"msg_{message.id}", body),
            }
            try:
                # httpx times each step (a pooled connection, connecting, each write and
                # read), not their sum: each gets at most the time left now, not the whole
                # timeout again. The body's reads are cut at the deadline by _body_head.
                with self.client.stream(
                    "POST",
                    self.url,
                    content=body.encode("utf-8"),
                    headers=headers,
                    timeout=httpx.Timeout(remaining),
                ) as response:
                    if response.is_success:
                        # Delivered: its status is known. Read a short answer, until the
                        # deadline at most, so that the connection goes back to the pool.
                        _body_head(response, deadline)
                        return
                    status = response.status_code
                    retry_after = response.headers.get("retry-after")
                    head = _body_head(response, deadline)
            except httpx.RequestError as err:
                raise DeliveryError(
                    f"POST {self.endpoint} failed: {type(err).__name__}: {err}",
                    retryable=not isinstance(err, httpx.UnsupportedProtocol),
                ) from err
        finally:
            self._slots.release()
        retryable = status in {408, 429} or status >= 500
        raise DeliveryError(
            f"POST {self.endpoint} answered {status} {wire.phrase(status)}: {head!r}",
            retryable=retryable,
            retry_at=_retry_at(retry_after, cap=self.max_retry_after) if retryable else None,
        )

    def _message_headers(self, message: OutboxMessage) -> dict[str, str]:
        """The message's own headers, lower-case; a header that cannot be sent as written is a
        final DeliveryError naming it (sending it again would not help)."""
        own: dict[str, str] = {}
        for name, value in message.headers.items():
            if (problem := _header_problem(name, value)) is not None:
                raise DeliveryError(
                    f"message {message.id}: its header {name!r} {problem}", retryable=False
                )
            own[name.lower()] = value.strip(" \t")
        return own

    def _busy(self) -> DeliveryError:
        return DeliveryError(
            f"POST {self.endpoint} not sent: all {self.max_concurrent} slots were busy for "
            f"the whole timeout ({self.timeout:g} s)",
            retryable=True,
        )

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


def _header_problem(name: object, value: object) -> str | None:
    """Why a header cannot be sent as given (a phrase after its name), or None. Whitespace
    around a value is no part of it (RFC 9110) and is dropped."""
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        return "is not an HTTP header name"
    lowered = name.lower()
    if lowered in FRAMING_HEADERS or lowered.startswith("proxy-"):
        return "frames the request or steers the connection: the HTTP client sets it"
    if not isinstance(value, str):
        return f"has a {type(value).__name__} value, not a string"
    if not _HEADER_VALUE.fullmatch(value):
        return (
            "has a value that is not printable ASCII (it holds a non-ASCII character or a "
            "control character such as a line break)"
        )
    return None


def _body_head(response: httpx.Response, deadline: float) -> str:
    """The start of a response's body, for an error message: read until BODY_HEAD_BYTES or the
    deadline (``time.monotonic()``), whichever comes first; what arrived if reading fails."""
    head = bytearray()
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return ""
    timeouts = response.request.extensions.get("timeout")
    if isinstance(timeouts, dict):
        # httpcore takes the read timeout of the body when the body starts, from this dict (the
        # request's own): the time left, not what was left when the request went out. Were it
        # ignored, the body would still end within one read timeout of the deadline.
        timeouts["read"] = remaining
    try:
        for chunk in response.iter_bytes():
            head += chunk
            if len(head) >= BODY_HEAD_BYTES or time.monotonic() >= deadline:
                break
    except httpx.HTTPError:
        pass
    return bytes(head[:BODY_HEAD_BYTES]).decode("utf-8", "replace")


def _retry_at(
    value: str | None, now: datetime | None = None, *, cap: float = MAX_RETRY_AFTER
) -> datetime | None:
    """When a Retry-After header (delay-seconds or an HTTP-date) allows the next attempt, at
    most ``cap`` seconds from now; None without one or when it does not parse. A date in the
    past means now."""
    if value is None or not value.strip():
        return None
    now = now or datetime.now(UTC)
    latest = now + timedelta(seconds=cap)
    value = value.strip()
    if value.isascii() and value.isdigit():  # str.isdigit takes "²" too, which int() refuses
        # Capped before it becomes a timedelta: a delay of 10**30 seconds is a long wait, not
        # a header to ignore.
        return min(now + timedelta(seconds=min(int(value), cap)), latest)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(when, now), latest)


# --- in -------------------------------------------------------------------------------------


class Receiver:
    """Receives signed webhooks from ``source`` (the sender's name: webhook ids are unique per
    source) as jobs of ``job``.

    ``job`` is a declared :class:`~x_jobs.Job` or a job name. A declared job (or a name this
    app declares) validates the body as its input, as ``app.enqueue`` does, and sets the queue
    unless ``queue`` is given; an undeclared name (a job handled by another service's workers)
    takes the body as it is, every number with the digits it was written with. ``tolerance``
    is how far, in seconds, the ``webhook-timestamp`` may be from now (at most 300, the limit of
    the verifying library). ``max_body`` caps what the WSGI and ASGI adapters read (bytes).
    ``max_depth`` is how deep the body may nest arrays and objects (1 to
    :data:`MAX_DEPTH_LIMIT`, default :data:`MAX_DEPTH`); a deeper one is answered 400.

    The login of ``app``'s database connections needs the role ``x_jobs_webhook``, the only
    one granted ``x_jobs.receive_webhook`` (``GRANT x_jobs_webhook TO receiver_login``);
    without it every signed request is answered 500 and logged, naming the missing right.
    """

    def __init__(
        self,
        app: JobsApp,
        *,
        secret: str | bytes,
        job: Job[Any] | str,
        source: str,
        queue: str | None = None,
        tolerance: float = 300,
        max_body: int = 1 << 20,
        max_depth: int = MAX_DEPTH,
    ) -> None:
        if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
            raise ValueError(f"max_depth is {max_depth}; it must be 1 to {MAX_DEPTH_LIMIT}")
        if not 0 < tolerance <= MAX_TOLERANCE:
            raise ValueError(
                f"tolerance is {tolerance} s; it must be above 0 and at most {MAX_TOLERANCE:g}"
            )
        if not source or len(source) > 200:
            raise ValueError("source names the sender; it must be 1 to 200 characters")
        self.app = app
        self.job = job
        self.source = source
        self.queue = queue
        self.tolerance = float(tolerance)
        self.max_body = max_body
        self.max_depth = max_depth
        self._webhook = _webhook(secret)

    def receive(self, headers: Mapping[str, str], body: bytes) -> wire.Answer:
        """Verify one request and record it: the HTTP status and JSON answer to send. Header
        names are case-insensitive. Nothing is written unless the signature verifies.

        Answers 200 ``{"job_id", "duplicate"}``; 401 (signature or timestamp refused), 415
        (a Content-Type header missing or not JSON: ``application/json`` or
        ``application/<anything>+json``), 400 (not JSON, JSON nested deeper than
        ``max_depth``, or JSON that jsonb cannot hold), 422 (input invalid, or the database refuses
        a value the request sets: its webhook-id, or a tenant or concurrency key the declared
        job derives from the body), 413 (payload over x_jobs.max_payload_bytes) with
        ``{"error"}`` (a refusal's ``X_`` code and message). Other errors raise: an outage, or
        a refusal of the receiver's own configuration (its job name, queue, the job's fixed
        options), which the adapters answer 500 so that the sender tries again once fixed."""
        lowered = wire.lowered(headers.items())
        refusal = self.verify(lowered, body)
        if refusal is not None:
            logger.info("webhook from %s refused: %s", self.source, refusal)
            return 401, {"error": refusal}
        # After the signature: what an unsigned request holds is no business of ours.
        content_type = lowered.get("content-type")
        if not wire.is_json_media_type(content_type):
            return 415, {
                "error": f"the Content-Type is {content_type!r}, not JSON: send application/json"
            }
        # Before anything parses it: a body nested hundreds deep failed in a parser on the way
        # with an error that was answered 500, and the sender retried it for ever.
        if wire.nests_deeper(body, self.max_depth):
            return 400, {
                "error": f"the body nests arrays and objects deeper than {self.max_depth} levels"
            }
        declared = self.job if isinstance(self.job, Job) else self.app.jobs.get(self.job)
        try:
            if declared is None:
                # Taken as it is: every number as the body wrote it (jsonb keeps them all).
                payload = wire.loads_exact(body)
            else:
                # The job's type decides what its input holds, as in app.enqueue: the body is
                # read as Python reads JSON, since pydantic writes a Decimal that reaches an
                # untyped field (Any) as a string.
                payload = json.loads(body, parse_constant=wire.refuse_constant)
        except ValueError as err:
            return 400, {"error": f"the body is not JSON: {err}"}

        request: dict[str, Any] | None = None
        if declared is None:
            name, queue = str(self.job), self.queue
        else:
            # The declared job's options (attempts, backoff, priority, keys) come along, as
            # app.enqueue would send them.
            name, queue = declared.name, self.queue or declared.queue
            try:
                request = declared.request(payload)
            except InputInvalid as err:
                return 422, {"error": str(err)}
            payload = request.pop("input")

        return self._recorded(
            lowered["webhook-id"], name, payload, queue=queue, request=request, declared=declared
        )

    def _recorded(
        self,
        webhook_id: str,
        name: str,
        payload: Any,
        *,
        queue: str | None,
        request: dict[str, Any] | None,
        declared: Job[Any] | None,
    ) -> wire.Answer:
        """``_record``'s answer: 200, or the refusal of what the request holds."""
        try:
            with unstorable_as(InputInvalid, "the body", "Send JSON without NUL characters."):
                job_id, duplicate = self._record(webhook_id, name, payload, queue, request)
        except PayloadTooLarge as err:
            return 413, {"error": str(err)}
        except InputInvalid as err:
            # Refused for good (400): answered 500, the sender would send it again for ever.
            return 400, {"error": str(err)}
        except InvalidArgument as err:
            if not _from_the_request(err, declared):
                raise
            # The same: this request can never be recorded (an empty tenant, an id of 300
            # characters), whoever fixes what.
            return 422, {"error": str(err)}
        return 200, {"job_id": job_id, "duplicate": duplicate}

    def verify(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why a request is refused (its timestamp, signature or secret), or None when it
        verifies. ``headers`` are lower-case."""
        stamp = headers.get("webhook-timestamp", "")
        try:
            sent = float(stamp)
        except ValueError:
            return "the webhook-timestamp header is missing or not a number"
        if not math.isfinite(sent) or abs(time.time() - sent) > self.tolerance:
            return f"the webhook-timestamp is more than {self.tolerance:g} s away from now"
        header = headers.get("webhook-signature", "")
        # The library gives up on the first entry it cannot parse (no comma, not base64), and
        # a valid signature after it went untried: it gets the well-formed v1 entries alone.
        signatures = wire.v1_signatures(header)
        if header.strip() and not signatures:
            return "the signature does not verify: the header holds no well-formed v1 signature"
        try:
            # Checks the timestamp again (its own fixed five minutes) and each v1 signature,
            # in constant time, against the body; json_parse=False, so a JSON error is not a
            # refusal. A header missing or empty is refused there.
            self._webhook.verify(
                body,
                {**headers, "webhook-signature": " ".join(f"v1,{sig}" for sig in signatures)},
                json_parse=False,
            )
        except (WebhookVerificationError, ValueError) as err:
            # ValueError: a body that is not UTF-8.
            return f"the signature does not verify: {err}"
        return None

    def _record(
        self,
        webhook_id: str,
        name: str,
        payload: Any,
        queue: str | None,
        request: dict[str, Any] | None,
    ) -> tuple[int, bool]:
        """``x_jobs.receive_webhook`` in a transaction of its own: the ledger row and the job,
        or the first receipt's job (a concurrent receipt of the same id waits for it)."""
        with self.app.connection() as db, db.transaction():
            row = db.execute(
                RECEIVE,
                [
                    self.source,
                    webhook_id,
                    name,
                    wire.jsonb(payload),
                    queue,
                    None if request is None else wire.jsonb(request),
                ],
            ).fetchone()
        assert row is not None
        return int(row[0]), bool(row[1])

    def _answer(self, headers: Mapping[str, str], body: bytes) -> wire.Answer:
        """``receive`` for the adapters: an unexpected error is logged and answered 500 (the
        sender retries) rather than escaping into the server."""
        try:
            return self.receive(headers, body)
        except Exception:
            logger.exception("webhook from %s: receiving failed", self.source)
            return 500, {"error": "the webhook could not be recorded; send it again later"}

    # --- adapters -----------------------------------------------------------------------------

    def wsgi(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        """The receiver as a WSGI application: POST the webhook to any path."""
        if environ.get("REQUEST_METHOD") != "POST":
            return wire.wsgi_answer(start_response, (405, {"error": "only POST is allowed"}))
        try:
            read = self._wsgi_body(environ)
        except TimeoutError:
            # The server's read deadline (serve's read_timeout) passed within the body.
            return wire.wsgi_answer(
                start_response, (408, {"error": "the request was not read in time"})
            )
        if isinstance(read, tuple):
            return wire.wsgi_answer(start_response, read)
        headers = {
            key[5:].replace("_", "-").lower(): value
            for key, value in environ.items()
            if key.startswith("HTTP_")
        }
        # WSGI keeps these two apart from the HTTP_ variables.
        if "CONTENT_TYPE" in environ:
            headers["content-type"] = environ["CONTENT_TYPE"]
        return wire.wsgi_answer(start_response, self._answer(headers, read))

    def _wsgi_body(self, environ: WSGIEnvironment) -> bytes | wire.Answer:
        """The request's body, at most ``max_body`` bytes, or the answer that refuses it."""
        coding = environ.get("HTTP_TRANSFER_ENCODING", "").strip().lower()
        if coding:
            return self._wsgi_chunked(environ, coding)
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return 400, {"error": "Content-Length is not a number"}
        if length > self.max_body:
            return 413, {"error": self._too_large()}
        return bytes(environ["wsgi.input"].read(length)) if length > 0 else b""

    def _wsgi_chunked(self, environ: WSGIEnvironment, coding: str) -> bytes | wire.Answer:
        """A chunked body, read to its end when the server says it ends the input there
        (``wsgi.input_terminated``, as gunicorn does) or when the server is :func:`serve`'s,
        which hands on the raw stream, read here chunk by chunk. Under another server it would
        read as empty (no Content-Length, and a signature that fails), so it is refused 411:
        final, the sender must send a Content-Length."""
        stream = environ["wsgi.input"]
        if coding != "chunked":
            return 411, {
                "error": f"the Transfer-Encoding {coding!r} cannot be read: "
                "send the body with a Content-Length"
            }
        if environ.get("wsgi.input_terminated"):
            body = wire.read_to_end(stream, self.max_body)
        elif environ.get(wire.RAW_CHUNKED):
            try:
                body = wire.read_chunked(stream, self.max_body)
            except ValueError as err:
                return 400, {"error": f"the chunked body is malformed: {err}"}
        else:
            return 411, {
                "error": "this server cannot read a chunked body: "
                "send the body with a Content-Length"
            }
        if body is None:
            return 413, {"error": self._too_large()}
        return body

    async def asgi(self, scope: wire.Scope, receive: wire.ASGIReceive, send: wire.ASGISend) -> None:
        """The receiver as an ASGI 3 application (HTTP, and lifespan when it is the whole app).
        The blocking verify-and-record runs in a worker thread."""
        if scope["type"] == "lifespan":
            await wire.lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise ValueError(f"the webhook receiver serves http, not {scope['type']}")
        if scope["method"] != "POST":
            await wire.asgi_answer(send, (405, {"error": "only POST is allowed"}))
            return
        body = bytearray()
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                return
            body += event.get("body", b"")
            if len(body) > self.max_body:
                await wire.asgi_answer(send, (413, {"error": self._too_large()}))
                return
            if not event.get("more_body", False):
                break
        # Each header line is its own pair here: several webhook-signature lines are all kept.
        headers = wire.lowered(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]
        )
        answer = await asyncio.to_thread(self._answer, headers, bytes(body))
        await wire.asgi_answer(send, answer)

    def _too_large(self) -> str:
        return f"the body is larger than {self.max_body} bytes"


def _from_the_request(err: InvalidArgument, declared: Job[Any] | None) -> bool:
    """Whether the database refused a value the request sets (its webhook-id, or what
    ``declared`` derives from the body), not one of the receiver's configuration."""
    if isinstance(err, WebhookInvalid):
        return True  # the source is checked when the receiver is made: what is left is the id
    if declared is None:
        return False  # an undeclared job sends the body alone, whose refusals are caught above
    if isinstance(err, TenantInvalid):
        return callable(declared.tenant)
    if isinstance(err, ConcurrencyInvalid):
        # A fixed limit that is a limit leaves the key, derived from the body, to refuse.
        limit = declared.concurrency
        return limit is not None and limit.key is not None and limit.limit >= 1
    return False


# --- a ready server -------------------------------------------------------------------------


def make_server(
    receiver: Receiver,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> WSGIServer:
    """A bound, not yet serving, HTTP server for ``receiver`` (port 0: any free port, see
    ``server.server_port``). Run ``server.serve_forever()``; stop it with ``shutdown()``.
    ``read_timeout`` (seconds) is how long a connection may take to send its request, from
    its accept to the body's last byte (408 and closed after it); ``max_connections`` how many
    it serves at once (503 with Retry-After beyond)."""
    if not math.isfinite(read_timeout) or not read_timeout > 0:
        raise ValueError(f"read_timeout is {read_timeout}; it must be above 0 seconds")
    if max_connections < 1:
        raise ValueError(f"max_connections is {max_connections}; it must be 1 or more")
    server = _wsgiref_server(
        host,
        port,
        receiver.wsgi,
        server_class=wire.ThreadingWSGIServer,
        handler_class=wire.ReceiverHandler,
    )
    assert isinstance(server, wire.ThreadingWSGIServer)
    server.bound(read_timeout, max_connections)
    return server


def serve(
    receiver: Receiver,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    ready: Callable[[WSGIServer], Any] | None = None,
    read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> None:
    """Serve ``receiver`` over HTTP on wsgiref's server (a thread per connection, at most
    ``max_connections``, each request read within ``read_timeout`` seconds: see
    :func:`make_server`) until ``server.shutdown()`` or Ctrl-C. ``ready`` gets the server once
    it listens: its port, and a way to stop it from another thread. For tests and small
    deployments; behind a real server, mount ``receiver.wsgi`` or ``receiver.asgi`` instead
    (and bound reads and connections there)."""
    with make_server(
        receiver, host, port, read_timeout=read_timeout, max_connections=max_connections
    ) as server:
        logger.info(
            "receiving webhooks from %s on http://%s:%s/", receiver.source, host, server.server_port
        )
        if ready is not None:
            ready(server)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            logger.info("webhook server stopped")
