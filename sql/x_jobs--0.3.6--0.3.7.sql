\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.7'" to load this file. \quit

-- 0.3.6 -> 0.3.7: what a scale review measured growing with the table. No function changes
-- what it takes or answers.
--   * relay_outbox read every pending message queued behind a busy key: with each key's
--     message in flight, a call read 500,000 pending messages to answer none (5-6 s). Keyless
--     and keyed pending messages have indexes of their own; keyed heads are looked for in a
--     window of the oldest keyed messages, then key by key (one seek each) when the window
--     holds too few; each check of a message's key is two seeks of outbox_key_idx, now on
--     (key, state, id), where it read every undelivered message of the key.

-- The version of the SQL API installed here. Clients check it before they speak to the database
-- (the Python worker refuses one it cannot speak to); it answers the same whether the schema came
-- from CREATE EXTENSION or from `x-jobs install` on a server that allows no extension files.
-- Each version's script (and upgrade script) replaces this function with its own number.
CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.3.7'::text
$$;

-- The outbox's pending messages apart by key or none, and the key index with the state: see
-- relay_outbox. Each build reads the whole outbox once, under a lock that holds off puts and
-- relays until it is done: on a big outbox, update at a quiet time or purge_outbox first.
DROP INDEX x_jobs.outbox_pending_idx;
DROP INDEX x_jobs.outbox_key_idx;

CREATE INDEX outbox_pending_keyless_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NULL;

CREATE INDEX outbox_pending_keyed_idx ON x_jobs.outbox (available_at, id)
WHERE state = 'pending' AND key IS NOT NULL;

CREATE INDEX outbox_key_idx ON x_jobs.outbox (key, state, id)
WHERE key IS NOT NULL AND state IN ('pending', 'inflight');

