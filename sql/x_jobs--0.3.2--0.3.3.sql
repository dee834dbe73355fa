\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.3'" to load this file. \quit

-- 0.3.2 -> 0.3.3: what every function takes and answers is unchanged, but for new refusals.
--   * The test clock (x_jobs.fake_now) is honoured only in a session whose login role is a
--     superuser; any other session that sets it gets XJ038 X_CLOCK_REFUSED from the first call
--     that reads the clock (now() or _clock()). Any role can set a custom setting, and a clock
--     moved forward made every other worker's lease look lapsed to the mover's claims.
--   * step_wait refuses REPEATABLE READ and SERIALIZABLE (XJ022), as publish does: its event
--     lookup must see every publish that committed before its lock, and a snapshot taken at
--     the transaction's start missed one that came while the lock was awaited (the run slept
--     past its event).
--   * claim no longer waits for a concurrency key's lock in its second or third pass: those
--     passes hold the keys of the first, and waiting for a lower key could close a cycle with
--     another claim (40P01, one claim aborted). They try the lock and leave a busy key's rows.
--   * fail computes the backoff in seconds: base times 2^40 overflowed an interval once the
--     base was above 8.4 s ("interval out of range"), and such a job could not fail at all.
--   * outbox_put_many refuses (XJ035) a message with a field outbox_put has no parameter for
--     (it dropped it: a misspelt key put the message unordered), a key that is not a string,
--     and a max_attempts that is not a whole number (a bare cast error before).
--   * relay_outbox makes a message dead when its lease lapses on its final attempt, as claim
--     buries a job: it handed such a message out again and again, past max_attempts, holding
--     its key back each time.
--   * purge, purge_outbox and outbox_redrive keep to their batch size. They picked the batch
--     with `id IN (SELECT ... LIMIT n FOR UPDATE ...)`, which the planner may rescan per row;
--     each rescan passed over the rows the statement had already changed and locked the next
--     ones, so that one call could take every eligible row. The batch is now one array.

CREATE FUNCTION x_jobs._fake_now()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_setting text := pg_catalog.current_setting('x_jobs.fake_now', true);
BEGIN
    IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user), FALSE) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ038',
            MESSAGE = pg_catalog.format('X_CLOCK_REFUSED: x_jobs.fake_now is set to %L, and role %I may not move the clock',
                v_setting, session_user),
            HINT = 'x_jobs.fake_now is a test clock for superuser sessions: RESET x_jobs.fake_now (or ALTER ROLE ... RESET).';
    END IF;
    RETURN v_setting::timestamptz;
END
$$;

REVOKE ALL ON FUNCTION x_jobs._fake_now() FROM public;
GRANT EXECUTE ON FUNCTION x_jobs._fake_now() TO x_jobs_producer, pg_monitor;

CREATE OR REPLACE FUNCTION x_jobs.now()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.now()
        ELSE x_jobs._fake_now()
    END
$$;

CREATE OR REPLACE FUNCTION x_jobs._clock()
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.clock_timestamp()
        ELSE x_jobs._fake_now()
    END
$$;

