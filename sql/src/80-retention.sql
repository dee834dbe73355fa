------------------------------------------------------------------------------------------------
-- Functions: retention
------------------------------------------------------------------------------------------------

-- Fold old counter buckets into wider ones: minutes older than `minutes_for` into hours, hours
-- older than `hours_for` into days, and drop days older than `days_for`. Shards fold together.
-- Answers how many buckets it folded or dropped. Run it every few minutes; it touches only old buckets, so
-- it never holds a lock a settling statement waits for.
CREATE FUNCTION x_jobs.rollup_counters(
    minutes_for interval DEFAULT '2 hours',
    hours_for interval DEFAULT '2 days',
    days_for interval DEFAULT '400 days'
)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_removed bigint := 0::bigint;
    v_n bigint;
    v_step record;
BEGIN
    -- At most 1000 years each, as _require_retention.
    IF rollup_counters.minutes_for IS NULL OR rollup_counters.minutes_for < interval '0'
        OR rollup_counters.hours_for IS NULL OR rollup_counters.hours_for < interval '0'
        OR rollup_counters.days_for IS NULL OR rollup_counters.days_for < interval '0'
        OR greatest(rollup_counters.minutes_for, rollup_counters.hours_for, rollup_counters.days_for)
        > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: retention %s / %s / %s is not a set of ages',
                coalesce(rollup_counters.minutes_for::text, 'NULL'),
                coalesce(rollup_counters.hours_for::text, 'NULL'),
                coalesce(rollup_counters.days_for::text, 'NULL')),
            HINT = 'Pass ages from zero to 1000 years, such as minutes_for => ''2 hours''.';
    END IF;

    FOR v_step IN
        SELECT *
        FROM (VALUES (60, 3600, 'hour', rollup_counters.minutes_for),
                     (3600, 86400, 'day', rollup_counters.hours_for)) AS s (from_seconds, to_seconds, unit, keep)
    LOOP
        WITH moved AS (
            DELETE FROM x_jobs.counter AS c
            WHERE c.bucket_seconds = v_step.from_seconds
                AND c.bucket_start < v_now - v_step.keep
            RETURNING c.*
        ),
        folded AS (
            INSERT INTO x_jobs.counter AS c (
                job, bucket_seconds, bucket_start, shard, completed, retried, failed, dead, cancelled, run_ms
            )
            SELECT m.job, v_step.to_seconds, pg_catalog.date_trunc(v_step.unit, m.bucket_start, 'UTC'), 0,
                   sum(m.completed), sum(m.retried), sum(m.failed), sum(m.dead), sum(m.cancelled), sum(m.run_ms)
            FROM moved AS m
            GROUP BY 1, 2, 3
            ON CONFLICT (job, bucket_seconds, bucket_start, shard) DO UPDATE
            SET completed = c.completed + excluded.completed,
                retried = c.retried + excluded.retried,
                failed = c.failed + excluded.failed,
                dead = c.dead + excluded.dead,
                cancelled = c.cancelled + excluded.cancelled,
                run_ms = c.run_ms + excluded.run_ms
        )
        SELECT count(*) INTO v_n FROM moved;
        v_removed := v_removed + v_n;
    END LOOP;

    DELETE FROM x_jobs.counter AS c
    WHERE c.bucket_seconds = 86400 AND c.bucket_start < v_now - rollup_counters.days_for;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_removed + v_n;
END
$$;

-- Delete up to `batch_size` terminal jobs (done, failed, dead, cancelled) that finished more than
-- `older_than` ago, lowest id first, with their error history and steps. Answers how many it deleted: call
-- it again while that equals batch_size. Bounded, so a purge never holds locks or writes WAL in
-- one unbounded burst; SKIP LOCKED, so two purgers share the work instead of waiting.
--
-- Lowest id, not earliest finished_at: ids follow enqueue order, so this is nearly oldest first
-- and walks the primary key, where finished_at order would need an index that every settling
-- statement pays to maintain, or a sort of every finished row on each call. Every row it takes
-- is past the retention either way.
CREATE FUNCTION x_jobs.purge(older_than interval, batch_size integer DEFAULT 10000)
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
    -- At most 1000 years, as _require_retention.
    IF purge.older_than IS NULL OR purge.older_than < interval '0' OR purge.older_than > interval '1000 years'
        OR purge.batch_size IS NULL OR purge.batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge older than %s in batches of %s',
                coalesce(purge.older_than::text, 'NULL'), coalesce(purge.batch_size::text, 'NULL')),
            HINT = 'Pass an age from zero to 1000 years, such as ''7 days'', and a batch size of 1 or more.';
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
    DELETE FROM x_jobs.job_rate AS r WHERE r.job_id = ANY (v_ids);
    RETURN pg_catalog.cardinality(v_ids)::bigint;
END
$$;

-- Tests: tests/pgtap/60-retention.sql
