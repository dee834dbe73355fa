\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.7'" to load this file. \quit

-- 0.3.6 -> 0.3.7: what a scale review measured growing with the table. No function changes
-- what it takes or answers.
--   * relay_outbox read every pending message queued behind a busy key: with each key's
--     message in flight, a call read 500,000 pending messages to answer none (5-6 s). Keyless
--     and keyed pending messages have indexes of their own; keyed heads are looked for in a
--     window of the oldest keyed messages, then key by key (one seek each) when the window
--     holds too few; each check of a message's key is two seeks of outbox_key_idx, now on
--     (key, state, id), where it read every undelivered message of the key.
--   * queue_demand (what an autoscaler polls) materialised, fetched and sorted every due row:
--     it counts per queue off the claim's indexes now, and ranks only keyed rows, read in rank
--     order from job_keyed_idx (new); queue_stats counts each state per queue the same way.
--     At 100k ready rows over 50 queues 183 ms against 24, at 500k 1.0 s against 0.18.
--   * list_jobs of dead, failed or cancelled rows read the whole table (290-460 ms at 1.1M
--     rows): they walk job_ended_idx (new) newest first; each live state may read its claim
--     index.

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

-- The due rows of each concurrency key in the claim's grant order, with what queue_demand reads
-- of them, so that it ranks only keyed rows, without the heap. Only keyed live rows that wait
-- are in it: a row without a key never enters it, and a claimed one leaves it.
CREATE INDEX job_keyed_idx ON x_jobs.job (concurrency_key, priority, run_at, id)
INCLUDE (queue, concurrency_limit)
WHERE concurrency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended');

-- The rows that ended badly, for list_jobs to page newest first: few beside the done ones, and
-- a row enters only when it ends that way, so the claim and settle path pays nothing for it.
CREATE INDEX job_ended_idx ON x_jobs.job (id)
WHERE state IN ('dead', 'failed', 'cancelled');

-- The operator's listing: jobs newest first, optionally of one state and one queue, one page
-- at a time. Keyset paging: pass the last id of a page as before_id to get the next, which
-- costs the same on page 1 and page 1,000 (an OFFSET would read every row it skips).
--
-- Planned for each call's values (see plan_cache_mode below), so the planner sees the state as
-- a constant and may use a partial index whose predicate it implies: dead, failed and cancelled
-- rows walk job_ended_idx newest first, so a listing of 50 dead rows beside a million done ones
-- reads them and no more (a Parallel Seq Scan of the whole table until 0.3.7: 290-460 ms at
-- 1.1M rows). A live state may read its claim arm index and sort what it found, or walk the
-- primary key, whichever costs lower: live rows are bounded by the backlog, not the history.
-- Done rows, and all rows, walk the primary key.
CREATE OR REPLACE FUNCTION x_jobs.list_jobs(
    state text DEFAULT NULL,
    queue text DEFAULT NULL,
    before_id bigint DEFAULT NULL,
    max_rows integer DEFAULT 50
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
-- An operator's call, planned for its values each time: a generic plan proves no partial
-- index's predicate from `state = $1`, and reads `queue IS NULL OR queue = $2` as a filter.
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    v_state x_jobs.job_state;
BEGIN
    IF list_jobs.state IS NOT NULL
        AND list_jobs.state <> ALL (pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ016',
            MESSAGE = pg_catalog.format('X_STATE_UNKNOWN: %L is not a job state', list_jobs.state),
            HINT = 'Use one of: ' || pg_catalog.array_to_string(
                pg_catalog.enum_range(NULL::x_jobs.job_state)::text[], ', ') || '.';
    END IF;
    IF list_jobs.max_rows IS NULL OR list_jobs.max_rows < 1 OR list_jobs.max_rows > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..1000',
                coalesce(list_jobs.max_rows::text, 'NULL')),
            HINT = 'Ask for a page of 1 to 1000 rows and page on with before_id.';
    END IF;
    v_state := list_jobs.state::x_jobs.job_state;

    RETURN QUERY
    SELECT j.*
    FROM x_jobs.job AS j
    WHERE (v_state IS NULL OR j.state = v_state)
        AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
        AND (list_jobs.before_id IS NULL OR j.id < list_jobs.before_id)
    ORDER BY j.id DESC
    LIMIT list_jobs.max_rows;
END
$$;

-- Per queue, the rows a serving worker must hold: due rows of unpaused queues; running rows
-- whose lease holds, unless a live draining worker holds them (it finishes them itself, so no
-- worker a scaler adds could take them; a claimer with no live row, killed or lapsed, stays
-- counted: its jobs come back to the queue); and running rows whose lease lapsed, which the
-- next claim takes, so only in unpaused queues and whoever held them. Queues with no demand are
-- absent. This is what KEDA polls.
--
-- A due row with a concurrency key counts only while its key has room, as claim grants them
-- (by rank within the key against the row's limit less the key's running rows): 50 rows of a
-- key limited to 1 are one worker's work, not 50, and counting them scaled out workers that
-- could claim nothing.
--
-- It COUNTS OFF THE INDEXES. Due and lapsed rows are counted per queue by index-only scans of
-- the claim's arm indexes, in their queue order (no sort, no heap), and a pause drops a queue's
-- counts, not its rows one by one. Keyed rows alone are ranked, read in rank order from
-- job_keyed_idx; they add what their keys grant less what the plain count gave them. The rows a
-- lease holds need claimed_by from the heap only while a live worker drains. Until 0.3.7 one
-- CTE of every due row was materialised, fetched from the heap and sorted: at 100k ready rows
-- over 50 queues 183 ms against 24 now, at 500k 1.0 s against 0.18 (measured 2026-11-30, pages
-- all-visible). Pages vacuum has not marked yet cost a heap visit per row still (154 ms, 100k).
--
-- SECURITY DEFINER: monitoring roles (pg_monitor, an autoscaler's login) get counts without
-- being able to read job inputs. It reads only; search_path is pinned.
CREATE OR REPLACE FUNCTION x_jobs.queue_demand()
RETURNS TABLE (queue text, demand bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH busy AS (
        SELECT j.concurrency_key, count(*) AS running
        FROM x_jobs.job AS j
        WHERE j.concurrency_key IS NOT NULL AND j.state = 'running'
        GROUP BY j.concurrency_key
    ),
    draining AS (
        SELECT w.id FROM x_jobs.worker AS w
        WHERE w.draining_at IS NOT NULL AND w.expires_at > x_jobs.now()
    )
    SELECT d.queue, sum(d.n)::bigint AS demand
    FROM (
        SELECT o.queue, o.n
        FROM (
            SELECT j.queue, count(*) AS n FROM x_jobs.job AS j
            WHERE j.state = 'ready' AND j.run_at <= x_jobs.now()
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*) FROM x_jobs.job AS j
            WHERE j.state IN ('delayed', 'suspended') AND j.run_at <= x_jobs.now()
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*) FROM x_jobs.job AS j
            WHERE j.state = 'running' AND j.visible_at <= x_jobs.now()
            GROUP BY j.queue
        ) AS o
        WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = o.queue)
        UNION ALL
        SELECT k.queue, count(*) FILTER (WHERE k.rank <= k.concurrency_limit - coalesce(b.running, 0))
               - count(*)
        FROM (
            SELECT j.queue, j.concurrency_key, j.concurrency_limit,
                   pg_catalog.row_number() OVER (
                       PARTITION BY j.concurrency_key ORDER BY j.priority, j.run_at, j.id
                   ) AS rank
            FROM x_jobs.job AS j
            WHERE j.concurrency_key IS NOT NULL
                AND j.state IN ('ready', 'delayed', 'suspended')
                AND j.run_at <= x_jobs.now()
                AND j.queue <> ALL (ARRAY(SELECT p.queue FROM x_jobs.queue_pause AS p))
        ) AS k
        LEFT JOIN busy AS b ON b.concurrency_key = k.concurrency_key
        GROUP BY k.queue
        UNION ALL
        SELECT j.queue, count(*) FROM x_jobs.job AS j
        WHERE j.state = 'running' AND j.visible_at > x_jobs.now()
            AND NOT EXISTS (SELECT FROM draining)
        GROUP BY j.queue
        UNION ALL
        SELECT j.queue, count(*) FROM x_jobs.job AS j
        WHERE j.state = 'running' AND j.visible_at > x_jobs.now()
            AND EXISTS (SELECT FROM draining)
            AND j.claimed_by NOT IN (SELECT r.id FROM draining AS r)
        GROUP BY j.queue
    ) AS d
    GROUP BY d.queue
    HAVING sum(d.n) > 0
    ORDER BY d.queue COLLATE "C"
