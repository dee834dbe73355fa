\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.6'" to load this file. \quit

-- 0.3.5 -> 0.3.6: producers hold no rights on the tables. What every function takes is unchanged;
-- one is new.
--   * enqueue, enqueue_many, outbox_put, outbox_put_many and receive_webhook run as their owner
--     (SECURITY DEFINER), as publish did, and x_jobs_producer loses SELECT and INSERT on
--     x_jobs.job, x_jobs.outbox and x_jobs.webhook_ledger and USAGE on their sequences. A
--     producer could read every job's input and every message's payload (other tenants' too),
--     and insert rows that skip every check: a row already running under a forged claimed_by,
--     an input past the size limit.
--   * result(id): a job's state, output and last error, for a producer (the Python client's
--     App.result read the row).
--   * Workers keep what the functions they call as themselves need: SELECT on x_jobs.job and
--     x_jobs.outbox (they had it as producers); admins SELECT on x_jobs.webhook_ledger (for
--     purge_webhook_ledger). The helpers only owner-run functions call (_enqueue, _run_ids,
--     _notify, _require_message) are granted to no role; _max_payload_bytes moves to workers.
--   * claim, extend_lease, relay_outbox and outbox_extend_lease refuse a lease through one
--     helper, _require_lease (the same codes, messages and hints as before).

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
    SELECT '0.3.6'::text
$$;

ALTER FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean
) SECURITY DEFINER;
ALTER FUNCTION x_jobs.enqueue_many(jsonb) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_put(text, jsonb, text, jsonb, integer) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_put_many(jsonb) SECURITY DEFINER;
ALTER FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) SECURITY DEFINER;

-- A job's outcome, as its producer may read it: state, output and last error, and nothing else of
-- the row (not its input). No row: no job has this id (never enqueued, purged after its
-- retention, or a keep_done => false job that completed).
-- SECURITY DEFINER: producers hold no rights on the tables (see Grants).
CREATE FUNCTION x_jobs.result(id bigint)
RETURNS TABLE (state text, output jsonb, last_error text)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT j.state::text, j.output, j.last_error FROM x_jobs.job AS j WHERE j.id = result.id
$$;

REVOKE ALL ON FUNCTION x_jobs.result(bigint) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.result(bigint) TO x_jobs_producer;

REVOKE SELECT, INSERT ON x_jobs.job, x_jobs.outbox, x_jobs.webhook_ledger FROM x_jobs_producer;
REVOKE USAGE ON SEQUENCE x_jobs.job_id_seq, x_jobs.outbox_id_seq FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._enqueue(x_jobs.enqueue_request[]) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._run_ids(integer) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._notify(text, text) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._require_message(text, jsonb, jsonb, integer) FROM x_jobs_producer;
REVOKE EXECUTE ON FUNCTION x_jobs._max_payload_bytes() FROM x_jobs_producer;

GRANT SELECT ON x_jobs.job, x_jobs.outbox TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._max_payload_bytes() TO x_jobs_worker;
GRANT SELECT ON x_jobs.webhook_ledger TO x_jobs_admin;

