\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.3.4'" to load this file. \quit

-- 0.3.3 -> 0.3.4: what every function takes and answers is unchanged.
--   * complete_many settles a batch the way its first job asks first (update when kept, delete
--     when keep_done => false), then the ids that took no effect the other way. It tried the
--     update first for every batch, so a deleted row was looked up twice: a batch of
--     keep_done => false jobs settles in two thirds of the time it took.
--   * complete_many locks its rows in id order, as extend_lease and release do, and all three
--     use index plans only (enable_seqscan off): a worker's settlement and its heartbeat, on
--     two connections and often the same rows, could lock them in opposite orders ("deadlock
--     detected", seen in a benchmark drain).
--   * claim takes the distinct concurrency keys of its pick in the pick itself, and locks or
--     tries them from that list (it looked them up again, in two spellings of one subquery).


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
    IF extend_lease.lease IS NULL OR extend_lease.lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive',
                coalesce(extend_lease.lease::text, 'NULL')),
            HINT = 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.';
    END IF;

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

-- Hand running jobs back: the worker holding them stops without running them to the end (a
-- drain whose grace ran out, a shutdown). They are due again at once, in their old place in the
-- queue (run_at is kept), and the interrupted attempt is not counted, so that deploys cannot
-- use up a job's attempts. Answers the ids released; those the worker no longer held are left.
CREATE OR REPLACE FUNCTION x_jobs.release(ids bigint[], worker text)
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
    v_queues text[];
    v_ids bigint[];
BEGIN
    PERFORM x_jobs._require_worker(release.worker, 'Pass the id the worker claimed with.');

    WITH released AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready',
            attempt = j.attempt - 1,
            visible_at = NULL,
            claimed_by = NULL,
            updated_at = v_now
        WHERE j.id = ANY (release.ids)
            AND j.state::text = 'running' -- by id only: see job_running_idx
            AND j.claimed_by = release.worker
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(r.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT r.queue), '{}')
    INTO v_ids, v_queues
    FROM released AS r;

    -- Another worker should take them now, not at its next poll.
    PERFORM pg_catalog.pg_notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Complete the running rows `worker` holds among `ids`, with outputs[i] as the output of ids[i]
-- (outputs may be NULL: no output). Answers the ids it completed; an id missing from the answer
-- was not held by this worker (lapsed and re-claimed, cancelled, settled) and is left as it is.
-- The same transaction adds to the job name's counter bucket. A job enqueued with keep_done =>
-- false is deleted instead of kept as 'done', with its steps and error history: for jobs whose
-- result nobody reads, so that the table does not fill with rows only purge would delete.
CREATE OR REPLACE FUNCTION x_jobs.complete_many(ids bigint[], worker text, outputs jsonb[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
-- Planned once, for a batch of any size: a seek per id. A custom plan knows the batch's size,
-- and with statistics that saw few running rows (a backlog analyzed before its workers
-- started) it read the whole table rather than seek a batch that is a tenth of it or so:
-- complete_many of 500 in a table of 20,000 rows took 52-57 ms against 7 (measured
-- 2026-11-30), so settling cost as much as the table was big.
SET plan_cache_mode = force_generic_plan
-- Rows are locked in id order, as extend_lease and release lock them: in another order a
-- worker's settlement and its heartbeat (two connections, often the same rows) could each hold
-- a row the other waits for ("deadlock detected", once in a benchmark drain, 2026-11-30). The
-- ids are sorted below and the index plans keep their order; a sequential scan would lock in
-- the table's order, and it is only ever chosen for a table too small to matter.
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
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
BEGIN
    PERFORM x_jobs._require_worker(complete_many.worker, 'Pass the id the worker claimed with.');
    IF complete_many.outputs IS NOT NULL
        AND pg_catalog.cardinality(complete_many.outputs) <> coalesce(pg_catalog.cardinality(complete_many.ids), 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ021',
            MESSAGE = pg_catalog.format('X_OUTPUTS_INVALID: %s outputs for %s ids',
                pg_catalog.cardinality(complete_many.outputs), coalesce(pg_catalog.cardinality(complete_many.ids), 0)),
            HINT = 'Pass one output per id, in the same order, or no outputs at all (NULL).';
    END IF;
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
            DETAIL = pg_catalog.format('For job %s.', v_big.id),
            HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
    END IF;

    -- In id order, the order the rows are locked in (see enable_seqscan above).
    SELECT pg_catalog.array_agg(o.id ORDER BY o.id), pg_catalog.array_agg(o.output ORDER BY o.id)
    INTO v_ids, v_outputs
    FROM unnest(complete_many.ids, complete_many.outputs) AS o (id, output);
    -- A batch is mostly of one kind (one job's), so it is settled first the way its first job
    -- asks, kept (updated) or not (deleted), and only the ids that took no effect the other way:
    -- a row is looked up once. Trying the update first for every batch cost a deleted row a
    -- second lookup, a third of its settle (measured 2026-11-30: 16.8 against 11.0 us per row).
    v_keep := coalesce((SELECT j.keep_done FROM x_jobs.job AS j WHERE j.id = v_ids[1]), TRUE);
    WHILE v_turn < 2 AND coalesce(pg_catalog.cardinality(v_ids), 0) > 0 LOOP
        v_turn := v_turn + 1;
        IF v_keep THEN
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
                    AND j.keep_done
                RETURNING j.id, j.name, j.started_at
            )
            SELECT coalesce(pg_catalog.array_agg(k.id), '{}'), pg_catalog.array_agg(k.name),
                   pg_catalog.array_agg(k.started_at)
            INTO v_settled, v_names, v_started
            FROM kept AS k;
        ELSE
            -- A delete writes no new row version and no index entry: about half the work of
            -- the update (measured 2026-11-30: 0.63 against 1.46 ms per 100 rows, 5.8 against
            -- 23 kB of WAL).
            WITH dropped AS (
                DELETE FROM x_jobs.job AS j
                WHERE j.id = ANY (v_ids)
                    AND j.state::text = 'running' -- by id only: see job_running_idx
                    AND j.claimed_by = complete_many.worker
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
        SELECT pg_catalog.array_agg(o.id), pg_catalog.array_agg(o.output)
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
    SELECT '0.3.4'::text
$$;
