"""A thread that keeps time for a loop that may be blocked in a database call.

A server that stops answering without closing the connection (a network that drops packets, a
proxy or a NAT that forgot the connection, a frozen host) leaves a call waiting for good: the
kernel's timeouts (see ``network_settings``) end it only where the network itself went quiet,
and a loop blocked in it keeps no clock. The worker and the relay send their calls through
:meth:`CallWatch.calling`; a call unanswered for ``call_limit`` has its connection shut down, so
that it fails as on a lost connection and the loop reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg

logger = logging.getLogger(__name__)


class CallWatch:
    def __init__(
        self,
        name: str,
        *,
        call_limit: float,
        tick: float,
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        self.name = name
        self.call_limit = call_limit
        self.tick = tick
        self._on_tick = on_tick
        #: The call each connection is in (by who sends it) and when it was sent.
        self._calls: dict[str, tuple[psycopg.Connection[Any], float]] = {}
        #: The database did not answer the last try to reach it in time: set here when a call is
        #: abandoned, by the owner when a connect or a call timed out; cleared by the owner when
        #: a connection opens.
        self.silent = False
        #: When the process was last found running again after a stop (SIGSTOP, a suspended
        #: VM): a call sent before that may have its answer waiting, so time counts from then.
        self._awake_since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def calling(self, who: str, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Watch the call(s) made on ``conn`` inside the block."""
        self._calls[who] = (conn, time.monotonic())
        try:
            yield
        finally:
            self._calls.pop(who, None)

    def waited(self, now: float) -> float:
        """How long the oldest call in progress has waited (0: none is)."""
        since = self._awake_since
        return max((now - max(sent, since) for _, sent in list(self._calls.values())), default=0.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick):
            try:
                last = self._look(last)
            except Exception:
                # Nothing may end this thread: the clocks would stop with it.
                logger.exception("the watch of database calls failed; it goes on")

    def _look(self, last: float) -> float:
        now = time.monotonic()
        if now - last > 2 * self.tick + 1.0:
            self._awake_since = now  # the process was stopped meanwhile
        if self._on_tick is not None:
            self._on_tick(now)
        for who, call in list(self._calls.items()):
            conn, sent = call
            waited = now - max(sent, self._awake_since)
            if waited >= self.call_limit and self._calls.get(who) is call:
                self._calls.pop(who, None)  # shut down once
                self.silent = True
                _shut_down(conn)
                logger.warning(
                    "a database call went unanswered; its connection is abandoned",
                    extra={"connection": who, "waited_s": round(now - sent, 1)},
                )
        return now


def timed_out(err: BaseException) -> bool:
    """Did reaching the database fail for want of an answer (connect_timeout, the kernel's
    tcp_user_timeout or keepalives), rather than by one (refused, closed, shut down)?"""
    return isinstance(err, psycopg.errors.ConnectionTimeout) or "timed out" in str(err)


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shut the socket of ``conn`` down under whichever thread waits on it: its wait ends, and
    the call fails as on a lost connection. Only shut down, not closed: the descriptor stays
    the connection's, for it to close."""
    with (
        contextlib.suppress(OSError, psycopg.Error),
        socket.socket(fileno=os.dup(conn.fileno())) as sock,
    ):
        sock.shutdown(socket.SHUT_RDWR)
