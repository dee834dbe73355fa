------------------------------------------------------------------------------------------------
-- Functions: workers and demand
------------------------------------------------------------------------------------------------

-- A worker says it is alive, what it serves and which build it runs; call it at an interval
-- well under ttl. The first announce with draining true stamps draining_at, and every later one
-- keeps it: a worker that began to drain never serves again. Rows of workers gone for a day are
-- swept here, so the table holds only the recent fleet. Answers the worker's row.
--
-- `jobs` names the jobs it has handlers for (NULL: it does not say, and is taken to serve every
-- job of its queues). A worker that does not drain wakes the parked rows it serves (see
-- x_jobs.hand_back), at most 10,000 an announce, the rest at the next ones. At every announce, not
-- only the first: a row parked by a hand-back that ran beside this worker's first announce saw
-- no serving worker yet, and the announce did not see the row parked.
--
-- The fence (see x_jobs._fence): the first announce or claim of an id binds it to the caller's
-- login, and an id bound to another login is refused (XJ052), so that no login can mark
-- another's worker draining or change what it serves. A binding lasts while its worker row does
-- or while the id is used (any call with it renews the binding once a day, see _fence); one
-- that is neither for a day is swept here, 100 an announce.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.announce_worker(
    worker text,
    queues text[],
    build text DEFAULT NULL,
    draining boolean DEFAULT FALSE,
    ttl interval DEFAULT '60 seconds',
    jobs text[] DEFAULT NULL
)
RETURNS x_jobs.worker
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.worker;
    v_bad_job text;
BEGIN
    PERFORM x_jobs._require_worker(
        announce_worker.worker, 'Pass an id unique to the worker process, such as host:pid:random.'
    );
    IF announce_worker.queues IS NULL OR pg_catalog.cardinality(announce_worker.queues) = 0
        OR EXISTS (SELECT FROM unnest(announce_worker.queues) AS q WHERE q IS NULL OR q = '') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ010',
            MESSAGE = pg_catalog.format('X_QUEUES_INVALID: queue list %s is not a list of queues',
                coalesce(announce_worker.queues::text, 'NULL')),
            HINT = 'Pass the queues the worker serves, such as ARRAY[''default''].';
    END IF;
    IF announce_worker.ttl IS NULL OR announce_worker.ttl <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ019',
            MESSAGE = pg_catalog.format('X_TTL_INVALID: ttl %s is not positive',
                coalesce(announce_worker.ttl::text, 'NULL')),
            HINT = 'Pass a ttl of a few announce intervals, such as ''60 seconds''.';
    END IF;
    -- As a lease: many millennia ended past what timestamptz holds.
    IF announce_worker.ttl > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ019',
            MESSAGE = pg_catalog.format('X_TTL_INVALID: ttl %s is longer than 1000 years', announce_worker.ttl),
            HINT = 'Pass a ttl of a few announce intervals, such as ''60 seconds''.';
    END IF;
    -- The names enqueue accepts: what a hand-back compares with a row's name.
    SELECT j.name INTO v_bad_job
    FROM unnest(announce_worker.jobs) WITH ORDINALITY AS j (name, n)
    WHERE j.name IS NULL OR j.name = '' OR pg_catalog.length(j.name) > 200
    ORDER BY j.n
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ001',
            MESSAGE = pg_catalog.format('X_NAME_INVALID: job name %s in the jobs list is not a name',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(v_bad_job, 210)), 'NULL')),
            HINT = 'List the names of the jobs the worker has handlers for (1 to 200 characters each), '
                'or pass NULL.';
    END IF;
    PERFORM x_jobs._require_fence(announce_worker.worker);

    INSERT INTO x_jobs.worker AS w (id, queues, build, started_at, seen_at, expires_at, draining_at, jobs)
    VALUES (
        announce_worker.worker, announce_worker.queues, announce_worker.build, v_now, v_now,
        v_now + announce_worker.ttl, CASE WHEN announce_worker.draining THEN v_now END,
        announce_worker.jobs
    )
    ON CONFLICT (id) DO UPDATE
    SET queues = excluded.queues,
        build = excluded.build,
        seen_at = excluded.seen_at,
        expires_at = excluded.expires_at,
        draining_at = coalesce(w.draining_at, excluded.draining_at),
        jobs = excluded.jobs
    RETURNING w.* INTO v_row;

    IF v_row.draining_at IS NULL THEN
        PERFORM x_jobs._wake_parked(announce_worker.jobs, announce_worker.queues, 10000);
    END IF;

    DELETE FROM x_jobs.worker AS w WHERE w.expires_at < v_now - interval '1 day';
    -- Bindings unused for a day (every call of the id renews it daily, see _fence) of ids with
    -- no worker row left; the jobs are not read, so an announce costs what it did.
    DELETE FROM x_jobs.worker_login AS l
    WHERE l.worker IN (
        SELECT o.worker FROM x_jobs.worker_login AS o
        WHERE o.bound_at < v_now - interval '1 day'
            AND NOT EXISTS (SELECT FROM x_jobs.worker AS w WHERE w.id = o.worker)
        LIMIT 100
    );
    RETURN v_row;
