------------------------------------------------------------------------------------------------
-- Functions: settle
------------------------------------------------------------------------------------------------

-- Complete the running rows `worker` holds among `ids`, with outputs[i] as the output of ids[i]
-- (outputs may be NULL: no output). Answers the ids it completed; an id missing from the answer
-- was not held by this worker (lapsed and re-claimed, cancelled, settled) and is left as it is.
-- The fence: `worker` must be the caller's (x_jobs._fence: bound to the login that claimed with
-- it), else nothing is held; and with `attempts` (attempts[i] the attempt ids[i] was claimed
-- at, as the claim answered it) a row settles only at that attempt, so that a stale result of
-- an earlier attempt cannot settle the worker's newer claim of the same row.
-- The same transaction adds to the job name's counter bucket. A job enqueued with keep_done =>
-- false is deleted instead of kept as 'done', with its steps and error history: for jobs whose
-- result nobody reads, so that the table does not fill with rows only purge would delete.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.complete_many(
    ids bigint[],
    worker text,
    outputs jsonb[] DEFAULT NULL,
    attempts integer[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned once, for a batch of any size: a seek per id. A custom plan knows the batch's size,
-- and with statistics that saw few running rows (a backlog analyzed before its workers
-- started) it reads the whole table rather than seek a batch that is a tenth of it or so, and
-- settling would cost as much as the table is big.
SET plan_cache_mode = force_generic_plan
-- Rows are locked in id order, as extend_lease and release lock them: in another order a
-- worker's settlement and its heartbeat (two connections, often the same rows) could each hold
-- a row the other waits for ("deadlock detected"). The
-- ids are sorted below and the index plans keep their order; a sequential scan would lock in
-- the table's order, and it is only ever chosen for a table too small to matter; a bitmap scan
-- would lock in the table's order too.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- A bound worker settles its tenants' rows only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
    v_max_payload integer := x_jobs._max_payload_bytes();
    v_big record;
    v_ids bigint[];
    v_outputs jsonb[];
    v_keep boolean;
    v_turn integer := 0;
    v_settled bigint[];
    v_names text[];
    v_started timestamptz[];
    v_done bigint[] := ARRAY[]::bigint[];
    v_done_names text[] := ARRAY[]::text[];
    v_done_started timestamptz[] := ARRAY[]::timestamptz[];
    v_dropped bigint[] := ARRAY[]::bigint[];
    v_attempts jsonb;
BEGIN
    PERFORM x_jobs._require_worker(complete_many.worker, 'Pass the id the worker claimed with.');
    PERFORM x_jobs._require_attempts(complete_many.ids, complete_many.attempts);
    v_attempts := x_jobs._attempt_map(complete_many.ids, complete_many.attempts);
    IF complete_many.outputs IS NOT NULL
        AND pg_catalog.cardinality(complete_many.outputs) <> coalesce(pg_catalog.cardinality(complete_many.ids), 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ021',
            MESSAGE = pg_catalog.format('X_OUTPUTS_INVALID: %s outputs for %s ids',
                pg_catalog.cardinality(complete_many.outputs), coalesce(pg_catalog.cardinality(complete_many.ids), 0)),
            HINT = 'Pass one output per id, in the same order, or no outputs at all (NULL).';
    END IF;
    IF complete_many.outputs IS NOT NULL THEN
        SELECT o.id, pg_catalog.pg_column_size(o.output) AS bytes
        INTO v_big
        FROM unnest(complete_many.ids, complete_many.outputs) AS o (id, output)
        WHERE pg_catalog.pg_column_size(o.output) > v_max_payload
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ003',
                MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                    v_big.bytes, v_max_payload),
                DETAIL = pg_catalog.format('For job %s.', coalesce(v_big.id::text, 'NULL')),
                HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
        END IF;
    END IF;
    -- Another login's worker id holds nothing for this caller (checked once, not per row).
    IF NOT x_jobs._fence(complete_many.worker) THEN
        RETURN;
    END IF;

    -- In id order, the order the rows are locked in (see enable_seqscan above). Without outputs
    -- (jobs that answered nothing) the ids go as they came: `id = ANY` walks the primary key in
    -- id order itself, and the update needs no join to an output per id (together a sixth of
    -- a kept row's settle).
    IF complete_many.outputs IS NULL THEN
        v_ids := complete_many.ids;
    ELSE
        SELECT pg_catalog.array_agg(o.id ORDER BY o.id), pg_catalog.array_agg(o.output ORDER BY o.id)
        INTO v_ids, v_outputs
        FROM unnest(complete_many.ids, complete_many.outputs) AS o (id, output);
    END IF;
    -- A batch is mostly of one kind (one job's), so it is settled first the way its first job
    -- asks, kept (updated) or not (deleted), and only the ids that took no effect the other way:
    -- a row is looked up once. Trying the update first for every batch cost a deleted row a
    -- second lookup, a third of its settle.
    v_keep := coalesce((SELECT j.keep_done FROM x_jobs.job AS j WHERE j.id = v_ids[1]), TRUE);
    WHILE v_turn < 2 AND coalesce(pg_catalog.cardinality(v_ids), 0) > 0 LOOP
        v_turn := v_turn + 1;
        IF v_keep AND v_outputs IS NULL THEN
            WITH kept AS (
                UPDATE x_jobs.job AS j
                SET state = 'done',
                    output = NULL,
                    visible_at = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                WHERE j.id = ANY (v_ids)
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                    AND j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(k.id), '{}'), pg_catalog.array_agg(k.name),
                   pg_catalog.array_agg(k.started_at)
            INTO v_settled, v_names, v_started
            FROM kept AS k;
        ELSIF v_keep THEN
            WITH kept AS (
                UPDATE x_jobs.job AS j
                SET state = 'done',
                    output = o.output,
                    visible_at = NULL,
                    finished_at = v_now,
                    updated_at = v_now
                FROM unnest(v_ids, v_outputs) AS o (id, output)
                WHERE j.id = o.id
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                    AND j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(k.id), '{}'), pg_catalog.array_agg(k.name),
                   pg_catalog.array_agg(k.started_at)
            INTO v_settled, v_names, v_started
            FROM kept AS k;
        ELSE
            -- A delete writes no new row version and no index entry: about half the work of
            -- the update, and a quarter of its WAL.
            WITH dropped AS (
                DELETE FROM x_jobs.job AS j
                WHERE j.id = ANY (v_ids)
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
                    AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                    AND NOT j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(d.id), '{}'), pg_catalog.array_agg(d.name),
                   pg_catalog.array_agg(d.started_at)
            INTO v_settled, v_names, v_started
            FROM dropped AS d;
            v_dropped := v_dropped || v_settled;
        END IF;
        v_done := v_done || v_settled;
        v_done_names := v_done_names || v_names;
        v_done_started := v_done_started || v_started;
        EXIT WHEN pg_catalog.cardinality(v_settled) = pg_catalog.cardinality(v_ids);
        -- Left: the other kind, and ids this worker no longer holds (which neither way takes).
        -- Still without outputs if the batch came without (an array of NULLs would take the
        -- join, which locks in the order of the ids, unsorted then).
        SELECT pg_catalog.array_agg(o.id),
               CASE WHEN v_outputs IS NOT NULL THEN pg_catalog.array_agg(o.output) END
        INTO v_ids, v_outputs
        FROM unnest(v_ids, v_outputs) AS o (id, output)
        WHERE NOT EXISTS (SELECT FROM unnest(v_settled) AS s (id) WHERE s.id = o.id);
        v_keep := NOT v_keep;
    END LOOP;

    IF pg_catalog.cardinality(v_done) > 0 THEN
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, completed, run_ms)
        SELECT d.name, 60, x_jobs._minute(v_now), x_jobs._shard(), count(*),
               coalesce(sum((extract(EPOCH FROM v_now - d.started_at) * 1000)::bigint), 0)
        FROM unnest(v_done_names, v_done_started) AS d (name, started_at)
        GROUP BY d.name
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET completed = c.completed + excluded.completed,
            run_ms = c.run_ms + excluded.run_ms;
    END IF;
    -- What purge would delete with the rows later; only when the batch deleted some, so that
    -- settling kept jobs pays nothing for it.
    IF pg_catalog.cardinality(v_dropped) > 0 THEN
        DELETE FROM x_jobs.job_error AS e WHERE e.job_id = ANY (v_dropped);
        DELETE FROM x_jobs.step AS s WHERE s.job_id = ANY (v_dropped);
    END IF;
    RETURN QUERY SELECT unnest(v_done);
END
$$;

-- Complete one job: complete_many for a single id (with its fence; `attempt` the one the claim
-- answered). Answers true when this worker held the row (at that attempt) and it is now done,
-- false when the worker no longer held it (nothing changed).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.complete(
    id bigint,
    worker text,
    output jsonb DEFAULT NULL,
    attempt integer DEFAULT NULL
)
RETURNS boolean
LANGUAGE sql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (
        SELECT FROM x_jobs.complete_many(
            ARRAY[complete.id], complete.worker, ARRAY[complete.output], ARRAY[complete.attempt]
        )
    )
$$;

-- Fail the current attempt of a running row `worker` holds. With attempts left (and retryable)
-- the row waits out its backoff: retry_delay when given, else the row's exponential policy,
-- min(backoff_max, backoff_base * 2^(attempt - 1)), with equal jitter (a random half of it
-- added to the other half) so that a crowd failing together does not retry together. With no
-- attempts left, or retryable false, it settles dead, or failed for a job that wants no dead
-- letters. Answers the state the row is in now, or NULL when the worker no longer held it
-- (nothing changed): as complete_many, `worker` must be the caller's (x_jobs._fence), and with
-- `attempt` the row must be at that attempt. Every failed attempt is kept in x_jobs.job_error.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.fail(
    id bigint,
    worker text,
    error text,
    error_stack text DEFAULT NULL,
    retry_delay interval DEFAULT NULL,
    retryable boolean DEFAULT TRUE,
    attempt integer DEFAULT NULL
)
RETURNS x_jobs.job_state
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- A bound worker settles its tenants' rows only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
    v_state x_jobs.job_state;
    v_queue text;
    v_error text;
    v_stack text;
BEGIN
    PERFORM x_jobs._require_worker(fail.worker, 'Pass the id the worker claimed with.');
    IF fail.error IS NULL OR fail.error = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ023',
            MESSAGE = pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message',
                coalesce(fail.id::text, 'NULL')),
            HINT = 'Pass what went wrong as error, such as the exception''s message.';
    END IF;
    IF fail.retry_delay < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ018',
            MESSAGE = pg_catalog.format('X_DELAY_INVALID: retry delay %s is negative', fail.retry_delay),
            HINT = 'Pass a delay of zero or more, or NULL for the job''s backoff policy.';
    END IF;
    IF NOT x_jobs._fence(fail.worker) THEN
        RETURN NULL;
    END IF;
    -- The payload limit does not count error texts, and one of 5,000,000 characters was stored
    -- twice (the row and its history). Each is cut to 65,536 characters, with a note of its
    -- length, rather than refused: a worker reporting a failure must not be refused, or its job
    -- would stay running until the lease lapsed. (So are the errors of outbox_nack and steps.)
    v_error := CASE WHEN pg_catalog.length(fail.error) > 65536
        THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
            pg_catalog.left(fail.error, 65536), pg_catalog.length(fail.error))
        ELSE fail.error
    END;
    v_stack := CASE WHEN pg_catalog.length(fail.error_stack) > 65536
        THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
            pg_catalog.left(fail.error_stack, 65536), pg_catalog.length(fail.error_stack))
        ELSE fail.error_stack
    END;

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
            last_error = v_error,
            last_error_stack = v_stack,
            updated_at = v_now
        FROM (
            -- In seconds: an interval times 2^40 overflows ("interval out of range") once the base
            -- is above 8.4 s, and a job that could not fail would run until its lease lapsed.
            -- Due by the last day of the year 9999 at the latest: a backoff of many millennia put
            -- the retry past what timestamptz holds ("timestamp out of range", the same stuck
            -- row), or past what clients can read. (A day short: float seconds of that size are
            -- not exact to the microsecond.)
            SELECT pg_catalog.make_interval(secs => least(
                coalesce(
                    extract(EPOCH FROM fail.retry_delay)::float8,
                    least(
                        extract(EPOCH FROM k.backoff_max)::float8,
                        extract(EPOCH FROM k.backoff_base)::float8 * pg_catalog.power(2, least(k.attempt - 1, 60))
                    ) * (0.5 + pg_catalog.random() / 2)
                ),
                extract(EPOCH FROM timestamptz '9999-12-31 00:00:00+00' - v_now)::float8
            )) AS delay
            FROM x_jobs.job AS k
            WHERE k.id = fail.id
        ) AS r
        WHERE j.id = fail.id
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = fail.worker
            AND (fail.attempt IS NULL OR j.attempt = fail.attempt)
            AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
        RETURNING j.id, j.name, j.queue, j.state, j.attempt, j.started_at
    ),
    logged AS (
        INSERT INTO x_jobs.job_error (job_id, attempt, failed_at, worker, error, error_stack)
        SELECT f.id, f.attempt, v_now, fail.worker, v_error, v_stack
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

    -- A retry of a job that names a rate limit key waits for the key's budget again.
    IF v_state IN ('ready', 'delayed') THEN
        PERFORM x_jobs._repark_rated(ARRAY[fail.id]);
    END IF;
    -- A retry due at once is work for the queue now: wake it like an enqueue does.
    IF v_state = 'ready' THEN
        PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', v_queue));
    END IF;
    RETURN v_state;
END
$$;

-- Tests: tests/pgtap/30-complete.sql, tests/pgtap/31-fail.sql, tests/pgtap/37-keep-done.sql,
--        tests/python/test_plan.py, tests/python/test_settle_refusals.py,
--        tests/python/test_lease.py
