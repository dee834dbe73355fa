"""What webhooks carry and how they travel, for :mod:`x_jobs.webhooks`: JSON with every number
exact, the signature header's entries, the HTTP answers, a request body's framing (its length,
its chunks, how deep it nests) and the plumbing of :func:`x_jobs.webhooks.serve`'s server (one
read deadline per request, a bound on connections). Nothing here knows of jobs or the database.
"""

from __future__ import annotations

import base64
import binascii
import http
import io
import itertools
import json
import logging
import re
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from decimal import Decimal
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIEnvironment

from psycopg.types.json import Jsonb

logger = logging.getLogger(__name__)

#: :func:`x_jobs.webhooks.serve`'s defaults: how long a connection may take to send its whole
#: request (request line, headers and body), in seconds, before it is answered 408 and closed;
#: and how many connections it serves at once (a thread each) before it answers 503 with
#: Retry-After.
READ_TIMEOUT = 10.0
MAX_CONNECTIONS = 64

#: The Retry-After (seconds) of a 503 for a connection beyond ``max_connections``.
BUSY_RETRY_AFTER = 1


def refuse_constant(name: str) -> Any:
    """json.loads's ``parse_constant``: NaN and Infinity, which jsonb refuses, are no JSON."""
    raise ValueError(f"{name} is not JSON")


def _json_int(text: str) -> int | Decimal:
    # Python reads no int of more than 4300 digits (a guard against slow parsing); jsonb can.
    return int(text) if len(text) <= 4000 else Decimal(text)


def loads_exact(body: str | bytes) -> Any:
    """A JSON body with its numbers as written: a fraction or an exponent is read as a Decimal,
    which holds every digit (a float keeps 17, and turns 1e400 into infinity), a long integer
    too. NaN and Infinity, which jsonb refuses, are no JSON."""
    return json.loads(
        body, parse_float=Decimal, parse_int=_json_int, parse_constant=refuse_constant
    )


def dumps_exact(value: Any, *, ensure_ascii: bool = False) -> str:
    """Compact JSON for ``value`` with every Decimal written as the exact number it is
    (json.dumps refuses Decimals, and a float would round them); anything else is json.dumps's,
    byte for byte. NaN and infinities are refused (ValueError), as jsonb would."""
    verbatim: list[str] = []
    # Each Decimal goes through json.dumps as a string that stands for it, then its JSON text
    # replaces the string. The stand-in holds NUL (which no jsonb string holds) and a random
    # tag, so that no string of the payload reads as one.
    tag = secrets.token_hex(8)

    def mark(item: Any) -> Any:
        if isinstance(item, Decimal):
            if not item.is_finite():
                raise ValueError(f"{item} is not JSON")
            verbatim.append(str(item))
            return f"\0{tag}{len(verbatim) - 1}\0"
        if isinstance(item, dict):
            return {key: mark(inner) for key, inner in item.items()}
        if isinstance(item, list | tuple):
            return [mark(inner) for inner in item]
        return item

    text = json.dumps(
        mark(value), separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False
    )
    if not verbatim:
        return text
    stand_in = re.compile(r'"\\u0000' + tag + r'(\d+)\\u0000"')
    return stand_in.sub(lambda found: verbatim[int(found[1])], text)


def jsonb(value: Any) -> Jsonb:
    """``value`` for a jsonb parameter, its Decimals exact. ASCII, as psycopg's own dumps
    writes it: a lone surrogate goes as an escape that the database refuses (as a request's
    error), not as text that cannot be encoded."""
    return Jsonb(value, dumps=lambda item: dumps_exact(item, ensure_ascii=True))


def v1_signatures(header: str) -> list[str]:
    """The well-formed ``v1`` signatures of a webhook-signature header, as written. Its entries
    are ``version,base64`` separated by spaces. Several header lines reach the receiver joined
    by commas (a WSGI server's environ, httpx's Headers), so that one run without spaces may
    hold several entries: each ``v1`` followed by strict base64 is one. Other versions and
    malformed entries (no comma, not base64) are skipped: they verify nothing, and must not
    stop a valid signature next to them from verifying."""
    found = []
    for run in header.split():
        parts = run.split(",")
        for version, signature in itertools.pairwise(parts):
            if version == "v1" and signature and _is_base64(signature):
                found.append(signature)
    return found


