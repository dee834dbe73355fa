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
--   * A session's own x_jobs.max_payload_bytes counts only up to 1 MiB, and above it only up
--     to what ALTER DATABASE or ALTER ROLE set: any role can SET a custom setting, and with
--     enqueue running as its owner a producer could lift the limit for itself.
--   * publish, step_record, resolve_step and the outbox measure a payload uncompressed
--     (_payload_bytes): one read from a table arrives compressed, and 80 MB of one repeated
--     letter passed publish's limit as 0.9 MB.
--   * queue_demand counts a running row whose lease lapsed as the next claim sees it: only in
--     an unpaused queue (no claim takes one from a paused queue), whoever held it (a live
--     draining worker's lapsed rows were left out though another worker would take them).
--   * The functions a worker calls (claim, extend_lease, release, complete, complete_many,
--     fail, announce_worker, steps, step_record, step_sleep, step_wait, progress, relay_outbox,
--     outbox_ack, outbox_extend_lease, outbox_nack) run as their owner, and x_jobs_worker keeps
--     only SELECT on x_jobs.job and x_jobs.outbox: it could rewrite or delete any job, step,
--     message or worker row directly. x_jobs_admin gets directly the rights its functions (run
--     as the caller) had through x_jobs_worker.
--   * claim only tries the lock of a concurrency key, in every pass: its first pass waited,
--     stalling other claimers behind a claim in a long transaction, and deadlocked two claims
--     whose keys' hashes collided.
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

ALTER FUNCTION x_jobs.release(bigint[], text) SECURITY DEFINER;
ALTER FUNCTION x_jobs.complete(bigint, text, jsonb) SECURITY DEFINER;
ALTER FUNCTION x_jobs.complete_many(bigint[], text, jsonb[]) SECURITY DEFINER;
ALTER FUNCTION x_jobs.fail(bigint, text, text, text, interval, boolean) SECURITY DEFINER;
ALTER FUNCTION x_jobs.announce_worker(text, text[], text, boolean, interval) SECURITY DEFINER;
ALTER FUNCTION x_jobs.steps(bigint, text) SECURITY DEFINER;
ALTER FUNCTION x_jobs.step_sleep(bigint, text, text, interval) SECURITY DEFINER;
ALTER FUNCTION x_jobs.step_wait(
    bigint, text, text, text, text, jsonb, interval, timestamptz
) SECURITY DEFINER;
ALTER FUNCTION x_jobs.progress(bigint, text, double precision, double precision, text) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_ack(bigint[], text) SECURITY DEFINER;
ALTER FUNCTION x_jobs.outbox_nack(bigint, text, text, timestamptz, boolean) SECURITY DEFINER;

REVOKE UPDATE, DELETE ON x_jobs.job FROM x_jobs_worker;
REVOKE SELECT, INSERT, DELETE ON x_jobs.job_error FROM x_jobs_worker;
REVOKE SELECT ON x_jobs.queue_pause FROM x_jobs_worker;
REVOKE SELECT, INSERT, UPDATE ON x_jobs.counter FROM x_jobs_worker;
REVOKE SELECT, INSERT, UPDATE, DELETE ON x_jobs.worker FROM x_jobs_worker;
REVOKE SELECT, INSERT, UPDATE, DELETE ON x_jobs.step FROM x_jobs_worker;
REVOKE SELECT ON x_jobs.event FROM x_jobs_worker;
REVOKE UPDATE ON x_jobs.outbox FROM x_jobs_worker;
GRANT UPDATE, DELETE ON x_jobs.job TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_error TO x_jobs_admin;
GRANT SELECT, INSERT, UPDATE, DELETE ON x_jobs.counter TO x_jobs_admin;
GRANT SELECT, INSERT, DELETE ON x_jobs.queue_pause TO x_jobs_admin;
GRANT SELECT ON x_jobs.worker TO x_jobs_admin;
GRANT SELECT, UPDATE, DELETE ON x_jobs.step TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.event TO x_jobs_admin;
GRANT UPDATE, DELETE ON x_jobs.outbox TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.webhook_ledger TO x_jobs_admin;

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
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.claim(
    queues text[],
    worker text,
    lease interval DEFAULT '30 seconds',
    qty integer DEFAULT 1
)
RETURNS SETOF x_jobs.job
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
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
            -- It only tries, and leaves the rows of a key it cannot have now to other claims: a
            -- claim never waits for another claimer. Until 0.3.6 the first pass waited, in key
            -- order, which stalled every claimer of a key behind a claim made in a long
            -- transaction, and deadlocked two claims whose keys' hashes collided (the lock is
            -- taken on the hash, and text order is not hash order).
            v_busy_keys := ARRAY(
                SELECT k.key
                FROM unnest(v_keys) AS k (key)
                WHERE NOT pg_catalog.pg_try_advisory_xact_lock(2024061701, pg_catalog.hashtext(k.key))
            );

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
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.extend_lease(ids bigint[], worker text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
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
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.outbox_extend_lease(ids bigint[], relay text, lease interval DEFAULT '30 seconds')
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
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

-- The size limit for inputs and outputs, default 1 MiB, set per database or role:
-- ALTER DATABASE app SET x_jobs.max_payload_bytes = 4194304. Any role can SET a custom setting,
-- and producers enqueue through functions that run as their owner, so a session's own value
-- counts only up to 1 MiB; above it, only up to what ALTER DATABASE or ALTER ROLE set (the most
-- specific, as PostgreSQL applies them; only a superuser, or a role granted SET on it, may set
-- those). The catalog is read only for a value above 1 MiB: the common path costs nothing.
CREATE OR REPLACE FUNCTION x_jobs._max_payload_bytes()
RETURNS integer
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN s.bytes <= 1048576 THEN s.bytes
        ELSE least(s.bytes, coalesce((
            SELECT pg_catalog.split_part(c.setting, '=', 2)::integer
            FROM pg_catalog.pg_db_role_setting AS d
            CROSS JOIN LATERAL pg_catalog.unnest(d.setconfig) AS c (setting)
            WHERE d.setdatabase IN (0, (SELECT b.oid FROM pg_catalog.pg_database AS b
                                        WHERE b.datname = pg_catalog.current_database()))
                AND d.setrole IN (0, (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user))
                AND pg_catalog.split_part(c.setting, '=', 1) = 'x_jobs.max_payload_bytes'
            ORDER BY d.setrole <> 0 DESC, d.setdatabase <> 0 DESC
            LIMIT 1
        ), 1048576))
    END
    FROM (
        SELECT coalesce(
            nullif(pg_catalog.current_setting('x_jobs.max_payload_bytes', true), '')::integer, 1048576
        ) AS bytes
    ) AS s
$$;

-- A payload's size as the limit counts it: uncompressed. pg_column_size counts a value as it is
-- stored, and one read from a table can arrive compressed: 80 MB of one repeated letter passed
-- publish as 0.9 MB. A composite value holds its fields uncompressed, so a compressed payload is
-- measured inside a one-field row (less the row's 24-byte header).
CREATE FUNCTION x_jobs._payload_bytes(p_payload jsonb)
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN pg_catalog.pg_column_compression(p_payload) IS NULL THEN pg_catalog.pg_column_size(p_payload)
        ELSE pg_catalog.pg_column_size(ROW(p_payload)) - 24
    END
$$;

REVOKE ALL ON FUNCTION x_jobs._payload_bytes(jsonb) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs._payload_bytes(jsonb) TO x_jobs_worker;

-- The refusals shared by the put functions: a topic, headers that are an object, a payload.
CREATE OR REPLACE FUNCTION x_jobs._require_message(
    p_topic text, p_payload jsonb, p_headers jsonb, p_max_attempts integer
)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_topic IS NULL OR p_topic = '' OR pg_catalog.length(p_topic) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ034',
            MESSAGE = pg_catalog.format('X_TOPIC_INVALID: topic %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(p_topic), 'NULL')),
            HINT = 'Name the topic the relays route by, such as ''orders.created''.';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message of topic %L has no payload', p_topic),
            HINT = 'Pass a JSON payload (use ''null''::jsonb for a message that carries nothing).';
    END IF;
    IF x_jobs._payload_bytes(p_payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(p_payload), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For a message of topic %L.', p_topic),
            HINT = 'Put a reference to large data in the message, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF p_headers IS NOT NULL AND (pg_catalog.jsonb_typeof(p_headers) <> 'object' OR EXISTS (
        SELECT FROM pg_catalog.jsonb_each(p_headers) AS h WHERE pg_catalog.jsonb_typeof(h.value) <> 'string'
    )) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: headers %s are not an object of strings', p_headers),
            HINT = 'Pass headers as a JSON object of string values, such as ''{"x-tenant": "acme"}''.';
    END IF;
    IF p_max_attempts < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ004',
            MESSAGE = pg_catalog.format('X_MAX_ATTEMPTS_INVALID: max_attempts %s is below 1', p_max_attempts),
            HINT = 'Pass 1 or more, or NULL for the default of 10.';
    END IF;
END
$$;

-- Record the result of a run step (or, compensation => true, of the compensation of a step):
-- its output, or the error it ended with (status failed). A done step is never changed: the
-- first result recorded is the one every replay answers. A failed one is replaced by the next
-- attempt's result. Answers the status recorded now.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE OR REPLACE FUNCTION x_jobs.step_record(
    id bigint,
    worker text,
    step text,
    output jsonb DEFAULT NULL,
    error text DEFAULT NULL,
    compensation boolean DEFAULT FALSE
)
RETURNS x_jobs.step_status
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_status x_jobs.step_status;
    v_kind text;
BEGIN
    v_job := x_jobs._require_held(step_record.id, step_record.worker, coalesce(step_record.step, ''));
    IF x_jobs._payload_bytes(step_record.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(step_record.output), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For step %L of job %s.', step_record.step, step_record.id),
            HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
    END IF;

    INSERT INTO x_jobs.step AS s (
        job_id, name, compensation, kind, created_at, status, attempt, output, error,
        resolved_by, resolved_at
    )
    VALUES (
        step_record.id, step_record.step, coalesce(step_record.compensation, FALSE), 'run',
        x_jobs._clock(),
        CASE WHEN step_record.error IS NULL THEN 'done' ELSE 'failed' END::x_jobs.step_status,
        v_job.attempt, step_record.output, step_record.error, 'worker', v_now
    )
    ON CONFLICT (job_id, name, compensation) DO UPDATE
    SET status = excluded.status,
        attempt = excluded.attempt,
        output = excluded.output,
        error = excluded.error,
        resolved_at = excluded.resolved_at
    WHERE s.kind = 'run' AND s.status = 'failed'
    RETURNING s.status INTO v_status;

    IF v_status IS NOT NULL THEN
        RETURN v_status;
    END IF;
    SELECT s.status, s.kind INTO v_status, v_kind
    FROM x_jobs.step AS s
    WHERE s.job_id = step_record.id
        AND s.name = step_record.step
        AND s.compensation = coalesce(step_record.compensation, FALSE);
    IF v_kind <> 'run' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a run step',
                step_record.step, step_record.id, v_kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    RETURN v_status;
END
$$;

-- Publish an event, in the caller's transaction: it is recorded, the open waits that match it
-- are resolved with its payload, their suspended runs are due at once and their queues are
-- notified, all when the caller commits (a rollback wakes nobody). A wait matches when it names
-- this event, names no key or this key, and its `match` is contained in the payload. Answers
-- the event's id and how many runs it woke.
--
-- READ COMMITTED only: the waits registered while this publish waited for the event's lock are
-- read by a statement after it, which under a transaction snapshot would not see them.
--
-- SECURITY DEFINER: a producer publishes (records an event, resolves the waits on it, makes
-- their runs due) without any right to write jobs or steps itself. Every name in the body is
-- schema-qualified and search_path is pinned with pg_temp last.
CREATE OR REPLACE FUNCTION x_jobs.publish(event text, payload jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS TABLE (event_id bigint, woken integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_id bigint;
    v_jobs bigint[];
    v_queues text[];
BEGIN
    PERFORM x_jobs._require_event(publish.event);
    -- The key is in the events' and the waits' indexes with the name: past a btree entry's size
    -- (about 2.7 kB) an insert failed with a bare 54000. 400 characters keep both within it.
    IF pg_catalog.length(publish.key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event key %s is longer than 400 characters',
                pg_catalog.quote_literal(pg_catalog.left(publish.key, 410))),
            HINT = 'Key events with a short text, such as an order id; put the rest in the payload.';
    END IF;
    IF x_jobs._payload_bytes(publish.payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(publish.payload), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For event %L.', publish.event),
            HINT = 'Publish a reference to large data, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: publish cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Publish from a READ COMMITTED transaction (the default).';
    END IF;

    PERFORM pg_catalog.pg_advisory_xact_lock_shared(2024061702, pg_catalog.hashtext(publish.event));
    IF publish.key IS NOT NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock_shared(2024061703,
            pg_catalog.hashtext(publish.event || E'\x1f' || publish.key));
    END IF;

    INSERT INTO x_jobs.event (name, key, published_at, payload)
    VALUES (publish.event, publish.key, x_jobs._clock(), publish.payload)
    RETURNING id INTO v_id;

    -- The matching waits, locked in job order so that two publishes resolving the same steps
    -- cannot deadlock; a wait resolved meanwhile by another publish is passed over.
    WITH matched AS (
        SELECT s.job_id, s.name
        FROM x_jobs.step AS s
        WHERE s.status = 'waiting'
            AND s.event = publish.event
            AND (s.event_key IS NULL OR s.event_key = publish.key)
            AND (s.match IS NULL OR publish.payload @> s.match)
        ORDER BY s.job_id, s.name
        FOR UPDATE
    ),
    resolved AS (
        UPDATE x_jobs.step AS s
        SET status = 'done', output = publish.payload, event_id = v_id,
            resolved_by = 'event', resolved_at = v_now
        FROM matched AS m
        WHERE s.job_id = m.job_id AND s.name = m.name AND NOT s.compensation
            AND s.status = 'waiting'
        RETURNING s.job_id
    ),
    woke AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        FROM resolved AS r
        WHERE j.id = r.job_id AND j.state = 'suspended'
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(w.id), '{}'), coalesce(pg_catalog.array_agg(DISTINCT w.queue), '{}')
    INTO v_jobs, v_queues
    FROM woke AS w;

    PERFORM x_jobs._notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT v_id, pg_catalog.cardinality(v_jobs);
END
$$;

-- An operator resolves a waiting step by hand (a sleep to end now, an approval given outside the
-- system): the step is done with `output`, and its run, if suspended, is due at once. Refused
-- while a worker holds the job (its body may be about to record the step itself).
CREATE OR REPLACE FUNCTION x_jobs.resolve_step(job bigint, step text, output jsonb DEFAULT NULL)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
BEGIN
    -- The step row is locked before the job row, as publish locks them: the other order could
    -- deadlock with a publish of the same event (and abort the publisher's transaction).
    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    FOR UPDATE;
    SELECT j.* INTO v_job FROM x_jobs.job AS j WHERE j.id = resolve_step.job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(resolve_step.job::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    IF v_job.state = 'running' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ030',
            MESSAGE = pg_catalog.format('X_JOB_HELD: job %s is running on worker %L', resolve_step.job,
                v_job.claimed_by),
            HINT = 'Resolve a step while its run is suspended; wait for the worker to suspend or settle it.';
    END IF;

    IF v_step.job_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ031',
            MESSAGE = pg_catalog.format('X_STEP_NOT_FOUND: job %s has no step %L', resolve_step.job,
                coalesce(resolve_step.step, 'NULL')),
            HINT = 'List the job''s steps with `x-jobs jobs show`; a step exists once the run reached it.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ032',
            MESSAGE = pg_catalog.format('X_STEP_NOT_WAITING: step %L of job %s is %s', resolve_step.step,
                resolve_step.job, v_step.status),
            HINT = 'Only a waiting step (a sleep or a wait on an event) can be resolved.';
    END IF;
    IF x_jobs._payload_bytes(resolve_step.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(resolve_step.output), x_jobs._max_payload_bytes()),
            HINT = 'Pass a smaller output, or raise x_jobs.max_payload_bytes.';
    END IF;

    UPDATE x_jobs.step AS s
    SET status = 'done', output = resolve_step.output, resolved_by = 'operator', resolved_at = v_now
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    RETURNING s.* INTO v_step;

    IF v_job.state = 'suspended' THEN
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        WHERE j.id = resolve_step.job;
        PERFORM pg_catalog.pg_notify('x_jobs', v_job.queue);
    END IF;
    RETURN v_step;
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
-- SECURITY DEFINER: monitoring roles (pg_monitor, an autoscaler's login) get counts without
-- being able to read job inputs. It reads only; search_path is pinned.
CREATE OR REPLACE FUNCTION x_jobs.queue_demand()
RETURNS TABLE (queue text, demand bigint)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    WITH due AS (
        SELECT j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at, j.id
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.run_at <= x_jobs.now()
            AND NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue)
        UNION ALL
        SELECT j.queue, j.concurrency_key, j.concurrency_limit, j.priority, j.run_at, j.id
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.run_at <= x_jobs.now()
            AND NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue)
    ),
    busy AS (
        SELECT j.concurrency_key, count(*) AS running
        FROM x_jobs.job AS j
        WHERE j.concurrency_key IS NOT NULL AND j.state = 'running'
        GROUP BY j.concurrency_key
    )
    SELECT d.queue, count(*) AS demand
    FROM (
        SELECT u.queue FROM due AS u
        WHERE u.concurrency_key IS NULL
        UNION ALL
        SELECT k.queue
        FROM (
            SELECT u.queue, u.concurrency_limit - coalesce(b.running, 0) AS room,
                   pg_catalog.row_number() OVER (
                       PARTITION BY u.concurrency_key ORDER BY u.priority, u.run_at, u.id
                   ) AS rank
            FROM due AS u
            LEFT JOIN busy AS b ON b.concurrency_key = u.concurrency_key
            WHERE u.concurrency_key IS NOT NULL
        ) AS k
        WHERE k.rank <= k.room
        UNION ALL
        SELECT j.queue FROM x_jobs.job AS j
        WHERE j.state = 'running'
            AND CASE
                WHEN j.visible_at <= x_jobs.now()
                    THEN NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue)
                ELSE NOT EXISTS (
                    SELECT FROM x_jobs.worker AS w
                    WHERE w.id = j.claimed_by
                        AND w.draining_at IS NOT NULL
                        AND w.expires_at > x_jobs.now()
                )
            END
    ) AS d
    GROUP BY d.queue
    ORDER BY d.queue COLLATE "C"
$$;