-- The refusal of a lease that is missing, not positive, or over 1000 years (one of many
-- millennia ended past what timestamptz holds: "timestamp out of range"), shared by the claims
-- and heartbeats of jobs and outbox messages. `p_hint` is the fix for the caller at hand.
CREATE FUNCTION x_jobs._require_lease(p_lease interval, p_hint text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive', coalesce(p_lease::text, 'NULL')),
            HINT = p_hint;
    END IF;
    IF p_lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', p_lease),
            HINT = p_hint;
    END IF;
END
$$;

REVOKE ALL ON FUNCTION x_jobs._require_lease(interval, text) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs._require_lease(interval, text) TO x_jobs_worker;

-- Hand up to `qty` due jobs of `queues` to `worker` for `lease`. Answers the claimed rows
-- (state 'running', attempt counted) in claim order, and after them any row it buried (state
-- 'dead' or 'failed'): a worker runs only the rows whose state is 'running'.
--
-- SKIP LOCKED is the design: a row another claimer holds is passed over, never waited for, so
-- claimers never queue behind one another.
--
-- It SEEKS. For each open queue three ordered index scans, one per arm, each reading about `qty`
-- entries, whatever the backlog:
--   ready     job_ready_idx    rows due now, in (priority, run_at, id) order;
--   waiting   job_waiting_idx  delayed and suspended rows whose run_at came, in run_at order;
--   lapsed    job_running_idx  running rows whose lease (visible_at) ran out, in lease order.
-- One `state IN (...) OR running` test over all queues cannot be served in order by any index:
-- it reads and sorts every due row, so a queue slows down exactly when it is behind. The outer
-- sort sees at most 3 x qty x queues rows. Priority orders the ready arm exactly; a row coming
-- due from a delay competes by priority among the earliest-due ones the waiting arm read.
--
-- A lapsed row on its final attempt is buried instead (dead, or failed for a job that wants no
-- dead letters), counted, and returned with that state: handing it out again would be an attempt
-- past max_attempts every lease, forever. Its claimed_by is cleared, so the stalled body cannot
-- settle a row it lost.
--
-- Concurrency keys: a row with a key is taken only while fewer than its limit of the key's rows
-- run. The scan skips keys that are full; the rows it took are then granted under an advisory
-- lock per key, taken in key order (no deadlock), counted again in a new statement, so two
-- claimers cannot both take the last slot. That needs READ COMMITTED, which a claim refuses
-- to run without. A claim walks past the waiting rows of full keys ahead of it: keep a key that
-- backs up by thousands in a queue of its own.
--
-- Slots spent on rows it could not hand out (buried, or denied by a key) are claimed again in
-- up to two more passes. Rows a scan locked and the outer LIMIT dropped stay locked until the
-- transaction ends; called on its own, a claim is its own transaction and that is at once.
CREATE OR REPLACE FUNCTION x_jobs.claim(
    queues text[],
    worker text,
    lease interval DEFAULT '30 seconds',
    qty integer DEFAULT 1
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Every call would otherwise be planned afresh: the generic plans are costed above the custom
-- ones (LIMIT of a parameter), so the plan cache keeps re-planning, which cost 2 ms a call here
-- (measured 2026-11-29: 3.0 ms against 1.0 ms for qty 10). The generic plans are the same seeks.
SET plan_cache_mode = force_generic_plan
-- A generic plan costs the LIMIT as if every due row were read, which is above the JIT
-- thresholds on a big table: each call then compiled its plan with LLVM (70-880 ms against 1 ms,
-- 1.1M rows). The seeks read a few rows; compiling never pays.
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_queues text[];
    v_pass integer := 0;
    v_want integer;
    v_got integer := 0;
    v_seen bigint[] := ARRAY[]::bigint[];
    v_picked integer;
    v_take bigint[];
    v_take_at tid[];
    v_bury bigint[];
    v_keyed bigint[];
    v_keys text[];
    v_lapsed bigint[];
    v_lapsed_attempt integer[];
    v_lapsed_worker text[];
    v_granted integer;
    v_busy_keys text[] := ARRAY[]::text[];
    v_claimed x_jobs.job[];
    v_buried x_jobs.job[];
    v_buried_all x_jobs.job[] := ARRAY[]::x_jobs.job[];
BEGIN
    IF claim.queues IS NULL OR pg_catalog.cardinality(claim.queues) = 0
        OR EXISTS (SELECT FROM unnest(claim.queues) AS q WHERE q IS NULL OR q = '') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ010',
            MESSAGE = pg_catalog.format('X_QUEUES_INVALID: queue list %s names no queue',
                coalesce(claim.queues::text, 'NULL')),
            HINT = 'Pass the queues to serve, such as ARRAY[''default''].';
    END IF;
    PERFORM x_jobs._require_worker(
        claim.worker, 'Pass an id unique to the worker process, such as host:pid:random.'
    );
    PERFORM x_jobs._require_lease(
        claim.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    IF claim.qty IS NULL OR claim.qty < 1 OR claim.qty > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: qty %s is outside 1..1000',
                coalesce(claim.qty::text, 'NULL')),
            HINT = 'Pass how many jobs the worker has free slots for, from 1 to 1000.';
    END IF;
    -- READ UNCOMMITTED runs as READ COMMITTED in PostgreSQL, so only these two are refused.
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: claim cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call claim in its own READ COMMITTED transaction (autocommit).';
    END IF;

    -- A queue named twice would be two scans over one queue, and rows this statement locked are
    -- not skipped by itself: the repeat would spend slots on rows already picked.
    v_queues := ARRAY(
        SELECT DISTINCT q.queue
        FROM unnest(claim.queues) AS q (queue)
        WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = q.queue)
    );

    WHILE v_pass < 3 AND v_got < claim.qty AND pg_catalog.cardinality(v_queues) > 0 LOOP
        v_pass := v_pass + 1;
        v_want := claim.qty - v_got;
        v_granted := NULL;

        SELECT count(*)::integer,
               coalesce(pg_catalog.array_agg(c.id) FILTER (
                   WHERE NOT c.exhausted AND (c.lapsed OR c.concurrency_key IS NULL)), '{}'),
               coalesce(pg_catalog.array_agg(c.at) FILTER (
                   WHERE NOT c.exhausted AND (c.lapsed OR c.concurrency_key IS NULL)), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (WHERE c.exhausted), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (
                   WHERE NOT c.lapsed AND c.concurrency_key IS NOT NULL), '{}'),
               coalesce(pg_catalog.array_agg(DISTINCT c.concurrency_key) FILTER (
                   WHERE NOT c.lapsed AND c.concurrency_key IS NOT NULL), '{}'),
               coalesce(pg_catalog.array_agg(c.id) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.attempt) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.claimed_by) FILTER (WHERE c.lapsed), '{}')
        INTO v_picked, v_take, v_take_at, v_bury, v_keyed, v_keys, v_lapsed, v_lapsed_attempt,
             v_lapsed_worker
        FROM (
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'ready'
                    AND j.run_at <= v_now
                    AND j.id <> ALL (v_seen)
                    AND (j.concurrency_key IS NULL OR j.concurrency_limit > (
                        SELECT count(*) FROM x_jobs.job AS h
                        WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state IN ('delayed', 'suspended')
                    AND j.run_at <= v_now
                    AND j.id <> ALL (v_seen)
                    AND (j.concurrency_key IS NULL OR j.concurrency_limit > (
                        SELECT count(*) FROM x_jobs.job AS h
                        WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'))
                ORDER BY j.run_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, TRUE AS lapsed,
                       j.attempt >= j.max_attempts AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'running'
                    AND j.visible_at <= v_now
                ORDER BY j.visible_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            ORDER BY 2, 3, 1
            LIMIT v_want
        ) AS c;

        EXIT WHEN v_picked = 0;

        IF pg_catalog.cardinality(v_keyed) > 0 THEN
            -- Serialize the claimers of each key, then count its running rows afresh: this
            -- statement's snapshot is taken after the locks, so it sees every claim that held
            -- them before. The rows not granted stay locked, unclaimed, until this call ends.
            -- The first pass waits for its keys, in key order. A later pass still holds the keys
            -- of the earlier ones, so waiting then, for a key below one of those, could close a
            -- cycle with a claimer that holds it and waits for ours (two claims deadlocked so):
            -- it only tries, and leaves the rows of a key it cannot have now to other claims.
            IF v_pass = 1 THEN
                PERFORM pg_catalog.pg_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
                FROM unnest(v_keys) AS k (key)
                ORDER BY k.key;
            ELSE
                v_busy_keys := ARRAY(
                    SELECT k.key
                    FROM unnest(v_keys) AS k (key)
                    WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
                );
            END IF;

            v_granted := pg_catalog.cardinality(v_take);
            SELECT v_take || coalesce(pg_catalog.array_agg(g.id), '{}'),
                   v_take_at || coalesce(pg_catalog.array_agg(g.at), '{}')
            INTO v_take, v_take_at
            FROM (
                    SELECT j.id, j.ctid AS at,
                           pg_catalog.row_number() OVER (
                               PARTITION BY j.concurrency_key ORDER BY j.priority, j.run_at, j.id
                           ) AS rank,
                           j.concurrency_limit - (
                               SELECT count(*) FROM x_jobs.job AS h
                               WHERE h.concurrency_key = j.concurrency_key AND h.state = 'running'
                           ) AS room
                    FROM x_jobs.job AS j
                    WHERE j.id = ANY (v_keyed)
                        AND j.concurrency_key <> ALL (v_busy_keys)
                ) AS g
            WHERE g.rank <= g.room;
            v_granted := pg_catalog.cardinality(v_take) - v_granted;
            v_seen := v_seen || v_keyed;
        END IF;

        IF pg_catalog.cardinality(v_lapsed) = 0 THEN
            -- The common case, nothing lapsed and so nothing to bury, log or count: one update.
            -- By ctid: this call holds the picked rows locked, so they cannot have moved, and a
            -- TID scan reaches each at once where `id = ANY` descends the primary key per row.
            RETURN QUERY
            WITH claimed AS (
                UPDATE x_jobs.job AS j
                SET state = 'running',
                    attempt = j.attempt + 1,
                    claims = j.claims + 1,
                    claimed_by = claim.worker,
                    visible_at = v_now + claim.lease,
                    started_at = v_now,
                    updated_at = v_now
                WHERE j.ctid = ANY (v_take_at)
                RETURNING j.*
            )
            SELECT * FROM claimed AS c ORDER BY c.priority, c.run_at, c.id;
        ELSE
            -- Buried rows are answered after every claimed one, so they wait for the last pass.
            WITH buried AS (
                UPDATE x_jobs.job AS j
                SET state = CASE WHEN j.dead_letter THEN 'dead' ELSE 'failed' END::x_jobs.job_state,
                    visible_at = NULL,
                    claimed_by = NULL,
                    last_error = 'lease lapsed on the final attempt',
                    last_error_stack = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_bury)
                RETURNING j.*
            ),
            -- A lapsed lease is an attempt that ended without a word: keep it in the error history.
            lapse_logged AS (
                INSERT INTO x_jobs.job_error (job_id, attempt, failed_at, worker, error)
                SELECT l.id, l.attempt, v_now, l.worker,
                       'lease lapsed: the worker stopped heartbeating before it settled the job'
                FROM unnest(v_lapsed, v_lapsed_attempt, v_lapsed_worker) AS l (id, attempt, worker)
            ),
            counted AS (
                INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, retried, failed, dead)
                SELECT l.name, 60, x_jobs._minute(v_now), x_jobs._shard(),
                       count(*) FILTER (WHERE l.state = 'running'),
                       count(*) FILTER (WHERE l.state = 'failed'),
                       count(*) FILTER (WHERE l.state = 'dead')
                FROM (
                    SELECT b.name, b.state FROM buried AS b
                    UNION ALL
                    SELECT j.name, j.state FROM x_jobs.job AS j
                    WHERE j.id = ANY (v_lapsed) AND NOT j.id = ANY (v_bury)
                ) AS l
                GROUP BY l.name
                ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
                SET retried = c.retried + excluded.retried,
                    failed = c.failed + excluded.failed,
                    dead = c.dead + excluded.dead
            ),
            claimed AS (
                UPDATE x_jobs.job AS j
                SET state = 'running',
                    attempt = j.attempt + 1,
                    claims = j.claims + 1,
                    claimed_by = claim.worker,
                    visible_at = v_now + claim.lease,
                    started_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_take)
                RETURNING j.*
            )
            SELECT (SELECT pg_catalog.array_agg(ROW(c.*)::x_jobs.job ORDER BY c.priority, c.run_at, c.id) FROM claimed AS c),
                   (SELECT pg_catalog.array_agg(ROW(b.*)::x_jobs.job) FROM buried AS b)
            INTO v_claimed, v_buried;

            RETURN QUERY SELECT * FROM unnest(v_claimed);
            v_buried_all := v_buried_all || coalesce(v_buried, ARRAY[]::x_jobs.job[]);
        END IF;

        v_got := v_got + pg_catalog.cardinality(v_take);
        -- Another pass only when this one spent slots on rows it could not hand out (buried, or
        -- denied by a key), since that may have freed a key or left due rows behind; a pick that
        -- came back short with nothing spent means the queues are drained.
        EXIT WHEN v_picked < v_want
            AND pg_catalog.cardinality(v_bury) = 0
            AND pg_catalog.cardinality(v_keyed) = coalesce(v_granted, 0);
    END LOOP;

    RETURN QUERY SELECT * FROM unnest(v_buried_all);
END
$$;

-- The heartbeat: push the lease of the running rows `worker` holds among `ids` to now + lease.
-- Answers the ids still held; an id missing from the answer was lost (lapsed and re-claimed,
-- cancelled, or settled), and its body should stop.
CREATE OR REPLACE FUNCTION x_jobs.extend_lease(ids bigint[], worker text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_worker(extend_lease.worker, 'Pass the id the worker claimed with.');
    PERFORM x_jobs._require_lease(
        extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );

    RETURN QUERY
    UPDATE x_jobs.job AS j
    SET visible_at = v_now + extend_lease.lease,
        updated_at = v_now
    WHERE j.id = ANY (extend_lease.ids)
        AND j.state::text = 'running' -- by id only: see job_running_idx
        AND j.claimed_by = extend_lease.worker
    RETURNING j.id;
END
$$;

-- Hand `relay` up to `qty` messages to deliver, for `lease`: the oldest due pending messages
-- that head their key (nothing earlier of the key is pending, and nothing of the key is in
-- flight: a redriven or late-committed message with a lower id waits for the one out), and the
-- messages whose lease lapsed (a relay that died; dead instead on their final attempt). Locked
-- rows are skipped, so relays never wait for each other. `topics` restricts the claim to the
-- topics this relay has sinks for (NULL: all).
--
-- The keys of the picked messages are then locked and checked again under a fresh snapshot:
-- two relays claiming at once cannot both take a message of one key, whatever order the
-- producers committed in. A message of a key whose check fails stays locked, unclaimed, until
-- the call ends.
--
-- Each arm walks its partial index in order and reads about `qty` entries plus the messages of
-- keys that are busy: delivered messages are in neither index. Answers the messages in the
-- order to deliver them, with the attempt this delivery is.
CREATE OR REPLACE FUNCTION x_jobs.relay_outbox(
    relay text,
    qty integer DEFAULT 100,
    lease interval DEFAULT '30 seconds',
    topics text[] DEFAULT NULL
)
RETURNS TABLE (id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)
LANGUAGE plpgsql
VOLATILE
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

    SELECT coalesce(pg_catalog.array_agg(p.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT p.key) FILTER (WHERE p.key IS NOT NULL), '{}'),
           coalesce(pg_catalog.bool_or(p.lapsed), FALSE)
    INTO v_picked, v_keys, v_lapsed
    FROM (
        WITH due AS (
            SELECT o.id, o.key, o.available_at
            FROM x_jobs.outbox AS o
            WHERE o.state = 'pending'
                AND o.available_at <= v_now
                AND (relay_outbox.topics IS NULL OR o.topic = ANY (relay_outbox.topics))
                AND (o.key IS NULL OR NOT EXISTS (
                    SELECT FROM x_jobs.outbox AS e
                    WHERE e.key = o.key
                        AND e.state IN ('pending', 'inflight')
                        AND (e.id < o.id OR e.state = 'inflight')
                ))
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
        SELECT d.id, d.key, d.available_at, FALSE AS lapsed FROM due AS d
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
            WHERE o.id = ANY (v_picked)
                AND (o.key IS NULL OR o.state = 'inflight' OR NOT EXISTS (
                    SELECT FROM x_jobs.outbox AS e
                    WHERE e.key = o.key
                        AND e.id <> o.id
                        AND e.state IN ('pending', 'inflight')
                        AND (e.id < o.id OR e.state = 'inflight')
                ))
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

-- The relay's heartbeat: push the lease of the inflight messages `relay` holds among `ids` to
-- now + lease. Answers the ids still held; a missing one was lost (its lease lapsed and another
-- relay took it, or it was settled), and its delivery's ack will find it gone. Without it a
-- delivery slower than the lease was claimed again and sent a second time while it ran.
CREATE OR REPLACE FUNCTION x_jobs.outbox_extend_lease(ids bigint[], relay text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF outbox_extend_lease.relay IS NULL OR outbox_extend_lease.relay = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ036',
            MESSAGE = pg_catalog.format('X_RELAY_INVALID: relay id %s is empty',
                coalesce(pg_catalog.quote_literal(outbox_extend_lease.relay), 'NULL')),
            HINT = 'Pass the id the relay claimed with.';
    END IF;
    PERFORM x_jobs._require_lease(
        outbox_extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    RETURN QUERY
    UPDATE x_jobs.outbox AS o
    SET available_at = x_jobs.now() + outbox_extend_lease.lease
    WHERE o.id = ANY (outbox_extend_lease.ids)
        AND o.state = 'inflight'
        AND o.relay = outbox_extend_lease.relay
    RETURNING o.id;
END
$$;