CREATE OR REPLACE FUNCTION x_jobs.error_codes()
RETURNS TABLE (sqlstate text, code text, meaning text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES
        ('XJ001', 'X_NAME_INVALID', 'A job name is missing, empty or longer than 200 characters.'),
        ('XJ002', 'X_QUEUE_INVALID', 'A queue name is empty or longer than 200 characters.'),
        ('XJ003', 'X_PAYLOAD_TOO_LARGE', 'An input, output, event or message payload is larger than x_jobs.max_payload_bytes.'),
        ('XJ004', 'X_MAX_ATTEMPTS_INVALID', 'max_attempts is below 1.'),
        ('XJ005', 'X_PRIORITY_INVALID', 'priority is outside -32768..32767.'),
        ('XJ006', 'X_TENANT_INVALID', 'tenant_id is empty.'),
        ('XJ007', 'X_CONCURRENCY_INVALID', 'A concurrency limit is below 1 or given without a key.'),
        ('XJ008', 'X_BACKOFF_INVALID', 'backoff_base or backoff_max is negative, or base exceeds max.'),
        ('XJ009', 'X_JOBS_INVALID', 'enqueue_many got something other than an array of request objects (receive_webhook: a request that is not an object).'),
        ('XJ010', 'X_QUEUES_INVALID', 'The queue list is missing, empty or holds an empty name.'),
        ('XJ011', 'X_WORKER_INVALID', 'A worker id is missing or empty.'),
        ('XJ012', 'X_LEASE_INVALID', 'A lease is missing or not positive.'),
        ('XJ013', 'X_QTY_INVALID', 'qty or a page size is outside 1..1000 (outbox_redrive max_rows: 1..100000).'),
        ('XJ014', 'X_JOB_NOT_FOUND', 'No job has this id.'),
        ('XJ015', 'X_JOB_NOT_RETRYABLE', 'retry was asked of a row that is live or done.'),
        ('XJ016', 'X_STATE_UNKNOWN', 'A state name is not one of the job states.'),
        ('XJ017', 'X_IDEMPOTENCY_CONFLICT', 'A live row already holds the idempotency key.'),
        ('XJ018', 'X_DELAY_INVALID', 'A retry delay is negative.'),
        ('XJ019', 'X_TTL_INVALID', 'A worker announce ttl is missing or not positive.'),
        ('XJ020', 'X_RETENTION_INVALID', 'A purge or rollup_counters got a missing or negative age, or a batch below 1.'),
        ('XJ021', 'X_OUTPUTS_INVALID', 'complete_many got a different number of outputs than ids.'),
        ('XJ022', 'X_ISOLATION_UNSUPPORTED', 'claim, publish, step_wait, relay_outbox or receive_webhook ran in a REPEATABLE READ or SERIALIZABLE transaction.'),
        ('XJ023', 'X_ERROR_MISSING', 'fail or outbox_nack was called without an error message.'),
        ('XJ024', 'X_STEP_INVALID', 'A step name is missing, empty or longer than 200 characters.'),
        ('XJ025', 'X_TIMEOUT_INVALID', 'A sleep is missing or negative, or a wait timeout is negative.'),
        ('XJ026', 'X_JOB_NOT_HELD', 'A step function was called by a worker that does not hold the job.'),
        ('XJ027', 'X_STEP_CONFLICT', 'A step name is already used by a step of another kind in the run.'),
        ('XJ028', 'X_EVENT_INVALID', 'An event name is missing, empty or longer than 200 characters.'),
        ('XJ029', 'X_MATCH_INVALID', 'A wait''s match is not a JSON object.'),
        ('XJ030', 'X_JOB_HELD', 'resolve_step was asked of a job that a worker holds (running).'),
        ('XJ031', 'X_STEP_NOT_FOUND', 'The job has no step of this name.'),
        ('XJ032', 'X_STEP_NOT_WAITING', 'resolve_step was asked of a step that is not waiting.'),
        ('XJ033', 'X_PROGRESS_INVALID', 'Progress is negative, past its total, or its note is too long.'),
        ('XJ034', 'X_TOPIC_INVALID', 'An outbox topic is missing, empty or longer than 200 characters.'),
        ('XJ035', 'X_MESSAGE_INVALID', 'An outbox message has no payload, headers that are not an object of strings, an unknown field or one of the wrong type, or is not an object.'),
        ('XJ036', 'X_RELAY_INVALID', 'A relay id is missing or empty.'),
        ('XJ037', 'X_WEBHOOK_INVALID', 'receive_webhook got no source or no webhook id.'),
        ('XJ038', 'X_CLOCK_REFUSED', 'x_jobs.fake_now (the test clock) is set in a session whose login role is not a superuser.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

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
    IF claim.lease IS NULL OR claim.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(claim.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;
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
               coalesce(pg_catalog.array_agg(c.id) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.attempt) FILTER (WHERE c.lapsed), '{}'),
               coalesce(pg_catalog.array_agg(c.claimed_by) FILTER (WHERE c.lapsed), '{}')
        INTO v_picked, v_take, v_take_at, v_bury, v_keyed, v_lapsed, v_lapsed_attempt, v_lapsed_worker
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
                FROM (
                    SELECT DISTINCT j.concurrency_key AS key
                    FROM x_jobs.job AS j
                    WHERE j.id = ANY (v_keyed)
                    ORDER BY 1
                ) AS k;
            ELSE
                v_busy_keys := ARRAY(
                    SELECT k.key
                    FROM (
                        SELECT DISTINCT j.concurrency_key AS key
                        FROM x_jobs.job AS j
                        WHERE j.id = ANY (v_keyed)
                        ORDER BY 1
                    ) AS k
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

CREATE OR REPLACE FUNCTION x_jobs.fail(
    id bigint,
    worker text,
    error text,
    error_stack text DEFAULT NULL,
    retry_delay interval DEFAULT NULL,
    retryable boolean DEFAULT TRUE
)
RETURNS x_jobs.job_state
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.job_state;
    v_queue text;
BEGIN
    PERFORM x_jobs._require_worker(fail.worker, 'Pass the id the worker claimed with.');
    IF fail.error IS NULL OR fail.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message', fail.id),
            HINT = 'Pass what went wrong as error, such as the exception''s message.';
    END IF;
    IF fail.retry_delay < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: retry delay %s is negative', fail.retry_delay),
            HINT = 'Pass a delay of zero or more, or NULL for the job''s backoff policy.';
    END IF;

    WITH failed AS (
        UPDATE x_jobs.job AS j
        SET state = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN
                    CASE WHEN j.dead_letter THEN 'dead' ELSE 'failed' END
                WHEN r.delay > interval '0' THEN 'delayed'
                ELSE 'ready'
            END::x_jobs.job_state,
            run_at = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN j.run_at
                ELSE v_now + r.delay
            END,
            finished_at = CASE
                WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN v_now
            END,
            visible_at = NULL,
            claimed_by = NULL,
            last_error = fail.error,
            last_error_stack = fail.error_stack,
            updated_at = v_now
        FROM (
            -- In seconds: an interval times 2^40 overflows ("interval out of range") once the base
            -- is above 8.4 s, and a job that could not fail would run until its lease lapsed.
            SELECT coalesce(
                fail.retry_delay,
                pg_catalog.make_interval(secs => least(
                    extract(EPOCH FROM k.backoff_max)::float8,
                    extract(EPOCH FROM k.backoff_base)::float8 * pg_catalog.power(2, least(k.attempt - 1, 60))
                ) * (0.5 + pg_catalog.random() / 2))
            ) AS delay
            FROM x_jobs.job AS k
            WHERE k.id = fail.id
        ) AS r
        WHERE j.id = fail.id
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = fail.worker
        RETURNING j.id, j.name, j.queue, j.state, j.attempt, j.started_at
    ),
    logged AS (
        INSERT INTO x_jobs.job_error (job_id, attempt, failed_at, worker, error, error_stack)
        SELECT f.id, f.attempt, v_now, fail.worker, fail.error, fail.error_stack
        FROM failed AS f
    ),
    counted AS (
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, retried, failed, dead, run_ms)
        SELECT f.name, 60, x_jobs._minute(v_now), x_jobs._shard(),
               (f.state IN ('ready', 'delayed'))::integer,
               (f.state = 'failed')::integer,
               (f.state = 'dead')::integer,
               (extract(EPOCH FROM v_now - f.started_at) * 1000)::bigint
        FROM failed AS f
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET retried = c.retried + excluded.retried,
            failed = c.failed + excluded.failed,
            dead = c.dead + excluded.dead,
            run_ms = c.run_ms + excluded.run_ms
    )
    SELECT f.state, f.queue INTO v_state, v_queue FROM failed AS f;

    -- A retry due at once is work for the queue now: wake it like an enqueue does.
    IF v_state = 'ready' THEN
        PERFORM pg_catalog.pg_notify('x_jobs', v_queue);
    END IF;
    RETURN v_state;
END
$$;

CREATE OR REPLACE FUNCTION x_jobs.step_wait(
    id bigint,
    worker text,
    step text,
    event text,
    event_key text DEFAULT NULL,
    match jsonb DEFAULT NULL,
    timeout interval DEFAULT NULL,
    since timestamptz DEFAULT NULL
)
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
    v_reached timestamptz;
    v_event record;
BEGIN
    -- The event lookup below must see every publish that committed before the lock: a snapshot
    -- taken at the transaction's start would miss one that came while the lock was awaited, and
    -- that publish found no step to wake, so the run would sleep past its event.
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: step_wait cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Wait from a READ COMMITTED transaction (the default).';
    END IF;
    v_job := x_jobs._require_held(step_wait.id, step_wait.worker, coalesce(step_wait.step, ''));
    PERFORM x_jobs._require_event(step_wait.event);
    IF step_wait.timeout < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s is negative', step_wait.timeout),
            HINT = 'Pass a timeout of zero or more, or NULL to wait for as long as it takes.';
    END IF;
    IF step_wait.match IS NOT NULL AND pg_catalog.jsonb_typeof(step_wait.match) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ029',
            MESSAGE = pg_catalog.format('X_MATCH_INVALID: match %s is not a JSON object', step_wait.match),
            HINT = 'Pass an object that the payload must contain, such as ''{"order": 42}''.';
    END IF;

    -- See "The wait and the publish": after this lock, every publish of this event that came
    -- first has committed, and every one that comes later waits for this transaction.
    IF step_wait.event_key IS NULL THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061702, pg_catalog.hashtext(step_wait.event));
    ELSE
        PERFORM pg_catalog.pg_advisory_xact_lock(2024061703,
            pg_catalog.hashtext(step_wait.event || E'\x1f' || step_wait.event_key));
    END IF;
    v_reached := x_jobs._clock();

    INSERT INTO x_jobs.step AS s (
        job_id, name, kind, created_at, event, event_key, match, since, timeout_at, status, attempt
    )
    VALUES (
        step_wait.id, step_wait.step, 'wait', v_reached, step_wait.event, step_wait.event_key,
        step_wait.match, least(v_reached, coalesce(step_wait.since, v_reached)),
        v_now + step_wait.timeout, 'waiting', v_job.attempt
    )
    ON CONFLICT (job_id, name, compensation) DO NOTHING;

    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
    FOR UPDATE;
    IF v_step.kind <> 'wait' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a wait',
                step_wait.step, step_wait.id, v_step.kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RETURN v_step;
    END IF;

    SELECT e.id, e.payload INTO v_event
    FROM x_jobs.event AS e
    WHERE e.name = v_step.event
        AND (v_step.event_key IS NULL OR e.key = v_step.event_key)
        AND (v_step.match IS NULL OR e.payload @> v_step.match)
        AND e.published_at >= v_step.since
    ORDER BY e.published_at, e.id
    LIMIT 1;

    IF v_event.id IS NOT NULL THEN
        UPDATE x_jobs.step AS s
        SET status = 'done', output = v_event.payload, event_id = v_event.id,
            resolved_by = 'event', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSIF v_step.timeout_at <= v_now THEN
        UPDATE x_jobs.step AS s
        SET status = 'failed',
            error = pg_catalog.format('X_STEP_TIMEOUT: no event %L%s came before %s', s.event,
                CASE WHEN s.event_key IS NULL THEN '' ELSE pg_catalog.format(' with key %L', s.event_key) END, s.timeout_at),
            resolved_by = 'timeout', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSE
        PERFORM x_jobs._suspend(step_wait.id, coalesce(v_step.timeout_at, 'infinity'));
    END IF;
    RETURN v_step;
END
$$;

CREATE OR REPLACE FUNCTION x_jobs.outbox_put_many(messages jsonb)
RETURNS TABLE (ord integer, id bigint)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_bad record;
BEGIN
    IF outbox_put_many.messages IS NULL OR pg_catalog.jsonb_typeof(outbox_put_many.messages) <> 'array'
        OR EXISTS (
            SELECT FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
            WHERE pg_catalog.jsonb_typeof(m.value) <> 'object'
        ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: messages %s are not an array of objects',
                pg_catalog.left(coalesce(outbox_put_many.messages::text, 'NULL'), 200)),
            HINT = 'Pass a JSON array of objects such as [{"topic": "t", "payload": {}, "key": "k"}].';
    END IF;

    -- The first message with a field outbox_put has no parameter for (a misspelt "key" would put
    -- the message unordered), or a key or max_attempts of the wrong JSON type.
    SELECT m.ord, m.value,
           m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] AS unknown
    INTO v_bad
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    WHERE m.value - ARRAY['topic', 'payload', 'key', 'headers', 'max_attempts'] <> '{}'::jsonb
        OR pg_catalog.jsonb_typeof(m.value -> 'key') NOT IN ('string', 'null')
        OR pg_catalog.jsonb_typeof(m.value -> 'max_attempts') NOT IN ('number', 'null')
        OR (pg_catalog.jsonb_typeof(m.value -> 'max_attempts') = 'number'
            AND ((m.value ->> 'max_attempts')::numeric % 1 <> 0
                OR abs((m.value ->> 'max_attempts')::numeric) > 2147483647))
    ORDER BY m.ord
    LIMIT 1;
    IF FOUND AND v_bad.unknown <> '{}'::jsonb THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: message %s has an unknown field %L', v_bad.ord,
                (SELECT min(f.name) FROM pg_catalog.jsonb_object_keys(v_bad.unknown) AS f (name))),
            HINT = 'A message has topic, payload, key, headers and max_attempts: check the spelling of the others.';
    ELSIF FOUND AND pg_catalog.jsonb_typeof(v_bad.value -> 'key') NOT IN ('string', 'null') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: key %s of message %s is not a string', v_bad.value -> 'key', v_bad.ord),
            HINT = 'Pass the key as a string, such as "order-42", or leave it out.';
    ELSIF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ035',
            MESSAGE = pg_catalog.format('X_MESSAGE_INVALID: max_attempts %s of message %s is not a whole number of attempts',
                v_bad.value -> 'max_attempts', v_bad.ord),
            HINT = 'Pass max_attempts as a whole number of 1 or more, or leave it out for 10.';
    END IF;

    PERFORM x_jobs._require_message(m.value ->> 'topic', m.value -> 'payload', m.value -> 'headers',
        (m.value ->> 'max_attempts')::integer)
    FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value);

    RETURN QUERY
    WITH input AS (
        SELECT m.ord::integer AS ord, m.value
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) WITH ORDINALITY AS m (value, ord)
    ),
    put AS (
        INSERT INTO x_jobs.outbox AS o (created_at, max_attempts, topic, key, headers, payload, state, available_at)
        SELECT v_now, coalesce((i.value ->> 'max_attempts')::integer, 10), i.value ->> 'topic',
               i.value ->> 'key', coalesce(i.value -> 'headers', '{}'), i.value -> 'payload', 'pending', v_now
        FROM input AS i
        ORDER BY i.ord
        RETURNING o.id
    )
    -- Identity values are drawn in insert order, which is input order: rank them back.
    SELECT (pg_catalog.row_number() OVER (ORDER BY p.id))::integer, p.id FROM put AS p ORDER BY p.id;

    PERFORM x_jobs._notify('x_jobs_outbox', t.topic)
    FROM (
        SELECT DISTINCT m.value ->> 'topic' AS topic
        FROM pg_catalog.jsonb_array_elements(outbox_put_many.messages) AS m (value)
    ) AS t;
