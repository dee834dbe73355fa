"""The outbox and the webhook ledger at the SQL level, with real connections and real races.

What pgTAP cannot show, because it needs more than one session (tests/pgtap/36-outbox.sql holds
the rest): relays racing over one outbox keep one message per key in flight and deliver each
key in put order; a put is part of its transaction (relayed and announced only once committed);
relay_outbox reads only the partial indexes of the undelivered messages on a big table; and two
receipts of one webhook at once make one job.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, LiteralString

import psycopg
import pytest
from conftest import (
    DEADLINE_SECONDS,
    Conn,
    Connect,
    connections,
    fresh_database,
    notify_names,
    wait_for_lock_waiters,
)
from plans import PlanLog, nodes, rows_read
from psycopg.types.json import Jsonb

import x_jobs

logger = logging.getLogger(__name__)

#: A guard against a hang, not a speed target: the race takes 10-15 s alone, and several times
#: that on a machine busy with other test runs.
RACE_DEADLINE_SECONDS = 180.0

RELAY: LiteralString = (
    "SELECT id, key, attempt FROM x_jobs.relay_outbox(%s, %s, '5 minutes', %s::text[])"
)
ACK: LiteralString = "SELECT x_jobs.outbox_ack(%s::bigint[], %s)"
NACK: LiteralString = "SELECT x_jobs.outbox_nack(%s, %s, 'sink busy', retry_at => now())::text"
RECEIVE: LiteralString = (
    "SELECT job_id, duplicate FROM x_jobs.receive_webhook(%s, %s, 'charge.succeeded',"
    " '{\"amount\": 5}', 'webhooks')"
)


def _relay_ids(
    conn: Conn, relay: str, topics: list[str] | None = None, qty: int = 100
) -> list[int]:
    rows = conn.execute(RELAY, [relay, qty, topics]).fetchall()
    return [int(row[0]) for row in rows]


# --- per-key order under concurrency ---------------------------------------------------------

MESSAGES = 5_000
KEYS = 50
RELAYS = 8
RELAY_QTY = 50
PUT_BATCH = 1_000
TOPIC = "orders"
#: Out of how many deliveries a relay nacks one (due again at once): a retried message must
#: keep its place at the head of its key.
NACK_ONE_IN = 50


def _put_all(conn: Conn) -> dict[str, list[int]]:
    """Put MESSAGES messages over KEYS keys, the keys interleaved at random; answer each key's
    message ids in put order."""
    rng = random.Random(36)
    keys = [f"key-{rng.randrange(KEYS)}" for _ in range(MESSAGES)]
    put_order: dict[str, list[int]] = defaultdict(list)
    for start in range(0, MESSAGES, PUT_BATCH):
        seqs = range(start, start + PUT_BATCH)
        batch = [{"topic": TOPIC, "key": keys[n], "payload": {"seq": n}} for n in seqs]
        rows = conn.execute(
            "SELECT ord, id FROM x_jobs.outbox_put_many(%s)", [Jsonb(batch)]
        ).fetchall()
        assert [int(ord_) for ord_, _ in rows] == list(range(1, PUT_BATCH + 1))
        ids = [int(message_id) for _, message_id in rows]
        # Ids follow input order: the order of the ids is the put order.
        assert ids == sorted(ids)
        for n, message_id in zip(seqs, ids, strict=True):
            put_order[keys[n]].append(message_id)
    assert len(put_order) == KEYS
    return put_order


class InFlight:
    """What the relays hold, by key, kept under one lock.

    A relay registers what relay_outbox handed it after the call returned, and settles (acks or
    nacks) while holding the lock, taking the messages out of the table before it lets go. So
    a message is in the table from before its settle commits until after that commit is
    visible, and any relay_outbox that answered a message of a key while another message of the
    key was claimed and not yet settled finds it here, whichever of the two relays registers
    second.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: dict[str, set[int]] = defaultdict(set)
        self.violations: list[str] = []
        #: (key, message id, relay) per ack, in the order the acks committed.
        self.acked: list[tuple[str, int, str]] = []
        self.nacked = 0
        #: Set by a relay that failed, so that the others stop.
        self.stop = threading.Event()

    def claimed(self, relay: str, rows: Sequence[tuple[int, str]]) -> None:
        with self.lock:
            for message_id, key in rows:
                if self.held[key]:
                    self.violations.append(
                        f"{relay} got {message_id} of {key} while {sorted(self.held[key])}"
                        " were in flight"
                    )
                self.held[key].add(message_id)

    def ack(self, conn: Conn, relay: str, rows: Sequence[tuple[int, str]]) -> None:
        with self.lock:
            acked = {
                int(row[0])
                for row in conn.execute(ACK, [[message_id for message_id, _ in rows], relay])
            }
            # The relay holds every message it was handed: a 5-minute lease never lapses here.
            assert acked == {message_id for message_id, _ in rows}, (relay, rows, acked)
            for message_id, key in rows:
                self.held[key].discard(message_id)
                self.acked.append((key, message_id, relay))

    def nack(self, conn: Conn, relay: str, message_id: int, key: str) -> None:
        with self.lock:
            row = conn.execute(NACK, [message_id, relay]).fetchone()
            assert row == ("pending",), (relay, message_id, row)
            self.held[key].discard(message_id)
            self.nacked += 1


