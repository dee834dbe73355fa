"""What the worker and the relay share of their leased loop (claim, run, settle, with leases
kept alive): their ids, the stop requests a signal or ``stop()`` makes, when the loop claims
(ClaimPacer), the loop's connection with its watched calls, and the backoff of its reconnects.

Each drives it with its own claim, heartbeat and settlement: the worker's settle in batches on a
thread of their own and hand back what a drain leaves; the relay's ack and nack in its loop, and
pause on a refusal of the database (a read-only session in a failover) where the worker's raise.
"""

from __future__ import annotations

import logging
import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, LiteralString

import psycopg

from x_jobs._conn import QUICK_LOSS_SECONDS
from x_jobs._watch import CallWatch

logger = logging.getLogger(__name__)

#: The longest wait between two reconnects (and, for the relay, after a refusal).
MAX_BACKOFF_SECONDS = 5.0


def heartbeat_interval(lease: float, given: float | None) -> float:
    """The heartbeat's interval: ``given``, else a third of the lease (5 s at most), well before
    the lease lapses, and often enough that a cancel or a lost lease is seen soon."""
    return given if given is not None else min(lease / 3, 5.0)


def default_id(suffix: str = "") -> str:
    """``host:pid:random``, unique per process and per loop in it."""
    return f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}{suffix}"


class ClaimPacer:
    """When a leased loop claims. At once after a notification (new work was committed) and
    after a claim that filled its room (more may wait); otherwise at each poll, the safety net
    for a notification that never came (a pooler in transaction mode, a lost listener). A claim
    waits for room for half a batch, so that a busy loop claims in batches, not one at a time
    (unless it holds nothing: then any room is worth a claim).
    """

    def __init__(self, poll_interval: float, notified: threading.Event) -> None:
        self.poll_interval = poll_interval
        self._notified = notified
        #: Whether the next turn with room claims; the first turn does.
        self.claim_now = True
        #: When the poll claims next, on the monotonic clock.
        self.next_poll = 0.0

    def due(self, now: float) -> bool:
        """Whether this turn claims, given room (see ``room_for``)."""
        if self._notified.is_set():
            self._notified.clear()
            self.claim_now = True
        if now >= self.next_poll:
            self.claim_now = True
        return self.claim_now

    @staticmethod
    def room_for(room: int, capacity: int, holding: bool) -> bool:
        """Whether ``room`` free slots of ``capacity`` are worth a claim."""
        return room * 2 >= capacity or not holding

    def claimed(self, got: int, room: int) -> None:
        """A claim answered ``got`` of ``room``: a full one claims again as soon as there is
        room, a short one waits for the next poll or notification."""
        self.claim_now = got == room
        self.next_poll = time.monotonic() + self.poll_interval


class Stopping:
    """The stop requests of a loop: the first drains, a second stops at once.

    ``on_request(count, now)`` runs with each, in the thread that made it (a signal handler's
    too: it takes no lock). ``log`` is the owner's logger, whose name users filter by."""

    def __init__(
        self,
        wake: threading.Event,
        log: logging.Logger,
        on_request: Callable[[int, float], None] | None = None,
    ) -> None:
        self.wake = wake
        self._log = log
        self.requests = 0
        #: When the first request came (monotonic), 0.0 before.
        self.first_at = 0.0
        #: When the loop must be done with the database (monotonic), inf until its owner says
        #: (the worker, from its stop requests): past it, the calls still waiting are abandoned.
        self.exit_by = math.inf
        self._on_request = on_request

    def request(self) -> None:
        now = time.monotonic()
        self.requests += 1
        if self.requests == 1:
            self.first_at = now
        if self._on_request is not None:
            self._on_request(self.requests, now)

    def stop(self) -> None:
        self.request()
        self.wake.set()

    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # A handler runs in the main thread between two bytecodes, maybe while that thread holds
        # the lock inside the wake event (in its wait or clear): setting the event from here
        # could wait for itself forever. Count the request here and set the event from a thread
        # of its own, which waits for the lock like any other thread.
        self.request()
        threading.Thread(target=self.wake.set, name="x_jobs-signal", daemon=True).start()
        self._log.info("signal received", extra={"signal": signal.Signals(signum).name})


class Link:
    """The loop's connection (None while lost) and its calls, each watched (see CallWatch).
    ``log`` is the owner's logger."""

    def __init__(self, watch: CallWatch, who: str, log: logging.Logger) -> None:
        self.watch = watch
        self._log = log
        self.who = who
        self.conn: psycopg.Connection[Any] | None = None

    @contextmanager
    def calling(self) -> Iterator[psycopg.Connection[Any]]:
        assert self.conn is not None
        with self.watch.calling(self.who, self.conn):
            yield self.conn

    def query(self, statement: LiteralString, params: list[Any]) -> list[tuple[Any, ...]]:
        with self.calling() as conn:
            return conn.execute(statement, params).fetchall()

    def lost(self, err: Exception) -> None:
        """The database did not answer: drop the connection, for the loop to reconnect."""
        self.watch.silent = True
        self._log.warning("database connection lost", extra={"error": str(err).strip()})
        self.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None


class Reconnect:
    """The backoff of a loop's reconnects: doubling from 0.1 s up to ``cap``. A connection lost
    as soon as it was made (a pooler took the login, the server behind it away) counts as a
    connect that failed: the backoff goes on from where it was, not from its start."""

    def __init__(self, cap: float = MAX_BACKOFF_SECONDS) -> None:
        self.cap = cap
        self._connected_at = -math.inf
        self._delay = 0.1

    def start(self) -> tuple[float, float]:
        """At a loss: how long to wait before the first try, and the delay after it fails."""
        if time.monotonic() - self._connected_at < QUICK_LOSS_SECONDS:
            return self._delay, self.after(self._delay)
        return 0.0, 0.1

    def after(self, delay: float) -> float:
        """The delay after one of ``delay`` that did not reconnect."""
        return min(delay * 2, self.cap)

    def connected(self, delay: float) -> None:
        """The try after a wait of ``delay`` reconnected."""
        self._connected_at, self._delay = time.monotonic(), delay