END
$$;

-- What queue_stats answers, for a caller bound to tenants (`p_scope`): its tenants' live rows
-- only, by state, per queue; whether the queue is paused; and as demand, its due rows (of an
-- unpaused queue) and its running ones. Counted from the heap (the claim's indexes hold no
-- tenant), and without weighing a concurrency key's room or a rate limit's budget: bound callers
-- are workers and their tenants' dashboards, not the autoscaler, which counts every tenant's
-- rows unbound. queue_demand and queue_gauges answer a bound caller this, so that neither shows
-- it another tenant's rows, nor stores counts of its scope in the snapshot every caller reads.
CREATE FUNCTION x_jobs._scoped_queue_stats(p_scope text[], p_now timestamptz)
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
    SELECT c.queue, c.ready, c.delayed, c.suspended, c.running, c.paused,
           CASE WHEN c.paused THEN c.running ELSE c.due + c.running END
    FROM (
        SELECT j.queue,
               count(*) FILTER (WHERE j.state = 'ready') AS ready,
               count(*) FILTER (WHERE j.state = 'delayed') AS delayed,
               count(*) FILTER (WHERE j.state = 'suspended') AS suspended,
               count(*) FILTER (WHERE j.state = 'running') AS running,
               count(*) FILTER (WHERE j.state IN ('ready', 'delayed', 'suspended') AND j.run_at <= p_now) AS due,
               EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = j.queue) AS paused
        FROM x_jobs.job AS j
        WHERE j.tenant_id = ANY (p_scope)
            AND j.state IN ('ready', 'delayed', 'suspended', 'running')
        GROUP BY j.queue
    ) AS c
    ORDER BY c.queue COLLATE "C"
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
-- counts, not its rows one by one. Keyed rows alone are ranked, read key by key from
-- job_keyed_idx (and sorted within a key whose rows are in several queues), and count what
-- their keys grant (the plain counts hold no keyed row: the claim's keyed rows have indexes of
-- their own). The rows a lease holds need claimed_by from the heap only while a live worker
-- drains. So the cost follows the queues and the keys, not the due rows: a CTE of every due
-- row, fetched from the heap and sorted, would cost five to eight times as much at 100k to
-- 500k ready rows. Pages vacuum has not marked yet cost a heap visit per row still.
--
-- SECURITY DEFINER: monitoring roles (pg_monitor, an autoscaler's login) get counts without
-- being able to read job inputs. It reads only; search_path is pinned.
CREATE FUNCTION x_jobs.queue_demand()
RETURNS TABLE (queue text, demand bigint)
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- A bound caller is answered its tenants' rows only (see _scoped_queue_stats).
    v_scope text[] := x_jobs._tenant_scope();
BEGIN
    IF v_scope IS NOT NULL THEN
        RETURN QUERY
        SELECT s.queue, s.demand FROM x_jobs._scoped_queue_stats(v_scope, x_jobs.now()) AS s
        WHERE s.demand > 0
        ORDER BY s.queue COLLATE "C";
        RETURN;
    END IF;
    RETURN QUERY
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
                WHERE j.state = 'ready' AND j.concurrency_key IS NULL AND j.run_at <= x_jobs.now()
                GROUP BY j.queue
                UNION ALL
                SELECT j.queue, count(*) FROM x_jobs.job AS j
                WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
                    AND j.run_at <= x_jobs.now()
                GROUP BY j.queue
                UNION ALL
                SELECT j.queue, count(*) FROM x_jobs.job AS j
                WHERE j.state = 'running' AND j.visible_at <= x_jobs.now()
                GROUP BY j.queue
            ) AS o
            WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = o.queue)
            UNION ALL
            SELECT k.queue, count(*) FILTER (WHERE k.rank <= k.concurrency_limit - coalesce(b.running, 0))
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
            -- Jobs parked for a rate limit's budget (x_jobs.job_rate): as many of each key's due ones,
            -- in grant order, as its budget in the current window has starts left (every one, for a
            -- key whose limit was dropped).
            SELECT k.queue, count(*) FILTER (
                WHERE l.key IS NULL OR k.rank <= l.max_starts - CASE
                    WHEN l.window_start = x_jobs._rate_window(l.per, x_jobs.now()) THEN l.starts ELSE 0
                END)
            FROM (
                SELECT r.queue, r.rate_limit_key,
                       pg_catalog.row_number() OVER (
                           PARTITION BY r.rate_limit_key ORDER BY r.priority, r.run_at, r.job_id
                       ) AS rank
                FROM x_jobs.job_rate AS r
                WHERE r.parked_state IS NOT NULL
                    AND r.run_at <= x_jobs.now()
                    AND r.queue <> ALL (ARRAY(SELECT p.queue FROM x_jobs.queue_pause AS p))
            ) AS k
            LEFT JOIN x_jobs.rate_limit AS l ON l.key = k.rate_limit_key
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
        ORDER BY d.queue COLLATE "C";