def _relay_loop(
    conn: Conn, relay: str, seed: int, state: InFlight, barrier: threading.Barrier
) -> int:
    """relay_outbox(qty => 50) and settle, until every message is delivered; answer how many
    messages this relay acked. The batch is settled in 1-3 chunks in random order (now and then
    a nack), so heads of keys free up one chunk at a time and the relays interleave."""
    try:
        return _relay_until_done(conn, relay, seed, state, barrier)
    except BaseException:
        # The messages this relay holds would never be settled: stop the others at once
        # rather than let them wait for those out to the deadline.
        state.stop.set()
        raise


def _relay_until_done(
    conn: Conn, relay: str, seed: int, state: InFlight, barrier: threading.Barrier
) -> int:
    rng = random.Random(seed)
    acked = 0
    barrier.wait(timeout=DEADLINE_SECONDS)
    deadline = time.monotonic() + RACE_DEADLINE_SECONDS
    while time.monotonic() < deadline:
        if state.stop.is_set():
            raise RuntimeError(f"{relay} stopped: another relay failed")
        rows = conn.execute(RELAY, [relay, RELAY_QTY, [TOPIC]]).fetchall()
        if not rows:
            left = conn.execute(
                "SELECT EXISTS (SELECT FROM x_jobs.outbox WHERE topic = %s"
                " AND state <> 'delivered')",
                [TOPIC],
            ).fetchone()
            assert left is not None
            if not left[0]:
                return acked
            # The heads of the keys left are held by other relays: poll again shortly.
            time.sleep(0.01)
            continue
        assert len(rows) <= RELAY_QTY
        held = [(int(message_id), str(key)) for message_id, key, _ in rows]
        # One call never hands out two messages of one key.
        assert len({key for _, key in held}) == len(held), held
        state.claimed(relay, held)
        rng.shuffle(held)
        chunks = rng.randint(1, 3)
        for n in range(chunks):
            chunk = held[n::chunks]
            if not chunk:
                continue
            if rng.randrange(NACK_ONE_IN) == 0:
                state.nack(conn, relay, *chunk[0])
                chunk = chunk[1:]
            if chunk:
                state.ack(conn, relay, chunk)
                acked += len(chunk)
    raise TimeoutError(f"{relay} still relaying after {RACE_DEADLINE_SECONDS:.0f} s")


def test_relays_racing_deliver_each_key_in_put_order_one_at_a_time(
    conn: Conn, connect: Connect
) -> None:
    put_order = _put_all(conn)
    state = InFlight()
    relays = [connect(name=f"relay-{n}") for n in range(RELAYS)]
    barrier = threading.Barrier(RELAYS)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=RELAYS) as pool:
        futures = [
            pool.submit(_relay_loop, c, f"relay-{n}", n, state, barrier)
            for n, c in enumerate(relays)
        ]
        errors = [f.exception(timeout=RACE_DEADLINE_SECONDS + DEADLINE_SECONDS) for f in futures]
    # The first failure, not the "stopped" of the relays it stopped.
    failures = [e for e in errors if e is not None and "another relay failed" not in str(e)]
    if failures:
        raise failures[0]
    assert errors == [None] * RELAYS, errors
    per_relay = [f.result() for f in futures]
    logger.info(
        "%s messages relayed in %.1f s (%s nacks), per relay %s",
        MESSAGES,
        time.monotonic() - started,
        state.nacked,
        per_relay,
    )

    # No relay_outbox answered a message of a key while the key had another in flight.
    assert state.violations == []
    # Every message acked exactly once.
    counts = Counter(message_id for _, message_id, _ in state.acked)
    assert len(counts) == MESSAGES
    assert set(counts.values()) == {1}
    assert set(counts) == {message_id for ids in put_order.values() for message_id in ids}
    # Per key, the acks committed in put order.
    acked_order: dict[str, list[int]] = defaultdict(list)
    for key, message_id, _ in state.acked:
        acked_order[key].append(message_id)
    for key, ids in put_order.items():
        assert acked_order[key] == ids, key
    # The work really was shared.
    assert sum(1 for n in per_relay if n) > 1, per_relay

    rows = conn.execute(
        "SELECT state::text, count(*), sum(attempt - 1) FROM x_jobs.outbox GROUP BY 1"
    ).fetchall()
    # Each nack cost its message one more attempt, and nothing else did (no lease lapsed).
    assert rows == [("delivered", MESSAGES, state.nacked)]


def test_a_lower_id_committed_late_waits_for_the_message_of_its_key_in_flight(
    conn: Conn, connect: Connect
) -> None:
    """Two producers put on one key; the first put (the lower id) commits last.

    relay_outbox hands out the later message first (the earlier one is not committed yet),
    which is all a relay can do. But once the earlier message commits, it must wait for the
    one in flight: relay_outbox promises that a key never has two messages in flight (a draft
    looked only for earlier messages of the key, and handed it out at once).
    """
    early = connect(name="producer-early")
    with early.transaction():
        row = early.execute("SELECT x_jobs.outbox_put('orders', '{}', 'k')").fetchone()
        assert row is not None
        early_id = int(row[0])
        row = conn.execute("SELECT x_jobs.outbox_put('orders', '{}', 'k')").fetchone()
        assert row is not None
        late_id = int(row[0])
        assert early_id < late_id
        assert _relay_ids(conn, "relay-1") == [late_id]
    assert _relay_ids(conn, "relay-2") == [], (
        f"message {early_id} of key k was handed out while {late_id} of key k was in flight"
    )
    assert _relay_ids(conn, "relay-2") == []
    assert [r[0] for r in conn.execute(ACK, [[late_id], "relay-1"])] == [late_id]
    assert _relay_ids(conn, "relay-2") == [early_id]