$$;

-- Per queue, how many live rows are in each state, whether the queue is paused, and its demand
-- (as queue_demand counts it). Queues with no live row and no pause are absent. For an operator's
-- `x-jobs queues`: it reads the three partial indexes, never the finished rows. Each is counted
-- per queue before anything is joined, ready and running rows by index-only scans; only the
-- waiting rows come from the heap, which alone tells a delayed row from a suspended one.
CREATE OR REPLACE FUNCTION x_jobs.queue_stats()
RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    suspended bigint,
    running bigint,
    paused boolean,
    demand bigint
)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH counted AS (
        SELECT l.queue, sum(l.ready) AS ready, sum(l.delayed) AS delayed,
               sum(l.suspended) AS suspended, sum(l.running) AS running
        FROM (
            SELECT j.queue, count(*) AS ready, 0 AS delayed, 0 AS suspended, 0 AS running
            FROM x_jobs.job AS j WHERE j.state = 'ready'
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'delayed'),
                   count(*) FILTER (WHERE j.state = 'suspended'), 0
            FROM x_jobs.job AS j WHERE j.state IN ('delayed', 'suspended')
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, 0, 0, count(*)
            FROM x_jobs.job AS j WHERE j.state = 'running'
            GROUP BY j.queue
        ) AS l
        GROUP BY l.queue
    )
    SELECT q.queue,
           coalesce(c.ready, 0)::bigint, coalesce(c.delayed, 0)::bigint,
           coalesce(c.suspended, 0)::bigint, coalesce(c.running, 0)::bigint,
           p.queue IS NOT NULL,
           coalesce(d.demand, 0)
    FROM (SELECT c.queue FROM counted AS c UNION SELECT p.queue FROM x_jobs.queue_pause AS p) AS q
    LEFT JOIN counted AS c ON c.queue = q.queue
    LEFT JOIN x_jobs.queue_pause AS p ON p.queue = q.queue
    LEFT JOIN x_jobs.queue_demand() AS d ON d.queue = q.queue
    ORDER BY q.queue COLLATE "C"
$$;