def _is_base64(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except binascii.Error:
        return False
    return True


def lowered(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header lines as one mapping with lower-case names. Every webhook-signature line is kept
    (a sender rotating its secret may sign once per secret, one line each), joined by a space
    as the entries of one line are; any other repeated header keeps its last line."""
    lowered: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        if key == "webhook-signature" and key in lowered:
            lowered[key] = f"{lowered[key]} {value}"
        else:
            lowered[key] = value
    return lowered


#: What a receipt answers: the HTTP status and the JSON document.
Answer = tuple[int, dict[str, Any]]
#: The ASGI 3 interface (asgiref's types, without depending on asgiref).
Scope = MutableMapping[str, Any]
ASGIReceive = Callable[[], Awaitable[MutableMapping[str, Any]]]
ASGISend = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


#: The environ key :func:`serve`'s handler sets: wsgi.input is the connection's raw stream, a
#: chunked body's framing included.
RAW_CHUNKED = "x_jobs.raw_chunked"

#: A chunk-size line: hex digits, optional extensions. Its length is capped when it is read.
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r?\n")

#: How many trailer lines a chunked body may end with.
_MAX_TRAILERS = 64


def read_to_end(stream: Any, limit: int) -> bytes | None:
    """The rest of ``stream``, or None once it is longer than ``limit``."""
    body = bytearray()
    while piece := stream.read(min(65536, limit + 1 - len(body))):
        body += piece
        if len(body) > limit:
            return None
    return bytes(body)


def read_chunked(stream: Any, limit: int) -> bytes | None:
    """A chunked body (RFC 9112, 7.1) read off the raw ``stream``: its chunks joined, or None
    once they add up to more than ``limit`` (nothing more is read then). ValueError for framing
    that is no chunked body (a bad size line, a chunk cut short)."""
    body = bytearray()
    while True:
        line = stream.readline(1024)
        matched = _CHUNK_SIZE.fullmatch(line)
        if matched is None:
            raise ValueError(f"a chunk size line reads {bytes(line[:40])!r}")
        size = int(matched[1], 16)
        if size == 0:
            break
        if len(body) + size > limit:
            return None
        chunk = stream.read(size)
        if len(chunk) < size:
            raise ValueError(f"a chunk ended after {len(chunk)} of {size} bytes")
        body += chunk
        if stream.readline(3) not in (b"\r\n", b"\n"):
            raise ValueError("a chunk is longer than its size")
    for _ in range(_MAX_TRAILERS):
        trailer = stream.readline(8192)
        if trailer in (b"\r\n", b"\n"):
            return bytes(body)
        if not trailer.endswith(b"\n"):
            raise ValueError("the body ends before its last line")
    raise ValueError(f"more than {_MAX_TRAILERS} trailer lines")


def is_json_media_type(value: str | None) -> bool:
    """Whether a Content-Type names JSON: application/json or a structured ``+json`` type
    (application/cloudevents+json, say), parameters such as charset aside."""
    if value is None:
        return False
    media = value.split(";", 1)[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


#: What decides a JSON text's nesting: quotes and backslashes (strings), brackets and braces.
_JSON_STRUCTURE = re.compile(rb'["\\\[\]{}]')


def nests_deeper(body: bytes, limit: int) -> bool:
    """Whether ``body`` opens more than ``limit`` arrays and objects inside each other,
    brackets within strings aside. One pass over the structural bytes, stopping at the first
    level too deep, so that no parser recurses into it. A text that is no JSON gets some
    answer here and is refused by the parser after it."""
    depth = 0
    in_string = False
    escaped_at = -1  # the position right after a backslash within a string
    for found in _JSON_STRUCTURE.finditer(body):
        at = found.start()
        if at == escaped_at:
            continue
        byte = body[at]
        if in_string:
            if byte == 0x5C:  # backslash: the next byte is escaped, whatever it is
                escaped_at = at + 1
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def encode(answer: Answer) -> tuple[str, list[tuple[str, str]], bytes]:
    status, document = answer
    body = json.dumps(document, separators=(",", ":")).encode("utf-8")
    headers = [("content-type", "application/json"), ("content-length", str(len(body)))]
    if status == 405:
        headers.append(("allow", "POST"))
    elif status == 415:
        headers.append(("accept-post", "application/json"))
    elif status == 503:
        headers.append(("retry-after", str(BUSY_RETRY_AFTER)))
    return f"{status} {phrase(status)}", headers, body


def raw_answer(answer: Answer) -> bytes:
    """A whole HTTP/1.0 response, for the server's own answers outside the WSGI app (no
    request read in time, too many connections); the connection closes after it."""
    status, headers, body = encode(answer)
    head = "".join(f"{name}: {value}\r\n" for name, value in [*headers, ("connection", "close")])
    return f"HTTP/1.0 {status}\r\n{head}\r\n".encode("latin-1") + body


def wsgi_answer(start_response: StartResponse, answer: Answer) -> list[bytes]:
    status, headers, body = encode(answer)
    start_response(status, headers)
    return [body]


async def asgi_answer(send: ASGISend, answer: Answer) -> None:
    _, headers, body = encode(answer)
    await send(
        {
            "type": "http.response.start",
            "status": answer[0],
            "headers": [
                (name.encode("latin-1"), value.encode("latin-1")) for name, value in headers
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: ASGIReceive, send: ASGISend) -> None:
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif event["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class DeadlineReader(io.RawIOBase):
    """A connection's bytes, each read given the time left until one deadline: a client that
    trickles its request a byte at a time cannot hold the connection past it (a timeout per
    read alone would reset at every byte). TimeoutError once the deadline is past."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the read deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class ReceiverHandler(WSGIRequestHandler):
    """One connection, one request (HTTP/1.0, as wsgiref serves): read within the server's
    read_timeout, from the connection's accept to the body's last byte, or answered 408 and
    closed. Request lines go to the logger, not to stderr."""

    server: ThreadingWSGIServer

    def setup(self) -> None:
        super().setup()
        deadline = time.monotonic() + self.server.read_timeout
        self.rfile.close()
        self.rfile = io.BufferedReader(DeadlineReader(self.connection, deadline))

    def get_environ(self) -> WSGIEnvironment:
        environ = super().get_environ()
        environ[RAW_CHUNKED] = True  # wsgi.input is the raw stream: Receiver reads the chunks
        return environ

    def handle(self) -> None:
        try:
            super().handle()
        except TimeoutError:
            # No request line and headers by the deadline (an idle connection, or one that
            # trickles); within the body the app answers 408 itself.
            logger.debug(
                "%s sent no request within %g s", self.address_string(), self.server.read_timeout
            )
            self.close_connection = True
            send_quietly(
                self.connection,
                raw_answer((408, {"error": "the request was not read in time"})),
            )

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


def send_quietly(sock: socket.socket, data: bytes) -> None:
    """Send a short answer on a connection that is about to close, giving up after a second (a
    client that reads nothing must not hold the thread)."""
    try:
        sock.settimeout(1.0)
        sock.sendall(data)
    except OSError:
        pass


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per connection, so that one slow receipt (a race waiting
    on a lock, say) does not hold up the others, and at most ``max_connections`` of them: a
    connection beyond that is answered 503 with Retry-After by a short-lived thread of its own
    (reading the request head for up to a second first, so that closing does not reset the
    connection before the client reads the answer); beyond as many of those again, it is closed
    unanswered. Each thread's life is bounded: a request is read within ``read_timeout``."""

    daemon_threads = True
    read_timeout: float = READ_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    def bound(self, read_timeout: float, max_connections: int) -> None:
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self._refusals = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._slots.acquire(blocking=False):
            super().process_request(request, client_address)
        elif self._refusals.acquire(blocking=False):
            threading.Thread(target=self._turn_away, args=(request,), daemon=True).start()
        else:
            logger.warning(
                "webhook server: %s connections open, closing one unanswered",
                2 * self.max_connections,
            )
            self.shutdown_request(request)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def _turn_away(self, request: socket.socket) -> None:
        try:
            logger.info("webhook server: %s connections open, answering 503", self.max_connections)
            send_quietly(
                request,
                raw_answer((503, {"error": "the receiver is busy; send it again shortly"})),
            )
            self.shutdown_request(request)
        finally:
            self._refusals.release()

    def shutdown_request(self, request: Any) -> None:
        linger(request)
        super().shutdown_request(request)


def linger(sock: socket.socket) -> None:
    """A lingering close: after the answer, what the client still sends (the rest of a body
    refused 413 or 503) is read and dropped until it closes, for a second at most. Closing on
    unread bytes resets the connection, and the reset can reach the client before it read the
    answer, which it then retries as a network error."""
    deadline = time.monotonic() + 1.0
    try:
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                break
    except OSError:
        pass