def test_two_relays_claiming_at_once_never_hold_two_messages_of_one_key(
    conn: Conn, connect: Connect
) -> None:
    """The same late commit, with relay B calling while relay A's claim of the later message is
    not committed: B's snapshot shows that message still pending, so the earlier one looks free.
    relay_outbox takes the lock of each key it picked before it hands a message out, and A holds
    k's: B answers nothing, at once (until 0.3.8 it waited for A's commit, then checked the key
    again under a fresh snapshot; any session holding a key's lock stalled every relay)."""
    early, first, second = (connect(name=n) for n in ("producer-early", "relay-a", "relay-b"))
    early.execute("BEGIN")
    row = early.execute("SELECT x_jobs.outbox_put('orders', '{}', 'k')").fetchone()
    assert row is not None
    early_id = int(row[0])
    row = conn.execute("SELECT x_jobs.outbox_put('orders', '{}', 'k')").fetchone()
    assert row is not None
    late_id = int(row[0])

    first.execute("BEGIN")  # relay A's claim, not committed yet: it holds the key's lock
    assert [r[0] for r in first.execute(RELAY, ["relay-a", 10, None])] == [late_id]
    early.execute("COMMIT")
    assert [r[0] for r in second.execute(RELAY, ["relay-b", 10, None])] == [], (
        f"relay-b took message {early_id} of key k while {late_id} was in flight"
    )
    first.execute("COMMIT")
    assert _relay_ids(conn, "relay-c") == []
    assert [r[0] for r in conn.execute(ACK, [[late_id], "relay-a"])] == [late_id]
    assert _relay_ids(conn, "relay-c") == [early_id]


# --- transactions and NOTIFY ----------------------------------------------------------------


class Listener:
    """LISTEN x_jobs_outbox on an autocommit connection of its own.

    To show that an action sent nothing without sleeping, a sentinel notification follows it:
    notifications reach a listener in commit order, so once the sentinel arrives everything sent
    before it has arrived too.
    """

    CHANNEL = "x_jobs_outbox"

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.topic = notify_names(conn, self.CHANNEL, TOPICS)
        conn.execute("LISTEN x_jobs_outbox")

    def after(self, sender: Conn, action: Callable[[], object]) -> list[tuple[str, int]]:
        """Run ``action``; answer the (payload, pid) of every notification sent before the
        sentinel that ``sender`` (autocommit, outside any transaction) sends after it."""
        action()
        sentinel = f"sentinel-{uuid.uuid4()}"
        sender.execute("SELECT pg_notify('x_jobs_outbox', %s)", [sentinel])
        got: list[tuple[str, int]] = []
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            for note in self.conn.notifies(timeout=1.0):
                assert note.channel == self.CHANNEL
                if note.payload == sentinel:
                    return got
                got.append((self.topic(note.payload), note.pid))
        pytest.fail(f"the sentinel notification never arrived (got {got})")


#: The topics the listener's tests put to: it tells their tags from other payloads.
TOPICS = ("orders.created", "orders.paid")


@pytest.fixture
def listener(connect: Connect) -> Iterator[Listener]:
    yield Listener(connect(name="outbox-listener"))


def test_a_rolled_back_put_leaves_nothing_and_announces_nothing(
    conn: Conn, connect: Connect, listener: Listener
) -> None:
    producer = connect(name="producer")

    def put_and_roll_back() -> None:
        with producer.transaction():
            producer.execute("SELECT x_jobs.outbox_put('orders.created', '{\"n\": 1}', 'k')")
            producer.execute(
                "SELECT * FROM x_jobs.outbox_put_many(%s)",
                [Jsonb([{"topic": "orders.created", "payload": {"n": 2}}])],
            )
            raise psycopg.Rollback()

    assert listener.after(conn, put_and_roll_back) == []
    assert _relay_ids(conn, "relay-1") == []
    row = conn.execute("SELECT count(*) FROM x_jobs.outbox").fetchone()
    assert row == (0,)


