"""A thread that keeps time for a loop that may be blocked in a database call.

A server that stops answering without closing the connection (a network that drops packets, a
proxy or a NAT that forgot the connection, a frozen host) leaves a call waiting for good: the
kernel's timeouts (see ``network_settings``) end it only where the network itself went quiet,
and a loop blocked in it keeps no clock. The worker and the relay send their calls through
:meth:`CallWatch.calling`.

A call may also wait because the server is busy, or waits for a lock another session holds: it
is answered in the end, and it commits. So while a call waits, the watch asks the server every
``probe_after``, on a connection of its own (the probe), whether the call's server process still
has it in hand (running a statement, or in the middle of the call's transaction). While it does,
the call is left to wait: given up on, a claim waiting for a lock committed all the same, its
answer lost with its rows. When two probes in a row find that process done (it answered, and
the answer was lost on the way), the call's connection is shut down at once; when no probe has
seen it at work for ``call_limit`` (the probes unanswered, or the process not found: behind a
pooler the process id is the pooler's), once that long has passed. Shut down, the call fails as
on a lost connection, and the loop reconnects.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, LiteralString

import psycopg

from x_jobs._conn import connect

logger = logging.getLogger(__name__)

#: A call in progress: its connection, when it was sent, and the server process answering it.
_Call = tuple[psycopg.Connection[Any], float, int]


class CallWatch:
    def __init__(
        self,
        name: str,
        *,
        call_limit: float,
        tick: float,
        probe: Callable[[list[int]], dict[int, bool]],
        probe_after: float,
        on_tick: Callable[[float], None] | None = None,
    ) -> None:
        self.name = name
        self.call_limit = call_limit
        self.tick = tick
        self._probe = probe
        #: A call that waited this long has the server probed (at most once this often).
        self.probe_after = probe_after
        self._on_tick = on_tick
        #: The call each connection is in, by who sends it.
        self._calls: dict[str, _Call] = {}
        #: The loop cannot reach the database: set by the owner when a connection is lost or a
        #: connect fails, and here when a call is abandoned unanswered; cleared by the owner
        #: when a connection opens.
        self.silent = False
        #: When the last probe that the server answered was sent (monotonic); when one last
        #: found each server process at work on a call; and how many probes in a row (and
        #: since when) found it done with one. A process a probe did not find (behind a pooler
        #: the process id is the pooler's) is neither at work nor done.
        self._answered_at = 0.0
        self._working_at: dict[int, float] = {}
        self._done: dict[int, tuple[float, int]] = {}
        self._probing = False
        self._probed_at = 0.0
        #: When the process was last found running again after a stop (SIGSTOP, a suspended
        #: VM): a call sent before that may have its answer waiting, so time counts from then.
        self.awake_since = 0.0
        self._stop = threading.Event()

    @contextlib.contextmanager
    def calling(self, who: str, conn: psycopg.Connection[Any]) -> Iterator[None]:
        """Watch the call(s) made on ``conn`` inside the block."""
        self._calls[who] = (conn, time.monotonic(), conn.info.backend_pid)
        try:
            yield
        finally:
            self._calls.pop(who, None)

    def unanswered(self, now: float, waited: float) -> bool:
        """Has a call in progress waited ``waited`` seconds with no probe answered for that long
        (the server may not be there)?"""
        return any(
            self._waited(now, sent) >= waited and now - max(self._answered_at, sent) >= waited
            for _, sent, _ in list(self._calls.values())
        )

    def abandon(self) -> None:
        """Shut down the connection of every call in progress: each fails at once as on a lost
        connection, answered or not (its loop is stopping and waits no longer, whatever the
        server is at: a lock held elsewhere would keep it waiting for good)."""
        now = time.monotonic()
        for who, call in list(self._calls.items()):
            if self._calls.get(who) is not call:
                continue  # answered meanwhile
            self._calls.pop(who, None)  # shut down once
            _shut_down(call[0])
            logger.warning(
                "a database call was abandoned: the loop that sent it is stopping",
                extra={"connection": who, "waited_s": round(now - call[1], 1)},
            )

    def start(self) -> None:
        self._stop.clear()  # a Worker may run() again after it stopped
        threading.Thread(target=self._run, name=self.name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _waited(self, now: float, sent: float) -> float:
        return now - max(sent, self.awake_since)

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
            self.awake_since = now  # the process was stopped meanwhile
        if (
            not self._probing
            and now - self._probed_at >= self.probe_after
            and any(
                self._waited(now, sent) >= self.probe_after
                for _, sent, _ in list(self._calls.values())
            )
        ):
            self._probing = True
            self._probed_at = now
            try:
                threading.Thread(target=self._ask, name=f"{self.name}-probe", daemon=True).start()
            except RuntimeError:
                self._probing = False  # no thread to be had now: the next look tries again
                raise
        if self._on_tick is not None:
            self._on_tick(now)
        for who, call in list(self._calls.items()):
            self._judge(now, who, call)
        return now

    def _judge(self, now: float, who: str, call: _Call) -> None:
        """Shut down the connection of a call whose answer was lost, or that went unanswered for
        call_limit with no probe finding the server at work on it."""
        conn, sent, pid = call
        done_since, done_count = self._done.get(pid, (0.0, 0))
        # Twice: once could be the moment between the answer's leaving and its arrival.
        lost = done_since >= sent and done_count >= 2
        seen = max(sent, self._working_at.get(pid, 0.0))
        if not lost and self._waited(now, seen) < self.call_limit:
            return
        if self._calls.get(who) is not call:
            return  # answered meanwhile
        self._calls.pop(who, None)  # shut down once
        if now - max(self._answered_at, sent) >= self.call_limit:
            self.silent = True
        _shut_down(conn)
        logger.warning(
            "a database call's answer was lost (its server process had finished it); its "
            "connection is abandoned"
            if lost
            else "a database call went unanswered, and so did a new connection; its connection "
            "is abandoned",
            extra={"connection": who, "waited_s": round(now - sent, 1)},
        )

    def _ask(self) -> None:
        """The probe, on a thread of its own (it may wait as long as a connect may)."""
        sent = time.monotonic()
        calls = {pid: call_sent for _, call_sent, pid in list(self._calls.values())}
        try:
            working = self._probe(list(calls))
        except Exception as err:
            logger.warning(
                "the database did not answer a new connection", extra={"error": str(err).strip()}
            )
        else:
            self._answered_at = sent
            for pid, busy in working.items():
                if busy:
                    self._working_at[pid] = sent
                    self._done.pop(pid, None)
                    continue
                since, count = self._done.get(pid, (0.0, 0))
                if since < calls.get(pid, sent):  # a verdict on an earlier call of the connection
                    since, count = sent, 0
                self._done[pid] = (since, count + 1)
        finally:
            self._probing = False


def patience(lease: float) -> float:
    """How long a loop that holds leases of ``lease`` seconds waits on a silent network (see
    network_settings): a quarter of the lease, 2 to 10 s, so that a reconnect answers, one way
    or the other, in good time."""
    return min(10.0, max(2.0, lease / 4))


def for_leases(
    name: str,
    dsn: str,
    *,
    lease: float,
    heartbeat_interval: float,
    on_tick: Callable[[float], None] | None = None,
) -> CallWatch:
    """The watch of a loop that holds leases (the worker's, the relay's): a call is probed
    every half heartbeat interval, and given up on unanswered at half the lease (5 s at
    least)."""
    return CallWatch(
        name,
        call_limit=max(lease / 2, 5.0),
        tick=min(0.5, heartbeat_interval / 2),
        probe=probe(dsn, patience(lease)),
        probe_after=heartbeat_interval / 2,
        on_tick=on_tick,
    )


#: Whether each of the given server processes has a call in hand: running a statement, or in
#: the middle of a transaction (between the statements of a settlement). A login sees its own.
WORKING: LiteralString = (
    "SELECT pid, state <> 'idle' FROM pg_catalog.pg_stat_activity WHERE pid = ANY(%s)"
)


def probe(dsn: str, patience: float) -> Callable[[list[int]], dict[int, bool]]:
    """A probe for :class:`CallWatch`: a new connection to ``dsn`` asks whether the server
    processes of the calls in progress still work on them (those it finds)."""

    def ask(pids: list[int]) -> dict[int, bool]:
        with connect(dsn, "x_jobs probe", patience=patience) as conn:
            return {row[0]: bool(row[1]) for row in conn.execute(WORKING, [pids]).fetchall()}

    return ask


def _shut_down(conn: psycopg.Connection[Any]) -> None:
    """Shut the socket of ``conn`` down under whichever thread waits on it: its wait ends, and
    the call fails as on a lost connection. Only shut down, not closed: the descriptor stays
    the connection's, for it to close."""
    with (
        contextlib.suppress(OSError, psycopg.Error),
        socket.socket(fileno=os.dup(conn.fileno())) as sock,
    ):
        sock.shutdown(socket.SHUT_RDWR)
