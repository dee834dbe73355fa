"""The stream: entries appended in producers' transactions are read in commit-safe order. A
reader that moved past a position never misses an entry before it, whatever order the producers
committed in (an open transaction holds back what was appended after it began), and reads none
twice; each consumer keeps its own cursor, saved in the transaction of the batch it follows.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from conftest import Conn, Connect, wait_for
from psycopg.types.json import Jsonb

import x_jobs
import x_jobs.stream

READ = (
    "SELECT pos, entry_key, payload"
    " FROM x_jobs.stream_read(stream => %s, after => %s, max_rows => %s)"
)


def _read_all(
    conn: Conn, stream: str, after: str | None, batch: int = 100
) -> tuple[list[Any], str | None]:
    """Every entry readable now after `after`, in batches; the entries and the last position."""
    entries: list[Any] = []
    while True:
        rows = conn.execute(READ, [stream, after, batch]).fetchall()
        if not rows:
            return entries, after
        entries += rows
        after = rows[-1][0]


def test_entries_are_read_in_order_from_a_position(conn: Conn) -> None:
    conn.execute(
        "SELECT * FROM x_jobs.stream_append_many(stream => 's', entries => %s)",
        [Jsonb([{"key": f"k{n % 2}", "payload": {"n": n}} for n in range(10)])],
    )
    entries, last = _read_all(conn, "s", None, batch=3)
    assert [e[2]["n"] for e in entries] == list(range(10))
    # From a position: what came after it, and nothing once read to the end.
    rest, _ = _read_all(conn, "s", entries[4][0])
    assert [e[2]["n"] for e in rest] == list(range(5, 10))
    assert conn.execute(READ, ["s", last, 10]).fetchall() == []
    # One key's entries.
    odd = conn.execute(
        "SELECT payload FROM x_jobs.stream_read(stream => 's', key => 'k1', max_rows => 100)"
    ).fetchall()
    assert [p[0]["n"] for p in odd] == [1, 3, 5, 7, 9]
    # Another stream is another stream.
    assert conn.execute(READ, ["t", None, 10]).fetchall() == []


def test_an_open_transaction_holds_back_what_commits_after_it(conn: Conn, connect: Connect) -> None:
    early = connect(autocommit=False)
    late = connect(autocommit=False)
    # The early producer's transaction begins (and takes its id) first, the late one commits first.
    early.execute("SELECT x_jobs.stream_append('s', NULL, '{\"who\": \"early\"}')")
    late.execute("SELECT x_jobs.stream_append('s', NULL, '{\"who\": \"late\"}')")
    late.commit()
    # The late entry committed, but the early transaction is still open: nothing is read yet, or
    # a reader would move past a position the early entry will come before.
    assert conn.execute(READ, ["s", None, 10]).fetchall() == []
    early.commit()
    entries, _ = _read_all(conn, "s", None)
    assert [e[2]["who"] for e in entries] == ["early", "late"]


def test_a_rolled_back_append_is_never_read(conn: Conn, connect: Connect) -> None:
    producer = connect(autocommit=False)
    producer.execute("SELECT x_jobs.stream_append('s', NULL, '{\"n\": 1}')")
    producer.rollback()
    conn.execute("SELECT x_jobs.stream_append('s', NULL, '{\"n\": 2}')")
    entries, _ = _read_all(conn, "s", None)
    assert [e[2]["n"] for e in entries] == [2]


def test_racing_producers_and_a_reader_miss_nothing_and_read_nothing_twice(
    conn: Conn, connect: Connect
) -> None:
    producers, each = 6, 150
    stop = threading.Event()
    read: list[int] = []
    errors: list[BaseException] = []

    def produce(n: int) -> None:
        try:
            c = connect(autocommit=False, name=f"producer-{n}")
            rng = random.Random(n)
            for i in range(each):
                c.execute(
                    "SELECT x_jobs.stream_append('race', NULL, %s)", [Jsonb({"v": n * each + i})]
                )
                # Commits out of the order the entries were numbered in: some transactions
                # stay open a while, others commit at once.
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 0.01)
                c.commit()
        except BaseException as e:  # reported by the test below
            errors.append(e)

    def consume() -> None:
        try:
            c = connect(name="reader")
            after = None
            while not stop.is_set():
                rows = c.execute(READ, ["race", after, 50]).fetchall()
                for pos, _, payload in rows:
                    read.append(payload["v"])
                    after = pos
        except BaseException as e:  # reported by the test below
            errors.append(e)

    reader = threading.Thread(target=consume)
    reader.start()
    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Let the reader catch up with everything committed, then stop it.
    try:
        wait_for(lambda: len(read) >= producers * each, "the reader to read every entry")
    finally:
        stop.set()
    reader.join()
    assert errors == []
    assert len(read) == producers * each, "the reader missed entries"
    assert len(set(read)) == len(read), "the reader read an entry twice"


def test_a_cursor_commits_with_the_batch_or_not_at_all(conn: Conn, connect: Connect) -> None:
    conn.execute("CREATE TABLE handled (n integer PRIMARY KEY)")
    conn.execute(
        "SELECT * FROM x_jobs.stream_append_many('s', %s)",
        [Jsonb([{"payload": {"n": n}} for n in range(6)])],
    )
    worker = connect(autocommit=False)

    def batch(fail: bool) -> None:
        row = worker.execute("SELECT x_jobs.consumer_cursor('c', '')").fetchone()
        after = row[0] if row else None
        rows = worker.execute(READ, ["s", after, 2]).fetchall()
        for _, _, payload in rows:
            worker.execute("INSERT INTO handled VALUES (%s)", [payload["n"]])
        worker.execute("SELECT x_jobs.save_cursor('c', '', %s)", [Jsonb(rows[-1][0])])
        if fail:
            worker.rollback()
        else:
            worker.commit()

    batch(fail=False)
    batch(fail=True)  # a crash before the commit: neither the rows nor the cursor stay
    batch(fail=False)
    batch(fail=False)
    handled = [r[0] for r in conn.execute("SELECT n FROM handled ORDER BY n").fetchall()]
    assert handled == list(range(6))


def test_the_python_calls_read_a_stream_and_keep_a_cursor_with_the_batch(
    conn: Conn, connect: Connect
) -> None:
    stream = x_jobs.stream
    first = stream.append(conn, "py", {"n": 0}, key="a")
    stream.append_many(conn, "py", [{"payload": {"n": n}, "key": "b"} for n in range(1, 4)])
    entries = stream.read(conn, "py")
    assert entries[0].pos == first
    assert [(e.key, e.payload["n"]) for e in entries] == [("a", 0), ("b", 1), ("b", 2), ("b", 3)]
    assert [e.payload["n"] for e in stream.read(conn, "py", after=entries[1].pos)] == [2, 3]
    assert [e.payload["n"] for e in stream.read(conn, "py", key="a")] == [0]

    worker = connect(autocommit=False)
    assert stream.consumer_cursor(worker, "py-consumer") is None
    stream.save_cursor(worker, "py-consumer", entries[1].pos)
    worker.rollback()
    assert stream.consumer_cursor(conn, "py-consumer") is None
    stream.save_cursor(worker, "py-consumer", entries[1].pos)
    worker.commit()
    assert stream.consumer_cursor(conn, "py-consumer") == entries[1].pos

    with pytest.raises(x_jobs.StreamInvalid):
        stream.append(conn, "", {})
    with pytest.raises(x_jobs.PositionInvalid):
        stream.read(conn, "py", after="nope")