def test_a_committed_put_is_announced_on_commit_and_relayed_once(
    conn: Conn, connect: Connect, listener: Listener
) -> None:
    producer = connect(name="producer")
    pid = producer.info.backend_pid
    ids: list[int] = []

    with producer.transaction():
        row = producer.execute(
            "SELECT x_jobs.outbox_put('orders.created', '{\"n\": 1}', 'k')"
        ).fetchone()
        assert row is not None
        ids.append(int(row[0]))
        # Not announced before the commit (the sentinel comes from another connection).
        assert listener.after(conn, lambda: None) == []
        # Nor relayed: the message is not committed.
        assert _relay_ids(conn, "relay-1") == []
    assert listener.after(conn, lambda: None) == [("orders.created", pid)]

    # A put of many announces each topic it put to.
    def put_many() -> None:
        rows = producer.execute(
            "SELECT id FROM x_jobs.outbox_put_many(%s)",
            [
                Jsonb(
                    [
                        {"topic": "orders.created", "payload": {"n": 2}},
                        {"topic": "orders.paid", "payload": {"n": 3}},
                        {"topic": "orders.created", "payload": {"n": 4}},
                    ]
                )
            ],
        ).fetchall()
        ids.extend(int(r[0]) for r in rows)

    got = listener.after(conn, put_many)
    assert sorted(got) == [("orders.created", pid), ("orders.paid", pid)]

    # Relayed once: handed out, then held until acked, then gone for good.
    assert _relay_ids(conn, "relay-1") == ids
    assert _relay_ids(conn, "relay-2") == []
    acked = [int(r[0]) for r in conn.execute(ACK, [ids, "relay-1"])]
    assert sorted(acked) == ids
    assert _relay_ids(conn, "relay-2") == []
    rows = conn.execute("SELECT state::text, attempt, count(*) FROM x_jobs.outbox GROUP BY 1, 2")
    assert rows.fetchall() == [("delivered", 1, len(ids))]


# --- the plan: relay_outbox on a big outbox --------------------------------------------------

DELIVERED = 1_000_000
PENDING = 100
#: Messages held under unexpired leases (the lapsed arm must read none of them).
INFLIGHT = 20
QTY = 10
#: Room over the undelivered messages for the statements that update the picked ids.
SLACK = 50
OUTBOX_INDEXES = {
    "outbox_pending_keyless_idx",
    "outbox_pending_keyed_idx",
    "outbox_inflight_idx",
    "outbox_key_idx",
    "outbox_pkey",
}

OUTBOX_FILL: list[LiteralString] = [
    # The history: a million delivered messages on 1,000 keys, none in a partial index. The
    # pending messages below use the same keys, so a lookup of a key's earlier messages that
    # does not go through the partial key index reads 1,000 delivered messages per key.
    """
    INSERT INTO x_jobs.outbox (
        created_at, max_attempts, topic, key, headers, payload, state, attempt, available_at,
        relay, delivered_at
    )
    SELECT t, 10, 'orders', 'key-' || g % 1000, '{}', '{}', 'delivered', 1, t, 'old-relay', t
    FROM generate_series(1, 1000000) AS g,
         LATERAL (SELECT now() - interval '30 days' + g * interval '1 second' AS t) AS x
    """,
    # Held under leases that run another day, on keys of their own.
    """
    INSERT INTO x_jobs.outbox (
        created_at, max_attempts, topic, key, headers, payload, state, attempt, available_at,
        relay
    )
    SELECT now(), 10, 'orders', 'busy-' || g, '{}', '{}', 'inflight', 1, now() + interval '1 day',
           'busy-relay'
    FROM generate_series(1, 20) AS g
    """,
    # The pending messages, through the API: 40 without a key, 60 on 20 keys (3 each).
    """
    SELECT x_jobs.outbox_put_many(jsonb_agg(jsonb_build_object(
        'topic', 'orders', 'payload', jsonb_build_object('n', g),
        'key', CASE WHEN g > 40 THEN 'key-' || g % 20 END) ORDER BY g))
    FROM generate_series(1, 100) AS g
    """,
    "VACUUM ANALYZE x_jobs.outbox",
]


@pytest.fixture(scope="module")
def outbox_dsn(admin: Conn, template_db: str) -> Iterator[str]:
    """A database of this module's own with a million delivered messages (about 5-10 s)."""
    with fresh_database(admin, template_db, prefix="x_jobs_plan_outbox") as dsn:
        started = time.monotonic()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for statement in OUTBOX_FILL:
                conn.execute(statement)
            counts = conn.execute(
                "SELECT state::text, count(*) FROM x_jobs.outbox GROUP BY 1"
            ).fetchall()
            assert dict(counts) == {
                "delivered": DELIVERED,
                "pending": PENDING,
                "inflight": INFLIGHT,
            }
        logger.info("filled the big outbox in %.1f s", time.monotonic() - started)
        yield dsn


@pytest.fixture
def outbox_connect(outbox_dsn: str) -> Iterator[Connect]:
    with connections(outbox_dsn) as opener:
        yield opener


def _on_outbox(node: dict[str, Any]) -> bool:
    if node.get("Relation Name") == "outbox" and node.get("Schema", "x_jobs") == "x_jobs":
        return True
    return node["Node Type"] == "Bitmap Index Scan" and str(node.get("Index Name", "")).startswith(
        "outbox_"
    )


def outbox_problems(plan: dict[str, Any], bound: int) -> list[str]:
    """How a statement's plan reads x_jobs.outbox other than by seeking the undelivered
    messages through the partial indexes: any other access path, or too many rows anywhere."""
    problems = []
    for node in nodes(plan["Plan"]):
        if _on_outbox(node):
            kind, index = node["Node Type"], node.get("Index Name")
            if kind in ("ModifyTable", "Tid Scan", "Bitmap Heap Scan"):
                # The update of rows already found (by ctid), or the heap visit of a bitmap
                # whose index scan is checked on its own.
                pass
            elif kind not in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"):
                problems.append(f"{kind} on x_jobs.outbox")
            elif index not in OUTBOX_INDEXES:
                problems.append(f"{kind} on x_jobs.outbox through {index}")
        if rows_read(node) > bound:
            where = node.get("Index Name") or node.get("Relation Name") or ""
            problems.append(
                f"{node['Node Type']} {where} handled {rows_read(node):.0f} rows (bound {bound})"
            )
    return problems