END
$$;

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
    IF relay_outbox.lease IS NULL OR relay_outbox.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(relay_outbox.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than a delivery takes, such as ''30 seconds''.';
    END IF;
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

-- The three batch takers: each picks its batch once, as an array.
CREATE OR REPLACE FUNCTION x_jobs.outbox_redrive(
    ids bigint[] DEFAULT NULL,
    topic text DEFAULT NULL,
    max_rows integer DEFAULT 1000
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_count bigint;
    v_topics text[];
BEGIN
    IF outbox_redrive.max_rows IS NULL OR outbox_redrive.max_rows < 1 OR outbox_redrive.max_rows > 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..100000',
                coalesce(outbox_redrive.max_rows::text, 'NULL')),
            HINT = 'Redrive in batches of up to 100000, and call again for more.';
    END IF;

    -- Picked once, as an array: see purge (a rescan would pass over the rows already redriven
    -- and take more than max_rows).
    WITH redriven AS (
        UPDATE x_jobs.outbox AS o
        SET state = 'pending', attempt = 0, available_at = v_now, relay = NULL
        WHERE o.id = ANY (ARRAY(
            SELECT d.id FROM x_jobs.outbox AS d
            WHERE d.state = 'dead'
                AND (outbox_redrive.ids IS NULL OR d.id = ANY (outbox_redrive.ids))
                AND (outbox_redrive.topic IS NULL OR d.topic = outbox_redrive.topic)
            ORDER BY d.id
            LIMIT outbox_redrive.max_rows
            FOR UPDATE
        ))
        RETURNING o.topic
    )
    SELECT count(*), pg_catalog.array_agg(DISTINCT r.topic) INTO v_count, v_topics FROM redriven AS r;

    PERFORM pg_catalog.pg_notify('x_jobs_outbox', t.topic) FROM unnest(v_topics) AS t (topic);
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION x_jobs.purge_outbox(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('outbox', purge_outbox.older_than, purge_outbox.batch_size,
        'such as ''7 days''');

    -- Picked once, as an array: see purge.
    DELETE FROM x_jobs.outbox AS o
    WHERE o.id = ANY (ARRAY(
        SELECT k.id
        FROM x_jobs.outbox AS k
        WHERE k.state = 'delivered'
            AND k.delivered_at < x_jobs.now() - purge_outbox.older_than
        ORDER BY k.id
        LIMIT purge_outbox.batch_size
        FOR UPDATE SKIP LOCKED
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

CREATE OR REPLACE FUNCTION x_jobs.purge(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_cutoff timestamptz;
    v_ids bigint[];
BEGIN
    IF purge.older_than IS NULL OR purge.older_than < interval '0'
        OR purge.batch_size IS NULL OR purge.batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of %s',
                coalesce(purge.older_than::text, 'NULL'), coalesce(purge.batch_size::text, 'NULL')),
            HINT = 'Pass an age of zero or more, such as ''7 days'', and a batch size of 1 or more.';
    END IF;
    v_cutoff := x_jobs.now() - purge.older_than;

    -- The batch is picked once, as an array: under `id IN (subquery)` the planner may rescan the
    -- subquery per row, and each rescan skips the rows this statement already deleted and locks
    -- the next ones, so that one call deleted every eligible row whatever batch_size said.
    WITH gone AS (
        DELETE FROM x_jobs.job AS j
        WHERE j.id = ANY (ARRAY(
            SELECT k.id
            FROM x_jobs.job AS k
            WHERE k.state IN ('done', 'failed', 'dead', 'cancelled')
                AND k.finished_at < v_cutoff
            ORDER BY k.id
            LIMIT purge.batch_size
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING j.id
    )
    SELECT coalesce(pg_catalog.array_agg(g.id), '{}') INTO v_ids FROM gone AS g;

    DELETE FROM x_jobs.job_error AS e WHERE e.job_id = ANY (v_ids);
    DELETE FROM x_jobs.step AS s WHERE s.job_id = ANY (v_ids);
    RETURN pg_catalog.cardinality(v_ids)::bigint;
END
$$;

CREATE OR REPLACE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.3.3'::text
$$;