END
$$;

-- Per queue, how many live rows are in each state, whether the queue is paused, and its demand
-- (as queue_demand counts it). Queues with no live row and no pause are absent. For an operator's
-- `x-jobs queues`: it reads the partial indexes of the claim, never the finished rows. Each is counted
-- per queue before anything is joined, ready and running rows by index-only scans; only the
-- waiting rows come from the heap, which alone tells a delayed row from a suspended one.
CREATE FUNCTION x_jobs.queue_stats()
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
            FROM x_jobs.job AS j WHERE j.state = 'ready' AND j.concurrency_key IS NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, count(*), 0, 0, 0
            FROM x_jobs.job AS j WHERE j.state = 'ready' AND j.concurrency_key IS NOT NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'delayed'),
                   count(*) FILTER (WHERE j.state = 'suspended'), 0
            FROM x_jobs.job AS j WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
            GROUP BY j.queue
            UNION ALL
            SELECT j.queue, 0, count(*) FILTER (WHERE j.state = 'delayed'),
                   count(*) FILTER (WHERE j.state = 'suspended'), 0
            FROM x_jobs.job AS j WHERE j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
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
           -- A scoped caller's: queue_demand counts its tenants' rows (see _scoped_queue_stats).
           coalesce(d.demand, 0)
    FROM (SELECT c.queue FROM counted AS c UNION SELECT p.queue FROM x_jobs.queue_pause AS p) AS q
    LEFT JOIN counted AS c ON c.queue = q.queue
    LEFT JOIN x_jobs.queue_pause AS p ON p.queue = q.queue
    LEFT JOIN x_jobs.queue_demand() AS d ON d.queue = q.queue
    ORDER BY q.queue COLLATE "C"
$$;

-- Per queue, what queue_stats answers (live rows by state, paused, demand) from a snapshot at most
-- `max_age` old, and when that snapshot was taken: what the workers' metrics gauges read. Every
-- worker reads it once per its own interval, so fifty workers would count fifty times as often as
-- one; this counts at most once per max_age, however many ask.
--
-- A caller that finds the stored snapshot fresh is answered from it, a JSON document of a row:
-- no job row is read. One that finds it stale takes a transaction-scoped advisory lock WITHOUT
-- WAITING; holding it, it reads the snapshot again (one who held the lock just before may have
-- stored a fresh one: in READ COMMITTED each statement sees what committed before it), counts
-- when it is still stale, and stores the count. A caller that finds the lock taken (another is
-- counting now) is answered the stored snapshot as it is, older than max_age by at most one
-- count: nobody waits on a count, and two never count at once. The lock is transaction-scoped,
-- never session-level, so the function works behind PgBouncer in transaction mode (a session
-- lock would stay with whichever client the server connection serves next). A snapshot taken in
-- the future of the caller's clock by more than max_age (a test clock moved back) is stale too.
-- `queues` are answered even when the snapshot lists them not (no live row, no pause), at 0, with
-- when the snapshot was taken: a worker asks for its own, and shows them at 0 rather than not.
-- A read-only transaction (a hot standby) can store nothing: a stale snapshot is counted again
-- for that caller alone. So is one in REPEATABLE READ or SERIALIZABLE: its snapshot may predate
-- a snapshot another caller stored, and its store would then fail on that row (40001).
--
-- SECURITY DEFINER: workers and monitoring roles (pg_monitor) get the counts and store the
-- snapshot without any right on the tables, nor a sight of job inputs. search_path is pinned.
CREATE FUNCTION x_jobs.queue_gauges(max_age interval DEFAULT '15 seconds', queues text[] DEFAULT NULL)
RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    suspended bigint,
    running bigint,
    paused boolean,
    demand bigint,
    taken_at timestamptz
)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_taken timestamptz;
    v_stats jsonb;
    v_scope text[];