def _reads_outbox(plan: dict[str, Any]) -> bool:
    return any(_on_outbox(node) for node in nodes(plan["Plan"]))


def test_relay_outbox_reads_only_the_undelivered_messages(outbox_connect: Connect) -> None:
    conn = outbox_connect(name="plan-relay")
    log = PlanLog(conn)
    bound = PENDING + INFLIGHT + SLACK
    relayed: list[int] = []
    # Past the 5 calls after which PL/pgSQL may keep a generic plan (relay_outbox pins
    # force_generic_plan anyway). Each call acks what it got, so the next one finds new heads.
    for call in range(1, 8):
        log.take()
        ids = _relay_ids(conn, "plan-relay", qty=QTY)
        # A call that handed out nothing would pass every check below without seeking.
        assert ids, f"call {call} handed out nothing"
        nested = [
            p for p in log.take() if "x_jobs.relay_outbox(" not in str(p.get("Query Text", ""))
        ]
        reading = [p for p in nested if _reads_outbox(p)]
        assert reading, f"call {call}: auto_explain logged no statement that reads the outbox"
        indexes: set[str] = set()
        for plan in reading:
            where = f"call {call}: {plan['Query Text'].strip()[:60]!r}"
            assert outbox_problems(plan, bound) == [], where
            indexes |= {str(n.get("Index Name")) for n in nodes(plan["Plan"]) if _on_outbox(n)}
        # Each arm seeks its own partial index; the key checks seek the key index.
        arms = {"outbox_pending_keyless_idx", "outbox_pending_keyed_idx", "outbox_inflight_idx"}
        assert arms | {"outbox_key_idx"} <= indexes, indexes
        acked = conn.execute(ACK, [ids, "plan-relay"]).fetchall()
        assert len(acked) == len(ids)
        relayed.extend(ids)
    assert len(relayed) == len(set(relayed))


def test_the_outbox_checker_rejects_a_scan_of_the_history(outbox_connect: Connect) -> None:
    """A lookup of a key's earlier messages that forgets the state reads its delivered ones."""
    conn = outbox_connect(name="naive-relay")
    with conn.transaction():
        row = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON)"
            " SELECT o.id FROM x_jobs.outbox AS o"
            " WHERE o.key = 'key-5' AND o.state <> 'delivered' ORDER BY o.id LIMIT 1"
        ).fetchone()
        assert row is not None
        plan: dict[str, Any] = row[0][0]
        raise psycopg.Rollback()
    problems = outbox_problems(plan, PENDING + INFLIGHT + SLACK)
    assert problems, "the checker passed a lookup that reads the history"
    logger.info("the naive lookup: %s", problems)


#: A page of the operator's listing.
PAGE = 20
LIST_OUTBOX: LiteralString = """
    SELECT id FROM x_jobs.list_outbox(state => %(state)s, key => %(key)s,
                                      before_id => %(before_id)s::bigint, max_rows => %(page)s)
"""