-- Hand `relay` up to `qty` messages to deliver, for `lease`: the oldest due pending messages
-- that head their key (nothing earlier of the key is pending, and nothing of the key is in
-- flight: a redriven or late-committed message with a lower id waits for the one out), and the
-- messages whose lease lapsed (a relay that died; dead instead on their final attempt). Locked
-- rows are skipped, so relays never wait for each other. `topics` restricts the claim to the
-- topics this relay has sinks for (NULL: all).
--
-- Keyless messages are a seek of their own index, about `qty` entries. Keyed ones are looked
-- for among the oldest due keyed messages, up to ten times `qty` of them, without locks (each
-- a head or not by two seeks of outbox_key_idx); the heads found are then locked, skipping
-- those another relay is taking. When that window is full of messages waiting behind their
-- keys (a backlog on keys whose messages are in flight, or nacked with a backoff) and yields
-- fewer than `qty`, the relay visits every key with undelivered messages instead, one seek
-- each, and takes the oldest of their heads: until 0.3.7 it walked the whole backlog, and with every key busy
-- a call read 500,000 pending messages to answer none (5-6 s, measured 2026-11-30). So a call
-- costs about `qty` entries when heads are at hand, and a seek per busy key at worst.
--
-- The two checks of a message's key are lateral subqueries with LIMIT 1, which the planner runs
-- per message as a seek of outbox_key_idx. As NOT EXISTS it made them anti-joins and, with
-- statistics that saw few pending messages, compared every message of the window with every
-- pending one: cheap on the table it planned for, quadratic on the backlog the plan is kept
-- for. "In flight" is spelt `state > 'pending'` beside the index's predicate (enum order: of
-- the two, only inflight is above pending), since `state = 'inflight'` matches the predicate
-- of outbox_inflight_idx, which the planner then read whole per message.
--
-- The keys of the picked messages are then locked and checked again under a fresh snapshot:
-- two relays claiming at once cannot both take a message of one key, whatever order the
-- producers committed in. A message of a key whose check fails stays locked, unclaimed, until
-- the call ends. Answers the messages in the order to deliver them, with the attempt this
-- delivery is.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.relay_outbox(
    relay text,
    qty integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
-- Before the outbox has statistics (a new table, a burst after a quiet spell) the planner chose
-- a bitmap scan of every pending message and a sort: 80 ms a call at 10,000 pending against
-- 3 ms for the ordered index walk (measured 2026-11-29). The walk is right at any size.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_window integer;
    v_window_full boolean;
    v_heads bigint[];
    v_picked bigint[];
    v_keys text[];
    v_lapsed boolean;
BEGIN
    IF relay_outbox.relay IS NULL OR relay_outbox.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(relay_outbox.relay), 'NULL')),
            HINT = 'Pass an id unique to the relay process, such as host:pid:random.';
    END IF;
    PERFORM x_jobs._require_lease(
        relay_outbox.lease, 'Pass a lease longer than a delivery takes, such as ''30 seconds''.'
    );
    IF relay_outbox.qty IS NULL OR relay_outbox.qty < 1 OR relay_outbox.qty > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: qty %s is outside 1..1000',
                coalesce(relay_outbox.qty::text, 'NULL')),
            HINT = 'Pass how many messages the relay can deliver at once, from 1 to 1000.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: relay_outbox cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call relay_outbox in its own READ COMMITTED transaction (autocommit).';
    END IF;
    v_window := 10 * relay_outbox.qty;

    -- The heads among the oldest due keyed messages, twice as many as wanted (room for those
    -- another relay is taking). Unlocked: a head taken meanwhile is skipped when the heads are
    -- locked below.
    v_heads := ARRAY(
        SELECT w.id
        FROM (
            SELECT o.id, o.key, o.topic, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NOT NULL
                AND o.available_at <= v_now
            ORDER BY o.available_at, o.id
            LIMIT v_window
        ) AS w
        LEFT JOIN LATERAL (
            SELECT e.id FROM x_jobs.outbox AS e
            WHERE e.key = w.key AND e.state = 'pending' AND e.id < w.id
                AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
            LIMIT 1
        ) AS earlier ON TRUE
        LEFT JOIN LATERAL (
            SELECT e.id FROM x_jobs.outbox AS e
            WHERE e.key = w.key AND e.state > 'pending'
                AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
            LIMIT 1
        ) AS out ON TRUE
        WHERE (relay_outbox.topics IS NULL OR w.topic = ANY (relay_outbox.topics))
            AND earlier.id IS NULL
            AND out.id IS NULL
        ORDER BY w.available_at, w.id
        LIMIT 2 * relay_outbox.qty
    );
    v_window_full := pg_catalog.cardinality(v_heads) < relay_outbox.qty AND v_window = (
        SELECT pg_catalog.count(*)
        FROM (
            SELECT FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NOT NULL
                AND o.available_at <= v_now
            ORDER BY o.available_at, o.id
            LIMIT v_window
        ) AS w
    );

    IF v_window_full THEN
        -- The window is mostly messages waiting behind their keys: visit the keys instead, a
        -- seek of outbox_key_idx from one key to the first entry of the next. That entry is the
        -- key's lowest pending message (its head), or one in flight when none is pending.
        v_heads := ARRAY(
            WITH RECURSIVE heads AS (
                (
                    SELECT o.key, o.state, o.id, o.topic, o.available_at FROM x_jobs.outbox AS o
                    WHERE o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                    ORDER BY o.key, o.state, o.id
                    LIMIT 1
                )
                UNION ALL
                SELECT n.*
                FROM heads AS h
                CROSS JOIN LATERAL (
                    SELECT o.key, o.state, o.id, o.topic, o.available_at FROM x_jobs.outbox AS o
                    WHERE o.key > h.key AND o.key IS NOT NULL AND o.state IN ('pending', 'inflight')
                    ORDER BY o.key, o.state, o.id
                    LIMIT 1
                ) AS n
            )
            SELECT h.id
            FROM heads AS h
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = h.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE h.state = 'pending'
                AND h.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR h.topic = ANY (relay_outbox.topics))
                AND out.id IS NULL
            ORDER BY h.available_at, h.id
            LIMIT 2 * relay_outbox.qty
        );
    END IF;

    SELECT coalesce(pg_catalog.array_agg(p.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.key) FILTER (WHERE p.key IS NOT NULL), '{}'),
           coalesce(pg_catalog.bool_or(p.lapsed), FALSE)
    INTO v_picked, v_keys, v_lapsed
    FROM (
        WITH keyless AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending' AND o.key IS NULL
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        ),
        keyed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.id = ANY (v_heads) AND o.state = 'pending'
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        ),
        lapsed AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'inflight'
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
            ORDER BY o.available_at, o.id
            LIMIT relay_outbox.qty
            FOR UPDATE SKIP LOCKED
        )
        -- Rows an arm locked and this LIMIT drops stay locked until the call's transaction ends.
        SELECT a.id, a.key, a.available_at, FALSE AS lapsed FROM keyless AS a
        UNION ALL
        SELECT k.id, k.key, k.available_at, FALSE AS lapsed FROM keyed AS k
        UNION ALL
        SELECT l.id, l.key, l.available_at, TRUE AS lapsed FROM lapsed AS l
        ORDER BY 3, 1
        LIMIT relay_outbox.qty
    ) AS p;

    IF pg_catalog.cardinality(v_keys) > 0 THEN
        -- A relay whose snapshot predates another relay's claim of the same key could see that
        -- key free (two producers on one key, the lower id committing last). So: lock the keys,
        -- in key order (no deadlock), and check them again in a statement whose snapshot comes
        -- after the locks, which sees every claim of these keys that held them before.
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061705, pg_catalog.hashtext(k.key))
        FROM unnest(v_keys) AS k (key)
        ORDER BY k.key;

        v_picked := ARRAY(
            SELECT o.id
            FROM x_jobs.outbox AS o
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state = 'pending' AND e.id < o.id
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS earlier ON TRUE
            LEFT JOIN LATERAL (
                SELECT e.id FROM x_jobs.outbox AS e
                WHERE e.key = o.key AND e.state > 'pending'
                    AND e.key IS NOT NULL AND e.state IN ('pending', 'inflight')
                LIMIT 1
            ) AS out ON TRUE
            WHERE o.id = ANY (v_picked)
                AND (o.key IS NULL OR o.state = 'inflight' OR (earlier.id IS NULL AND out.id IS NULL))
        );
    END IF;

    -- A message whose lease lapsed on its final attempt is not handed out again: a relay died
    -- (or outlived its lease) delivering it max_attempts times, and each redelivery could do the
    -- same while its key waited behind it. It is dead, for outbox_redrive, as a job is buried.
    IF v_lapsed THEN
        UPDATE x_jobs.outbox AS o
        SET state = 'dead',
            available_at = v_now,
            relay = NULL,
            last_error = 'lease lapsed on the final attempt'
        WHERE o.id = ANY (v_picked)
            AND o.state = 'inflight'
            AND o.attempt >= o.max_attempts;
    END IF;

    RETURN QUERY
    WITH taken AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'inflight',
            attempt = o.attempt + 1,
            relay = relay_outbox.relay,
            available_at = v_now + relay_outbox.lease
        WHERE o.id = ANY (v_picked)
            AND o.state <> 'dead'
        RETURNING o.id, o.topic, o.key, o.payload, o.headers, o.attempt
    )
    SELECT t.id, t.topic, t.key, t.payload, t.headers, t.attempt FROM taken AS t ORDER BY t.id;
END
$$;