BEGIN
    IF queue_gauges.max_age IS NULL OR queue_gauges.max_age < interval '0'
        OR queue_gauges.max_age > interval '1 day' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ051',
            MESSAGE = pg_catalog.format('X_MAX_AGE_INVALID: max_age %s is outside 0 to 1 day',
                coalesce(queue_gauges.max_age::text, 'NULL')),
            HINT = 'Pass how old the snapshot may be, from ''0'' (count now) to ''1 day'', such as ''15 seconds''.';
    END IF;
    -- A bound caller is counted its tenants' rows, now, and neither reads nor stores the
    -- snapshot of every tenant's (see _scoped_queue_stats).
    v_scope := x_jobs._tenant_scope();
    IF v_scope IS NOT NULL THEN
        v_taken := v_now;
        v_stats := (
            SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q)) FROM x_jobs._scoped_queue_stats(v_scope, v_now) AS q
        );
    ELSE
        SELECT s.taken_at, s.stats INTO v_taken, v_stats FROM x_jobs.queue_snapshot AS s;
        IF v_taken IS NULL OR v_taken <= v_now - queue_gauges.max_age OR v_taken >= v_now + queue_gauges.max_age THEN
            IF pg_catalog.current_setting('transaction_read_only')::boolean
                OR pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                v_taken := v_now;
                v_stats := (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q)) FROM x_jobs.queue_stats() AS q);
            ELSIF pg_catalog.pg_try_advisory_xact_lock(2024061751, 0) THEN
                SELECT s.taken_at, s.stats INTO v_taken, v_stats FROM x_jobs.queue_snapshot AS s;
                IF v_taken IS NULL OR v_taken <= v_now - queue_gauges.max_age
                    OR v_taken >= v_now + queue_gauges.max_age THEN
                    v_taken := v_now;
                    v_stats := (SELECT pg_catalog.jsonb_agg(pg_catalog.to_jsonb(q)) FROM x_jobs.queue_stats() AS q);
                    INSERT INTO x_jobs.queue_snapshot AS s (only_row, taken_at, stats)
                    VALUES (TRUE, v_taken, coalesce(v_stats, '[]'))
                    ON CONFLICT (only_row) DO UPDATE SET taken_at = excluded.taken_at, stats = excluded.stats;
                END IF;
            END IF;
        END IF;
    END IF;
    RETURN QUERY
    SELECT coalesce(r.queue, w.queue), coalesce(r.ready, 0), coalesce(r.delayed, 0), coalesce(r.suspended, 0),
           coalesce(r.running, 0), coalesce(r.paused, FALSE), coalesce(r.demand, 0), v_taken
    FROM pg_catalog.jsonb_to_recordset(coalesce(v_stats, '[]')) AS r (
        queue text, ready bigint, delayed bigint, suspended bigint, running bigint, paused boolean, demand bigint
    )
    FULL JOIN (
        SELECT DISTINCT u.queue FROM pg_catalog.unnest(queue_gauges.queues) AS u (queue)
        WHERE u.queue IS NOT NULL
    ) AS w ON w.queue = r.queue
    ORDER BY coalesce(r.queue, w.queue) COLLATE "C";
END
$$;

-- Tests: tests/pgtap/50-workers-demand.sql, tests/pgtap/51-queue-stats.sql,
--        tests/pgtap/52-queue-gauges.sql, tests/python/test_metrics.py, tests/python/test_plan.py,
--        tests/python/test_worker_observability.py