def test_the_outbox_listing_reads_its_page_and_no_more(outbox_connect: Connect) -> None:
    """list_outbox walks the primary key backwards from before_id (planned for its values, so
    the bound is a bound of the walk, not a filter, and never split among parallel workers);
    the undelivered states read the relays' partial indexes: each reads about its page or the
    backlog, not the million delivered messages."""
    conn = outbox_connect(name="operator")
    log = PlanLog(conn)
    pending = {"outbox_pending_keyless_idx", "outbox_pending_keyed_idx"}
    calls: list[tuple[dict[str, Any], set[str]]] = [
        ({}, {"outbox_pkey"}),
        ({"before_id": DELIVERED // 2}, {"outbox_pkey"}),
        ({"state": "pending"}, pending),
        ({"state": "pending", "key": "key-5"}, pending | {"outbox_key_idx"}),
        ({"state": "inflight"}, {"outbox_inflight_idx"}),
        ({"state": "inflight", "key": "busy-3"}, {"outbox_key_idx", "outbox_inflight_idx"}),
    ]
    for params, indexes in calls:
        log.take()
        args = {"state": None, "key": None, "before_id": None, "page": PAGE, **params}
        ids = [int(row[0]) for row in conn.execute(LIST_OUTBOX, args)]
        assert ids == sorted(ids, reverse=True), params
        assert ids or params.get("key") == "key-5", params  # its pending ones may be relayed
        if "before_id" in params:
            assert ids == list(range(DELIVERED // 2 - 1, DELIVERED // 2 - 1 - PAGE, -1))
        reading = [
            p
            for p in log.take()
            if "x_jobs.list_outbox(" not in str(p.get("Query Text", "")) and _reads_outbox(p)
        ]
        assert reading, f"{params}: auto_explain logged no statement that reads the outbox"
        for plan in reading:
            assert outbox_problems(plan, PENDING + INFLIGHT + SLACK) == [], params
            used = {str(n.get("Index Name")) for n in nodes(plan["Plan"]) if _on_outbox(n)}
            assert used and used <= indexes, (params, used)


def test_relays_claiming_at_once_each_get_free_keys(conn: Conn, connect: Connect) -> None:
    """Relays whose calls overlap pass over the heads the others hold and take the next free
    ones. 0.3.7's first draft locked only the first 2 x qty heads its window found: the third
    of three overlapping relays got nothing with six keys free."""
    conn.execute(
        "SELECT x_jobs.outbox_put_many(jsonb_agg(jsonb_build_object("
        " 'topic', 'overlap', 'payload', '{}'::jsonb, 'key', 'k' || g) ORDER BY g))"
        " FROM generate_series(1, 10) AS g"
    )
    relays = [connect(autocommit=False, name=f"overlap-{n}") for n in range(3)]
    taken = [_relay_ids(relay, f"overlap-{n}", qty=2) for n, relay in enumerate(relays)]
    for relay in relays:
        relay.commit()
    assert [len(ids) for ids in taken] == [2, 2, 2], taken
    assert len({i for ids in taken for i in ids}) == 6


def _one_id(cursor: psycopg.Cursor[Any]) -> int:
    row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def test_a_key_lock_held_elsewhere_holds_back_that_key_only(conn: Conn, connect: Connect) -> None:
    """Any login may take advisory locks, x_jobs' classes included. A session holding the lock
    of one key leaves that key's messages for a later call; until 0.3.8 relay_outbox waited for
    it, and every message of the outbox (keyless ones, other keys) waited with it."""
    put: LiteralString = "SELECT x_jobs.outbox_put('held', '{}', key => %s)"
    ids = {key: _one_id(conn.execute(put, [key])) for key in (None, "held-1", "held-2")}
    stranger = connect(name="lock-holder")
    stranger.execute("SELECT pg_advisory_lock(2024061705, hashtext('held-1'))")
    relay = connect(name="relay")
    # A guard against the old wait, which would hang here for good.
    relay.execute("SET statement_timeout = '20s'")
    assert sorted(_relay_ids(relay, "held-relay", ["held"])) == sorted([ids[None], ids["held-2"]])
    stranger.execute("SELECT pg_advisory_unlock(2024061705, hashtext('held-1'))")
    assert _relay_ids(relay, "held-relay", ["held"]) == [ids["held-1"]]


def test_a_key_lock_held_elsewhere_takes_no_place_among_qty(conn: Conn, connect: Connect) -> None:
    """The oldest head's key is locked by another session: a relay asking for one message gets
    the next head. Until 0.3.9 the heads were cut to qty before their keys were tried, and a
    relay of qty 1 got nothing, call after call, for as long as that lock was held; with qty 3
    a place was lost each call. The window's heads and those found by visiting keys alike."""
    put: LiteralString = "SELECT x_jobs.outbox_put('front', '{}', key => %s)"
    keys = ["front-stuck", "front-a", "front-b", "front-c"]
    ids = {key: _one_id(conn.execute(put, [key])) for key in keys}
    stranger = connect(name="lock-holder")
    stranger.execute("SELECT pg_advisory_lock(2024061705, hashtext('front-stuck'))")
    relay = connect(name="relay")
    assert _relay_ids(relay, "front-relay", ["front"], qty=1) == [ids["front-a"]]
    assert sorted(_relay_ids(relay, "front-relay", ["front"], qty=3)) == sorted(
        [ids["front-b"], ids["front-c"]]
    )
    assert _relay_ids(relay, "front-relay", ["front"], qty=1) == []
    stranger.execute("SELECT pg_advisory_unlock(2024061705, hashtext('front-stuck'))")
    assert _relay_ids(relay, "front-relay", ["front"], qty=1) == [ids["front-stuck"]]


def test_a_key_lock_held_elsewhere_takes_no_place_when_keys_are_visited(
    conn: Conn, connect: Connect
) -> None:
    """The same behind a window full of messages waiting for their key (one in flight, 120
    behind it, more than a call of qty 1 reads), where the relay visits the keys instead."""
    conn.execute(
        "SELECT x_jobs.outbox_put_many(jsonb_agg(jsonb_build_object("
        " 'topic', 'wall', 'payload', jsonb_build_object('n', g), 'key', 'wall') ORDER BY g))"
        " FROM generate_series(1, 121) AS g"
    )
    assert len(_relay_ids(conn, "wall-relay", ["wall"], qty=1)) == 1
    put: LiteralString = "SELECT x_jobs.outbox_put('wall', '{}', key => %s)"
    ids = {key: _one_id(conn.execute(put, [key])) for key in ("wall-stuck", "wall-free")}
    stranger = connect(name="lock-holder")
    stranger.execute("SELECT pg_advisory_lock(2024061705, hashtext('wall-stuck'))")
    relay = connect(name="relay")
    assert _relay_ids(relay, "wall-relay", ["wall"], qty=1) == [ids["wall-free"]]
    assert _relay_ids(relay, "wall-relay", ["wall"], qty=1) == []
    stranger.execute("SELECT pg_advisory_unlock(2024061705, hashtext('wall-stuck'))")
    assert _relay_ids(relay, "wall-relay", ["wall"], qty=1) == [ids["wall-stuck"]]


#: Keys held back (a message in flight, one pending behind it): more than a call visits.
HELD_KEYS = 3_000
PUT_HELD: LiteralString = """
    SELECT x_jobs.outbox_put_many(jsonb_agg(jsonb_build_object(
        'topic', 'held', 'payload', '{}'::jsonb, 'key', 'held-' || lpad(g::text, 5, '0'))
        ORDER BY g))
    FROM generate_series(1, %s) AS g
"""


def _key_index_reads(conn: Conn, reader: Conn) -> int:
    """Entries read from outbox_key_idx so far, once ``reader`` sent what it counted (a session
    sends its statistics at a delay)."""
    reader.execute("SELECT pg_stat_force_next_flush()")
    row = conn.execute(
        "SELECT idx_tup_read FROM pg_catalog.pg_stat_user_indexes"
        " WHERE schemaname = 'x_jobs' AND indexrelname = 'outbox_key_idx'"
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_relay_call_visits_a_bounded_number_of_keys_and_reaches_all_in_turn(
    conn: Conn, connect: Connect
) -> None:
    """3,000 keys held back ahead of ten with a message free to go: a call of qty 1 visits at
    most a window's worth of keys (110), from where the session's last visit ended; until 0.3.9
    it visited every key of the outbox (0.75-1.05 s a call at 100,000), however many it needed.
    Successive calls of one session reach the free keys all the same, each once."""
    # A message of each key, all sent (in flight), then one more of each, held back behind it.
    conn.execute(PUT_HELD, [HELD_KEYS])
    for _ in range(HELD_KEYS // 1000):
        assert len(_relay_ids(conn, "first-relay", ["held"], qty=1000)) == 1000
    conn.execute(PUT_HELD, [HELD_KEYS])
    free = [
        _one_id(conn.execute("SELECT x_jobs.outbox_put('held', '{}', key => %s)", [f"zfree-{n}"]))
        for n in range(10)
    ]
    relay = connect(name="relay")
    before = _key_index_reads(conn, relay)
    assert _relay_ids(relay, "second-relay", ["held"], qty=1) == []
    read = _key_index_reads(conn, relay) - before
    assert 0 < read < 1_000, f"a call of qty 1 read {read} entries of outbox_key_idx"
    got: list[int] = []
    for _ in range(HELD_KEYS // 110 + 20):
        got += _relay_ids(relay, "second-relay", ["held"], qty=1)
    assert sorted(got) == sorted(free)


BUSY_KEYS = 200
#: Pending messages behind the message in flight of each busy key: none can go out.
BEHIND = 40


def test_relay_outbox_with_every_key_busy_reads_the_keys_not_their_backlog(conn: Conn) -> None:
    """Every key has a message in flight and a backlog behind it: no keyed message can go out.
    Until 0.3.7 each call walked the whole backlog to answer none (5-6 s at 500,000 pending);
    it now reads a window of them, then visits each key once. The keyless messages put after
    the backlog still go out at once, and once a key's message is acked, its next one does."""
    conn.execute(
        "SELECT x_jobs.outbox_put_many(jsonb_agg(jsonb_build_object("
        " 'topic', 'busy', 'payload', jsonb_build_object('n', g), 'key', 'busy-' || g %% %s)"
        " ORDER BY g))"
        " FROM generate_series(0, %s) AS g",
        [BUSY_KEYS, BUSY_KEYS * (BEHIND + 1) - 1],
    )
    firsts = _relay_ids(conn, "first-relay", qty=BUSY_KEYS)
    assert len(firsts) == BUSY_KEYS
    keyless = [
        int(row[0])
        for row in conn.execute(
            "SELECT x_jobs.outbox_put('busy', jsonb_build_object('n', g))"
            " FROM generate_series(1, 5) AS g"
        ).fetchall()
    ]
    conn.execute("VACUUM ANALYZE x_jobs.outbox")
    log = PlanLog(conn)
    qty = 10
    assert sorted(_relay_ids(conn, "busy-relay", qty=qty)) == sorted(keyless)
    plans = [p for p in log.take() if "x_jobs.relay_outbox(" not in str(p.get("Query Text", ""))]
    assert plans, "auto_explain logged no statement of relay_outbox"
    # The window (10 x qty + 100), a seek or two per key, the keyless: far below the backlog.
    bound = 10 * qty + 100 + 4 * BUSY_KEYS + 50
    assert 4 * bound < BUSY_KEYS * BEHIND  # the old walk read them all
    for plan in plans:
        where = plan["Query Text"].strip()[:60]
        assert outbox_problems(plan, bound) == [], where
    assert _relay_ids(conn, "busy-relay", qty=qty) == []
    key = "SELECT key FROM x_jobs.outbox WHERE id = %s"
    [acked_key] = conn.execute(key, [firsts[0]]).fetchone() or [None]
    [next_id] = conn.execute(
        "SELECT min(id) FROM x_jobs.outbox WHERE key = %s AND state = 'pending'", [acked_key]
    ).fetchone() or [None]
    conn.execute(ACK, [firsts[:1], "first-relay"])
    assert _relay_ids(conn, "busy-relay", qty=qty) == [next_id]


# --- two receipts of one webhook at once -----------------------------------------------------


def _receive(conn: Conn, source: str, webhook_id: str) -> tuple[tuple[int, bool], int]:
    """receive_webhook in a transaction of its own, retried on 40001 (X_WEBHOOK_RACE): answer
    (job_id, duplicate) and how many attempts raced."""
    raced = 0
    for _ in range(5):
        try:
            with conn.transaction():
                row = conn.execute(RECEIVE, [source, webhook_id]).fetchone()
                assert row is not None
                return (int(row[0]), bool(row[1])), raced
        except psycopg.errors.SerializationFailure as err:
            assert (err.diag.message_primary or "").startswith("X_WEBHOOK_RACE:"), err
            raced += 1
    pytest.fail(f"receive_webhook({source!r}, {webhook_id!r}) raced 5 times")


def _written(conn: Conn) -> tuple[int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM x_jobs.job), (SELECT count(*) FROM x_jobs.webhook_ledger)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_a_receipt_racing_an_uncommitted_one_answers_its_job(conn: Conn, connect: Connect) -> None:
    first, second = connect(name="receiver-1"), connect(name="receiver-2")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with first.transaction():
            row = first.execute(RECEIVE, ["stripe", "evt_1"]).fetchone()
            assert row is not None
            job_id, duplicate = int(row[0]), bool(row[1])
            assert not duplicate
            racing = pool.submit(_receive, second, "stripe", "evt_1")
            # The second receipt waits for the first (it cannot know yet whether it commits).
            wait_for_lock_waiters(conn, [second.info.backend_pid])
        answer, raced = racing.result(timeout=DEADLINE_SECONDS)
    # Either it waited and then found the ledger row, or it raised X_WEBHOOK_RACE and its retry
    # did: the same job, as a duplicate.
    assert answer == (job_id, True), raced
    assert _written(conn) == (1, 1)
    row = conn.execute("SELECT source, webhook_id, job_id FROM x_jobs.webhook_ledger").fetchone()
    assert row == ("stripe", "evt_1", job_id)


def test_a_receipt_racing_one_that_rolls_back_makes_the_job(conn: Conn, connect: Connect) -> None:
    first, second = connect(name="receiver-1"), connect(name="receiver-2")
    with ThreadPoolExecutor(max_workers=1) as pool:
        with first.transaction():
            first.execute(RECEIVE, ["stripe", "evt_2"])
            racing = pool.submit(_receive, second, "stripe", "evt_2")
            wait_for_lock_waiters(conn, [second.info.backend_pid])
            raise psycopg.Rollback()
        (job_id, duplicate), _ = racing.result(timeout=DEADLINE_SECONDS)
    assert not duplicate
    assert _written(conn) == (1, 1)
    row = conn.execute("SELECT id FROM x_jobs.job").fetchone()
    assert row == (job_id,)


RECEIVERS = 8
WEBHOOKS = 20


def test_receivers_racing_over_many_webhooks_make_one_job_each(
    conn: Conn, connect: Connect
) -> None:
    receivers = [connect(name=f"receiver-{n}") for n in range(RECEIVERS)]
    barrier = threading.Barrier(RECEIVERS)
    webhook_ids = [f"evt_{n}" for n in range(WEBHOOKS)]

    def receive_all(receiver: Conn, seed: int) -> list[tuple[str, int, bool]]:
        order = list(webhook_ids)
        random.Random(seed).shuffle(order)
        barrier.wait(timeout=DEADLINE_SECONDS)
        answers = []
        for webhook_id in order:
            (job_id, duplicate), _ = _receive(receiver, "stripe", webhook_id)
            answers.append((webhook_id, job_id, duplicate))
        return answers

    with ThreadPoolExecutor(max_workers=RECEIVERS) as pool:
        futures = [pool.submit(receive_all, r, n) for n, r in enumerate(receivers)]
        answers = [a for f in futures for a in f.result(timeout=2 * DEADLINE_SECONDS)]

    by_id: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for webhook_id, job_id, duplicate in answers:
        by_id[webhook_id].append((job_id, duplicate))
    for webhook_id, got in by_id.items():
        # Every receipt answered the same job; exactly one of them made it.
        assert len({job_id for job_id, _ in got}) == 1, (webhook_id, got)
        assert sorted(duplicate for _, duplicate in got) == [False] + [True] * (RECEIVERS - 1)
    assert len(by_id) == WEBHOOKS
    assert _written(conn) == (WEBHOOKS, WEBHOOKS)
    rows = conn.execute(
        "SELECT count(*) FROM x_jobs.webhook_ledger AS l JOIN x_jobs.job AS j ON j.id = l.job_id"
    ).fetchone()
    assert rows == (WEBHOOKS,)


@pytest.mark.parametrize(
    "payload", [{"ratio": float("nan")}, {"note": "a\x00b"}], ids=["nan", "nul"]
)
def test_a_payload_postgresql_cannot_store_is_a_typed_refusal(
    dsn: str, conn: Conn, payload: dict[str, Any]
) -> None:
    """NaN and a NUL character pass Python's JSON and not jsonb: put and put_many raised the
    bare DataError where every refusal of a message is X_MESSAGE_INVALID."""
    app = x_jobs.App(dsn)
    try:
        with pytest.raises(x_jobs.errors.MessageInvalid) as one:
            app.outbox.put("t.bad", payload)
        with pytest.raises(x_jobs.errors.MessageInvalid):
            app.outbox.put_many(
                [{"topic": "t.ok", "payload": {}}, {"topic": "t.bad", "payload": payload}]
            )
    finally:
        app.close()
    assert one.value.message.startswith("X_MESSAGE_INVALID: the message is not JSON")
    assert one.value.hint
    assert conn.execute("SELECT count(*) FROM x_jobs.outbox").fetchone() == (0,)
