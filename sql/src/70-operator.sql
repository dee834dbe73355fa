------------------------------------------------------------------------------------------------
-- Functions: operator
------------------------------------------------------------------------------------------------

-- Cancel a live job. A running one loses its worker at once: its claimed_by is cleared, so the
-- worker's settle does nothing and its next heartbeat does not list the id (the signal to stop
-- the body). Answers true when this call cancelled the row, false when it had already finished
-- (done, failed, dead or cancelled: nothing changes).
CREATE FUNCTION x_jobs.cancel(id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_name text;
BEGIN
    WITH cancelled AS (
        UPDATE x_jobs.job AS j
        SET state = 'cancelled',
            visible_at = NULL,
            claimed_by = NULL,
            finished_at = v_now,
            updated_at = v_now
        WHERE j.id = cancel.id
            AND j.state IN ('ready', 'delayed', 'suspended', 'running')
        RETURNING j.name
    ),
    counted AS (
        INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, cancelled)
        SELECT k.name, 60, x_jobs._minute(v_now), x_jobs._shard(), 1
        FROM cancelled AS k
        ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
        SET cancelled = c.cancelled + excluded.cancelled
    )
    SELECT k.name INTO v_name FROM cancelled AS k;

    IF v_name IS NOT NULL THEN
        RETURN TRUE;
    END IF;
    IF NOT EXISTS (SELECT FROM x_jobs.job AS j WHERE j.id = cancel.id) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(cancel.id::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    RETURN FALSE;
END
$$;

-- Re-queue a dead, failed or cancelled job: due now, with all its attempts again and the same
-- run_id (so a workflow resumes, not restarts). Its error history stays. Refused for live and
-- done rows, and when another live row now holds its idempotency key.
--
-- The steps it resumes with are those still in effect: a step its compensation undid runs again
-- (replayed as done, the run would go on from a refunded charge to ship the order), and so does
-- a step that failed (replayed, a wait that timed out would time out again at once, and the
-- workflow could never be recovered). A compensation that failed is forgotten, so that
-- the step it did not undo can be undone if this run fails for good.
CREATE FUNCTION x_jobs.retry(id bigint)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job record;
BEGIN
    SELECT j.state, j.queue, j.idempotency_key INTO v_job
    FROM x_jobs.job AS j
    WHERE j.id = retry.id
    FOR UPDATE;

    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(retry.id::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    IF v_job.state NOT IN ('dead', 'failed', 'cancelled') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ015',
            MESSAGE = pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is %s', retry.id, v_job.state),
            HINT = 'Only dead, failed and cancelled jobs can be retried; a live job runs already, '
                'and a done job is enqueued anew.';
    END IF;

    DELETE FROM x_jobs.step AS s
    WHERE s.job_id = retry.id
        AND (
            s.status = 'failed'
            OR EXISTS (
                SELECT FROM x_jobs.step AS c
                WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation AND c.status = 'done'
            )
        );

    BEGIN
        UPDATE x_jobs.job AS j
        SET state = 'ready',
            attempt = 0,
            run_at = v_now,
            visible_at = NULL,
            claimed_by = NULL,
            finished_at = NULL,
            output = NULL,
            updated_at = v_now
        WHERE j.id = retry.id;
    EXCEPTION
        WHEN unique_violation THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ017',
                MESSAGE = pg_catalog.format('X_IDEMPOTENCY_CONFLICT: a live job already holds key %L',
                    v_job.idempotency_key),
                DETAIL = pg_catalog.format('Job %s cannot be re-queued while that job is live.', retry.id),
                HINT = 'Wait for the live job to finish, or cancel it, then retry this one.';
    END;

    PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', v_job.queue));
    RETURN TRUE;
END
$$;

-- The refusals cancel_jobs and retry_jobs share, and the states a call acts on: `p_state` when
-- given, else `p_default`. A state that is no job state is X_STATE_UNKNOWN (as list_jobs); a
-- job state the caller does not act on (cancel_jobs(state => 'done')) is X_STATE_NOT_ALLOWED,
-- so that a call that could change nothing says why instead of answering 0. `p_verb` and
-- `p_hint` are the caller's words for that refusal. An empty created range is refused too: it
-- is a mistake (the bounds swapped), and its answer of 0 would read as "nothing to do".
CREATE FUNCTION x_jobs._bulk_states(
    p_verb text,
    p_state text,
    p_allowed x_jobs.job_state[],
    p_default x_jobs.job_state[],
    p_hint text,
    p_created_before timestamptz,
    p_created_after timestamptz,
    p_max_rows integer
)
RETURNS x_jobs.job_state[]
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_state IS NOT NULL AND p_state <> ALL (pg_catalog.enum_range(NULL::x_jobs.job_state)::text[]) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ016',
            MESSAGE = pg_catalog.format('X_STATE_UNKNOWN: %L is not a job state', p_state),
            HINT = 'Use one of: ' || pg_catalog.array_to_string(
                pg_catalog.enum_range(NULL::x_jobs.job_state)::text[], ', ') || '.';
    END IF;
    IF p_state IS NOT NULL AND p_state::x_jobs.job_state <> ALL (p_allowed) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ044',
            MESSAGE = pg_catalog.format('X_STATE_NOT_ALLOWED: cannot %s jobs that are %s', p_verb, p_state),
            HINT = p_hint;
    END IF;
    IF p_max_rows < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is below 1', p_max_rows),
            HINT = 'Pass max_rows of 1 or more and call again while the answer equals it, '
                'or NULL for every matching job.';
    END IF;
    IF p_created_after >= p_created_before THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ045',
            MESSAGE = pg_catalog.format('X_RANGE_EMPTY: created_after %s is not before created_before %s',
                p_created_after, p_created_before),
            HINT = 'Both bounds are exclusive: pass a created_after earlier than created_before '
                '(were they swapped?), or only one of them.';
    END IF;
    IF p_state IS NULL THEN
        RETURN p_default;
    END IF;
    RETURN ARRAY[p_state::x_jobs.job_state];
END
$$;

-- Cancel every live job that matches the filters given, each NULL (the default) matching any:
-- `queue`, `name`, `state` (ready, delayed, suspended or running; NULL: all four), `tenant_id`,
-- and a creation time strictly before `created_before` and after `created_after`. Each row as
-- x_jobs.cancel cancels it, the same result as calling it row by row: finished now, a running
-- one loses its worker (claimed_by and the lease cleared, so its settle does nothing and its
-- heartbeat drops the id, the body's signal to stop), and the job name's counter bucket counts
-- it. Answers how many it cancelled; with dry_run, how many would be, changing nothing. With
-- max_rows, at most that many, oldest id first: a caller cancels a big backlog in transactions
-- of its own size by calling again until the answer is below max_rows.
--
-- The walk. The live rows are all in the claim's partial indexes (the done history is in none of
-- them), read first, without locks, for their count and their lowest and highest id. The rows
-- between are then walked by primary key, a batch of 5,000 per statement that locks and cancels
-- them, so that no statement sorts or holds more than a batch, and the history between live
-- rows is read once per call, not once per batch; a call made again after a first one starts at
-- the oldest row still live, not at the rows the first one cancelled.
--
-- Locks. A row another transaction holds (a worker settling or heartbeating it, a claim taking
-- it) is waited for, as cancel waits: it is then cancelled if it is still live, or left if it
-- settled first, so neither the settlement nor the cancel is lost. SKIP LOCKED would lose the
-- cancel of a row a claim held for an instant: it would run on. Those holders are statements or
-- short transactions, and they take rows in id order (the heartbeat, the settlers, the Python
-- worker's settling transaction), as this walk does, so the waits cannot close into a deadlock.
-- The counters are added at the end, once, when every row is held: a settler waits for a row of
-- this call before it counts, never while it holds a counter row this call waits for. Claims
-- pass over the rows this call holds. They stay held until the caller's transaction ends: pass
-- max_rows and commit between calls (x-jobs does) so that workers' heartbeats of those rows
-- never wait long.
CREATE FUNCTION x_jobs.cancel_jobs(
    queue text DEFAULT NULL,
    name text DEFAULT NULL,
    state text DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    created_before timestamptz DEFAULT NULL,
    created_after timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL,
    dry_run boolean DEFAULT FALSE
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for each statement's values: the states become constants, which prove the partial
-- indexes' predicates (and drop the arms of the states not asked for), and every filter left
-- NULL folds away.
SET plan_cache_mode = force_custom_plan
-- Index plans only: the live rows through the claim's indexes, the walk through the primary key
-- in id order, the order the rows are locked in. Statistics taken before a backlog arrived make
-- a sequential scan and a sort of every batch look cheaper; a bitmap scan would read the walk's
-- range in the table's order and sort it.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_batch constant integer := 5000;
    v_states x_jobs.job_state[];
    v_count bigint;
    v_after bigint;
    v_last bigint;
    v_limit integer;
    v_n integer;
    v_done bigint := 0::bigint;
    v_names text[] := ARRAY[]::text[];
    v_counts bigint[] := ARRAY[]::bigint[];
    v_batch_names text[];
    v_batch_counts bigint[];
BEGIN
    -- The rows a bound role sees are its tenants' (row-level security); a filter naming another
    -- tenant is a cross-tenant act, refused whatever that tenant holds.
    IF cancel_jobs.tenant_id IS NOT NULL AND x_jobs._tenant_scope() IS NOT NULL
        AND NOT cancel_jobs.tenant_id = ANY (x_jobs._tenant_scope()) THEN
        PERFORM x_jobs._refuse_cross_tenant('cancel the jobs', cancel_jobs.tenant_id);
    END IF;
    v_states := x_jobs._bulk_states('cancel', cancel_jobs.state,
        ARRAY['ready', 'delayed', 'suspended', 'running']::x_jobs.job_state[],
        ARRAY['ready', 'delayed', 'suspended', 'running']::x_jobs.job_state[],
        'Cancel jobs that are ready, delayed, suspended or running (leave state out for all four); '
        'a finished job stays as it ended.',
        cancel_jobs.created_before, cancel_jobs.created_after, cancel_jobs.max_rows);

    -- Each arm repeats its index's predicate word for word (see job_ready_idx), which is how the
    -- planner may use it; the filters are pushed into every arm.
    SELECT count(*), min(l.id), max(l.id) INTO v_count, v_after, v_last
    FROM (
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.concurrency_key IS NULL
            AND 'ready' = ANY (v_states)
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
            AND j.state = ANY (v_states) AND v_states && ARRAY['delayed', 'suspended']::x_jobs.job_state[]
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'ready' AND j.concurrency_key IS NOT NULL
            AND 'ready' = ANY (v_states)
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
            AND j.state = ANY (v_states) AND v_states && ARRAY['delayed', 'suspended']::x_jobs.job_state[]
        UNION ALL
        SELECT j.id, j.queue, j.name, j.tenant_id, j.created_at
        FROM x_jobs.job AS j
        WHERE j.state = 'running'
            AND 'running' = ANY (v_states)
    ) AS l
    WHERE (cancel_jobs.queue IS NULL OR l.queue = cancel_jobs.queue)
        AND (cancel_jobs.name IS NULL OR l.name = cancel_jobs.name)
        AND (cancel_jobs.tenant_id IS NULL OR l.tenant_id = cancel_jobs.tenant_id)
        AND (cancel_jobs.created_before IS NULL OR l.created_at < cancel_jobs.created_before)
        AND (cancel_jobs.created_after IS NULL OR l.created_at > cancel_jobs.created_after);

    IF cancel_jobs.dry_run OR v_count = 0 THEN
        RETURN LEAST(v_count, coalesce(cancel_jobs.max_rows, v_count));
    END IF;

    v_after := v_after - 1;
    LOOP
        v_limit := LEAST(v_batch, coalesce(cancel_jobs.max_rows - v_done, v_batch))::integer;
        -- Picked once, as an array: see purge. A row that settled while this waited for it is
        -- no longer live, and the lock passes over it to the next.
        WITH cancelled AS (
            UPDATE x_jobs.job AS j
            SET state = 'cancelled',
                visible_at = NULL,
                claimed_by = NULL,
                finished_at = v_now,
                updated_at = v_now
            WHERE j.id = ANY (ARRAY(
                SELECT k.id
                FROM x_jobs.job AS k
                WHERE k.id > v_after AND k.id <= v_last
                    AND k.state = ANY (v_states)
                    AND (cancel_jobs.queue IS NULL OR k.queue = cancel_jobs.queue)
                    AND (cancel_jobs.name IS NULL OR k.name = cancel_jobs.name)
                    AND (cancel_jobs.tenant_id IS NULL OR k.tenant_id = cancel_jobs.tenant_id)
                    AND (cancel_jobs.created_before IS NULL OR k.created_at < cancel_jobs.created_before)
                    AND (cancel_jobs.created_after IS NULL OR k.created_at > cancel_jobs.created_after)
                ORDER BY k.id
                LIMIT v_limit
                FOR NO KEY UPDATE
            ))
                AND j.state = ANY (v_states)
            RETURNING j.id, j.name
        ),
        per_name AS (
            SELECT c.name, count(*) AS n, max(c.id) AS last_id
            FROM cancelled AS c
            GROUP BY c.name
        )
        SELECT coalesce(sum(p.n), 0)::integer, max(p.last_id), pg_catalog.array_agg(p.name),
               pg_catalog.array_agg(p.n)
        INTO v_n, v_after, v_batch_names, v_batch_counts
        FROM per_name AS p;

        v_done := v_done + v_n;
        v_names := v_names || v_batch_names;
        v_counts := v_counts || v_batch_counts;
        EXIT WHEN v_n < v_limit OR v_done = cancel_jobs.max_rows;
    END LOOP;

    -- One row per job name, in name order, so that two calls counting the same names cannot
    -- wait for each other's rows in opposite orders.
    INSERT INTO x_jobs.counter AS c (job, bucket_seconds, bucket_start, shard, cancelled)
    SELECT t.name, 60, x_jobs._minute(v_now), x_jobs._shard(), sum(t.n)
    FROM unnest(v_names, v_counts) AS t (name, n)
    GROUP BY t.name
    ORDER BY t.name
    ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
    SET cancelled = c.cancelled + excluded.cancelled;

    RETURN v_done;
END
$$;

-- Re-queue every dead and failed job that matches the filters given, each NULL (the default)
-- matching any: `queue`, `name`, `state`, `tenant_id`, and a creation time strictly before
-- `created_before` and after `created_after`. Cancelled jobs only when `state => 'cancelled'`
-- names them: an operator who cancelled a backlog on purpose does not want a bare retry to
-- bring it back. Each row as x_jobs.retry re-queues it, the same result as calling it row by
-- row: due now with all its attempts, the same run_id, its error history kept, and the steps its
-- run resumes with those still in effect (see retry). Answers how many it re-queued; with
-- dry_run, how many would be, changing nothing. With max_rows, at most that many, oldest id
-- first: call again until the answer is below max_rows.
--
-- A row whose idempotency key a live row holds is left as it is (retry refuses it with
-- X_IDEMPOTENCY_CONFLICT), and so is every row but the oldest of those that share a key (the
-- oldest, re-queued, holds it), each skipped row said in one NOTICE at the end; the walk goes on
-- past them, so an answer below max_rows still means that nothing more can be re-queued. A
-- dry run counts the rows of a shared key each, and is then above what the call re-queues.
--
-- The walk: job_ended_idx, which holds only the dead, failed and cancelled rows, in id order, a
-- batch of 5,000 per statement that locks them (as retry locks its row, waiting for a holder:
-- a purge deleting it, another retry) and then re-queues them, so that no statement sorts or
-- holds more than a batch. A batch in which a key was taken between the check and the update
-- (an enqueue that committed meanwhile) is re-queued again one row at a time, through retry.
CREATE FUNCTION x_jobs.retry_jobs(
    queue text DEFAULT NULL,
    name text DEFAULT NULL,
    state text DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    created_before timestamptz DEFAULT NULL,
    created_after timestamptz DEFAULT NULL,
    max_rows integer DEFAULT NULL,
    dry_run boolean DEFAULT FALSE
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned for each statement's values: the states become constants, which prove
-- job_ended_idx's predicate, and every filter left NULL folds away.
SET plan_cache_mode = force_custom_plan
-- Index plans only: the walk through job_ended_idx in id order, the order the rows are locked
-- in, and the steps and live keys by their indexes.
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_batch constant integer := 5000;
    v_states x_jobs.job_state[];
    v_after bigint := 0::bigint;
    v_limit integer;
    v_picked integer;
    v_ids bigint[];
    v_id bigint;
    v_n integer;
    v_queues text[];
    v_done bigint := 0::bigint;
    v_skipped bigint := 0::bigint;
BEGIN
    -- The rows a bound role sees are its tenants' (row-level security); a filter naming another
    -- tenant is a cross-tenant act, refused whatever that tenant holds.
    IF retry_jobs.tenant_id IS NOT NULL AND x_jobs._tenant_scope() IS NOT NULL
        AND NOT retry_jobs.tenant_id = ANY (x_jobs._tenant_scope()) THEN
        PERFORM x_jobs._refuse_cross_tenant('retry the jobs', retry_jobs.tenant_id);
    END IF;
    v_states := x_jobs._bulk_states('retry', retry_jobs.state,
        ARRAY['dead', 'failed', 'cancelled']::x_jobs.job_state[],
        ARRAY['dead', 'failed']::x_jobs.job_state[],
        'Retry jobs that are dead or failed (leave state out for both), or cancelled with '
        'state => ''cancelled''; a live job runs already, and a done job is enqueued anew.',
        retry_jobs.created_before, retry_jobs.created_after, retry_jobs.max_rows);

    IF retry_jobs.dry_run THEN
        SELECT count(*)::integer INTO v_n
        FROM (
            SELECT
            FROM x_jobs.job AS k
            WHERE k.state = ANY (v_states)
                AND (retry_jobs.queue IS NULL OR k.queue = retry_jobs.queue)
                AND (retry_jobs.name IS NULL OR k.name = retry_jobs.name)
                AND (retry_jobs.tenant_id IS NULL OR k.tenant_id = retry_jobs.tenant_id)
                AND (retry_jobs.created_before IS NULL OR k.created_at < retry_jobs.created_before)
                AND (retry_jobs.created_after IS NULL OR k.created_at > retry_jobs.created_after)
                AND NOT EXISTS (
                    SELECT FROM x_jobs.job AS l
                    WHERE l.tenant_id = k.tenant_id AND l.idempotency_key = k.idempotency_key
                        AND l.state IN ('ready', 'delayed', 'suspended', 'running')
                )
            LIMIT retry_jobs.max_rows
        ) AS m;
        RETURN v_n::bigint;
    END IF;

    LOOP
        v_limit := LEAST(v_batch, coalesce(retry_jobs.max_rows - v_done, v_batch))::integer;
        -- The batch, locked, and which of it may be re-queued: rows without a key, and of each
        -- key the oldest, when no live row holds it (job_idempotency_key_idx). A row re-queued
        -- by an earlier batch of this call is live, and holds its key.
        WITH picked AS MATERIALIZED (
            SELECT k.id, k.tenant_id, k.idempotency_key
            FROM x_jobs.job AS k
            WHERE k.id > v_after
                AND k.state = ANY (v_states)
                AND (retry_jobs.queue IS NULL OR k.queue = retry_jobs.queue)
                AND (retry_jobs.name IS NULL OR k.name = retry_jobs.name)
                AND (retry_jobs.tenant_id IS NULL OR k.tenant_id = retry_jobs.tenant_id)
                AND (retry_jobs.created_before IS NULL OR k.created_at < retry_jobs.created_before)
                AND (retry_jobs.created_after IS NULL OR k.created_at > retry_jobs.created_after)
            ORDER BY k.id
            LIMIT v_limit
            FOR NO KEY UPDATE
        ),
        ranked AS (
            SELECT p.id, p.tenant_id, p.idempotency_key,
                   pg_catalog.row_number() OVER (PARTITION BY p.tenant_id, p.idempotency_key ORDER BY p.id) AS nth
            FROM picked AS p
        )
        SELECT count(*)::integer, max(r.id),
               coalesce(pg_catalog.array_agg(r.id ORDER BY r.id) FILTER (
                   WHERE r.idempotency_key IS NULL
                       OR (r.nth = 1 AND NOT EXISTS (
                           SELECT FROM x_jobs.job AS l
                           WHERE l.tenant_id = r.tenant_id AND l.idempotency_key = r.idempotency_key
                               AND l.state IN ('ready', 'delayed', 'suspended', 'running')
                       ))
               ), ARRAY[]::bigint[])
        INTO v_picked, v_after, v_ids
        FROM ranked AS r;

        IF pg_catalog.cardinality(v_ids) > 0 THEN
            BEGIN
                DELETE FROM x_jobs.step AS s
                WHERE s.job_id = ANY (v_ids)
                    AND (
                        s.status = 'failed'
                        OR EXISTS (
                            SELECT FROM x_jobs.step AS c
                            WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation
                                AND c.status = 'done'
                        )
                    );
                WITH retried AS (
                    UPDATE x_jobs.job AS j
                    SET state = 'ready',
                        attempt = 0,
                        run_at = v_now,
                        visible_at = NULL,
                        claimed_by = NULL,
                        finished_at = NULL,
                        output = NULL,
                        updated_at = v_now
                    WHERE j.id = ANY (v_ids)
                    RETURNING j.queue
                )
                SELECT count(*)::integer, coalesce(pg_catalog.array_agg(DISTINCT r.queue), ARRAY[]::text[])
                INTO v_n, v_queues
                FROM retried AS r;
                PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', q.queue))
                    FROM unnest(v_queues) AS q (queue);
            EXCEPTION
                WHEN unique_violation THEN
                    -- Undone with the block: retry each row as retry does, skipping a taken key.
                    v_n := 0;
                    FOREACH v_id IN ARRAY v_ids LOOP
                        BEGIN
                            PERFORM x_jobs.retry(v_id);
                            v_n := v_n + 1;
                        EXCEPTION
                            WHEN SQLSTATE 'XJ017' THEN
                                NULL;
                        END;
                    END LOOP;
            END;
        ELSE
            v_n := 0;
        END IF;

        v_done := v_done + v_n;
        v_skipped := v_skipped + (v_picked - v_n);
        EXIT WHEN v_picked < v_limit OR v_done = retry_jobs.max_rows;
    END LOOP;

    IF v_skipped > 0 THEN
        RAISE NOTICE USING
            MESSAGE = pg_catalog.format('%s matching jobs were left as they were: a live job holds their idempotency key',
                v_skipped),
            HINT = 'Wait for the live jobs to finish, or cancel them, then retry these.';
    END IF;
    RETURN v_done;
END
$$;

-- The operator's listing: jobs newest first, optionally of one state, one queue and one job
-- name, one page at a time. Keyset paging: pass the last id of a page as before_id to get the next, which
-- costs the same on page 1 and page 1,000 (an OFFSET would read every row it skips).
--
-- Planned for each call's values (see plan_cache_mode below), so the planner sees the state as
-- a constant and may use a partial index whose predicate it implies: dead, failed and cancelled
-- rows walk job_ended_idx newest first, so a listing of 50 dead rows beside a million done ones
-- reads them and no more, not the whole table. A live state may read its claim arm index and
-- sort what it found, or walk the primary key, whichever costs lower: live rows are bounded by
-- the backlog, not the history. Done rows, and all rows, walk the primary key. A name is a
-- filter on what these read: no index leads with it, and one would cost every enqueue and purge
-- for the operator's reads.
CREATE FUNCTION x_jobs.list_jobs(
    state text DEFAULT NULL,
    queue text DEFAULT NULL,
    before_id bigint DEFAULT NULL,
    max_rows integer DEFAULT 50,
    name text DEFAULT NULL
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
        AND (list_jobs.name IS NULL OR j.name = list_jobs.name)
        AND (list_jobs.before_id IS NULL OR j.id < list_jobs.before_id)
    ORDER BY j.id DESC
    LIMIT list_jobs.max_rows;
END
$$;

-- Hold a queue back from every claim (and from queue_demand). Answers true when this call paused
-- it, false when it was paused already. Running jobs of the queue finish as usual.
CREATE FUNCTION x_jobs.pause_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- A queue is every tenant's: a bound role may not stop or start it for the others.
    IF x_jobs._tenant_scope() IS NOT NULL THEN
        PERFORM x_jobs._refuse_cross_tenant('pause a queue', NULL);
    END IF;
    -- The names enqueue accepts: 1 to 200 characters.
    IF pause_queue.queue IS NULL OR pause_queue.queue = '' OR pg_catalog.length(pause_queue.queue) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ002',
            MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %s is not a queue name',
                coalesce(pg_catalog.quote_literal(pause_queue.queue), 'NULL')),
            HINT = 'Name the queue to pause (1 to 200 characters), such as ''default''.';
    END IF;
    INSERT INTO x_jobs.queue_pause (queue, paused_at, paused_by)
    VALUES (pause_queue.queue, x_jobs.now(), current_user)
    ON CONFLICT (queue) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Let a paused queue be claimed again, and wake its workers. Answers true when it was paused.
CREATE FUNCTION x_jobs.resume_queue(queue text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    -- A queue is every tenant's: a bound role may not stop or start it for the others.
    IF x_jobs._tenant_scope() IS NOT NULL THEN
        PERFORM x_jobs._refuse_cross_tenant('resume a queue', NULL);
    END IF;
    -- The names enqueue accepts: 1 to 200 characters.
    IF resume_queue.queue IS NULL OR resume_queue.queue = '' OR pg_catalog.length(resume_queue.queue) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ002',
            MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %s is not a queue name',
                coalesce(pg_catalog.quote_literal(resume_queue.queue), 'NULL')),
            HINT = 'Name the queue to resume (1 to 200 characters), such as ''default''.';
    END IF;
    DELETE FROM x_jobs.queue_pause AS p WHERE p.queue = resume_queue.queue;
    IF FOUND THEN
        PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', resume_queue.queue));
        RETURN TRUE;
    END IF;
    RETURN FALSE;
END
$$;

-- Tests: tests/pgtap/40-operator.sql, tests/pgtap/41-list-jobs.sql, tests/pgtap/42-bulk.sql,
--        tests/python/test_bulk.py, tests/python/test_cli.py, tests/python/test_plan.py
