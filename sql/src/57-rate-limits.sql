------------------------------------------------------------------------------------------------
-- Functions: rate limits
------------------------------------------------------------------------------------------------

-- A rate limit key is any text (a tenant, a job name, 'stripe-api'): 1 to 400 characters, as a
-- concurrency key (it is in job_rate_parked_idx beside a queue name). Refuses anything else, XJ063.
CREATE FUNCTION x_jobs._require_rate_limit_key(p_key text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_key IS NULL OR p_key = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ063',
            MESSAGE = pg_catalog.format('X_RATE_LIMIT_INVALID: rate limit key %s is empty',
                coalesce(pg_catalog.quote_literal(p_key), 'NULL')),
            HINT = 'Name the rate limit with a non-empty text, such as ''stripe-api'' or a tenant id.';
    END IF;
    IF pg_catalog.length(p_key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ063',
            MESSAGE = pg_catalog.format('X_RATE_LIMIT_INVALID: rate limit key %L... is %s characters, longer than 400',
                pg_catalog.left(p_key, 64), pg_catalog.length(p_key)),
            HINT = 'Use a rate limit key of 1 to 400 characters: hash a longer one.';
    END IF;
END
$$;

-- The fixed window that `p_now` is in, for a period `p_per`: its start, a multiple of the
-- period since the epoch. Numeric arithmetic, so the boundaries are exact.
CREATE FUNCTION x_jobs._rate_window(p_per interval, p_now timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.to_timestamp(
        (pg_catalog.floor(EXTRACT(EPOCH FROM p_now) / EXTRACT(EPOCH FROM p_per))
            * EXTRACT(EPOCH FROM p_per))::double precision
    )
$$;

-- Declare (or change) the rate limit of `key`: at most `max_starts` claims of the rows that
-- name it (rate_limit_key) in each fixed window of length `per` (see x_jobs.rate_limit for the
-- window). Setting it again keeps what the current window spent, so a change takes effect at
-- once without a fresh budget. Answers the limit's row.
-- SECURITY DEFINER: workers declare their app's limits (x_jobs.declare_job's peers) and hold
-- no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.set_rate_limit(key text, max_starts integer, per interval) -- noqa: RF04
RETURNS x_jobs.rate_limit
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.rate_limit;
BEGIN
    PERFORM x_jobs._require_rate_limit_key(set_rate_limit.key);
    IF set_rate_limit.max_starts IS NULL OR set_rate_limit.max_starts < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ063',
            MESSAGE = pg_catalog.format('X_RATE_LIMIT_INVALID: max_starts %s is below 1',
                coalesce(set_rate_limit.max_starts::text, 'NULL')),
            HINT = 'Pass how many starts the key may have per period, 1 or more; drop_rate_limit removes a limit.';
    END IF;
    -- Up to a year: the window start is the epoch divided by `per`, which needs a length in
    -- seconds (a month counts as 30 days).
    IF set_rate_limit.per IS NULL OR set_rate_limit.per <= interval '0'
        OR set_rate_limit.per > interval '366 days' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ063',
            MESSAGE = pg_catalog.format('X_RATE_LIMIT_INVALID: period %s is not a positive interval up to 366 days',
                coalesce(set_rate_limit.per::text, 'NULL')),
            HINT = 'Pass per as a positive interval, such as ''1 minute'' or ''1 second''.';
    END IF;

    INSERT INTO x_jobs.rate_limit AS r (key, max_starts, per, created_at, updated_at)
    VALUES (set_rate_limit.key, set_rate_limit.max_starts, set_rate_limit.per, v_now, v_now)
    ON CONFLICT ON CONSTRAINT rate_limit_pkey DO UPDATE
    SET max_starts = excluded.max_starts,
        per = excluded.per,
        -- A new period has other windows: what the old one counted does not carry over.
        window_start = CASE WHEN r.per = excluded.per THEN r.window_start END,
        starts = CASE WHEN r.per = excluded.per THEN r.starts ELSE 0 END,
        updated_at = v_now
    RETURNING r.* INTO v_row;
    RETURN v_row;
END
$$;

-- Remove the rate limit of `key`. Rows that name the key and are still waiting then run
-- without a limit (the claim takes them as it finds them); enqueues naming it are refused from
-- now on (XJ064). Refuses a key with no limit, XJ064. Answers the key.
-- SECURITY DEFINER: admins hold no right to write x_jobs.rate_limit (see Grants).
CREATE FUNCTION x_jobs.drop_rate_limit(key text) -- noqa: RF04
RETURNS text
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    DELETE FROM x_jobs.rate_limit AS r WHERE r.key = drop_rate_limit.key;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ064',
            MESSAGE = pg_catalog.format('X_RATE_LIMIT_UNKNOWN: no rate limit has key %s',
                coalesce(pg_catalog.quote_literal(drop_rate_limit.key), 'NULL')),
            HINT = 'List the keys with x_jobs.rate_limits(); declare one with x_jobs.set_rate_limit.';
    END IF;
    RETURN drop_rate_limit.key;
END
$$;

-- Every rate limit, by key: its budget, and what the current window has spent (starts, and
-- `remaining`, which is max_starts in a window no claim has spent from yet), and how many jobs
-- of the key are parked for its budget now (`waiting`, due or not).
-- SECURITY DEFINER: monitoring roles and the CLI read counts without rights on the tables.
CREATE FUNCTION x_jobs.rate_limits()
RETURNS TABLE (
    key text, -- noqa: RF04
    max_starts integer,
    per interval, -- noqa: RF04
    window_start timestamptz,
    starts integer,
    remaining integer,
    waiting bigint
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.key, r.max_starts, r.per, w.start,
           CASE WHEN r.window_start = w.start THEN r.starts ELSE 0 END,
           r.max_starts - CASE WHEN r.window_start = w.start THEN r.starts ELSE 0 END,
           (SELECT count(*) FROM x_jobs.job_rate AS p
            WHERE p.rate_limit_key = r.key AND p.parked_state IS NOT NULL)
    FROM x_jobs.rate_limit AS r
    CROSS JOIN LATERAL (SELECT x_jobs._rate_window(r.per, x_jobs.now()) AS start) AS w
    ORDER BY r.key COLLATE "C"
$$;

-- Where a job parked for its rate limit's budget waits: 'delayed' at this time, which no
-- enqueue may take (run_at stops before the year 10000), so every keyless arm of the claim and
-- queue_demand stop before it, and it is no parked row at infinity (x_jobs.hand_back's).
CREATE FUNCTION x_jobs._rate_parked_at()
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT timestamptz '100000-01-01 00:00:00+00'
$$;

-- Park again, for their key's budget, the jobs among `p_ids` that name a rate limit key and are
-- due again (ready or delayed, not parked): a retry after fail, a job released by a worker that
-- stopped. Its next start is a start as the first was, and spends a start of the budget: else a
-- key of 2 a minute whose jobs fail and retry at once started a third. (A job handed back by a
-- worker that does not serve its name never ran: not counted. Any other way back: see
-- _park_picked_rated.) A job without a key costs one probe of job_rate's primary key.
CREATE FUNCTION x_jobs._repark_rated(p_ids bigint[])
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH parked AS (
        UPDATE x_jobs.job_rate AS r
        SET parked_state = j.state, run_at = j.run_at, priority = j.priority
        FROM x_jobs.job AS j
        WHERE r.job_id = ANY (p_ids)
            AND j.id = r.job_id
            AND j.state IN ('ready', 'delayed')
            AND j.run_at < x_jobs._rate_parked_at()
            AND EXISTS (SELECT FROM x_jobs.rate_limit AS l WHERE l.key = r.rate_limit_key)
        RETURNING r.job_id
    )
    UPDATE x_jobs.job AS j
    SET state = 'delayed', run_at = x_jobs._rate_parked_at()
    FROM parked AS p
    WHERE j.id = p.job_id
$$;

-- Park, for their key's budget, the jobs among `p_ids` that name a rate limit key: the rows a
-- claim picked in its other arms, which it would hand out without spending a start. Those are
-- jobs due again by a path that did not park them: a lapsed lease, a resumed suspension, an
-- operator's retry, a resolved step. Each waits parked for its key's budget as its first start
-- did (as a failed one does, see _repark_rated), 'ready' for a lapsed lease (at its old run_at),
-- else in its state. Answers the ids parked, which the claim then does not hand out. Called only
-- where a rate limit exists: a probe of job_rate's primary key a picked row.
CREATE FUNCTION x_jobs._park_picked_rated(p_ids bigint[])
RETURNS bigint[]
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH parked AS (
        UPDATE x_jobs.job_rate AS r
        SET parked_state = CASE WHEN j.state = 'running' THEN 'ready' ELSE j.state END,
            run_at = j.run_at,
            priority = j.priority
        FROM x_jobs.job AS j
        WHERE r.job_id = ANY (p_ids)
            AND j.id = r.job_id
            AND j.state IN ('ready', 'delayed', 'suspended', 'running')
            AND EXISTS (SELECT FROM x_jobs.rate_limit AS l WHERE l.key = r.rate_limit_key)
        RETURNING r.job_id
    ),
    moved AS (
        UPDATE x_jobs.job AS j
        SET state = 'delayed', run_at = x_jobs._rate_parked_at(), visible_at = NULL, claimed_by = NULL,
            updated_at = x_jobs.now()
        FROM parked AS p
        WHERE j.id = p.job_id
        RETURNING j.id
    )
    SELECT coalesce(pg_catalog.array_agg(m.id), '{}') FROM moved AS m
$$;

-- The claim's part for jobs parked for a rate limit's budget (x_jobs.job_rate): restore and
-- lock up to `p_want` of them in `p_queues` whose keys have budget in the current window, and
-- spend it, one start a job. Called by x_jobs.claim only, in its transaction: the rate_limit
-- rows it updates stay locked until the claim commits, so a start is counted exactly when the
-- claim that made it commits, and a rolled back claim spends nothing.
--
-- Keys, not jobs, are walked: the keys with parked jobs in these queues, in key order through
-- job_rate_parked_idx (a seek per queue from one key to the next), so a key out of budget with
-- a million parked jobs costs one seek, and holds back neither other keys nor the jobs without
-- a key (those are in the claim's other arms, which never see a parked job). At most
-- 10 x p_want + 100 keys a call, starting after the key the session's last walk ended on and
-- wrapping around, so successive claims reach every key. Each key's rate_limit row is locked
-- FOR UPDATE SKIP LOCKED before its budget is read: a key another claimer holds now is passed
-- over (a claim never waits for another), and the budget read after the lock is the latest
-- committed one (READ COMMITTED, which claim insists on). A key whose limit was dropped after
-- its jobs were enqueued runs them without one.
--
-- Within a key, jobs due now in (priority, run_at, id) order; across keys, in walk order. A
-- granted job gets its state and run_at back (the claim then makes it 'running', by the ctid
-- answered here). A parked job that is no longer parked (cancelled meanwhile) is let go of.
CREATE FUNCTION x_jobs._claim_rated(p_queues text[], p_want integer, p_now timestamptz)
RETURNS TABLE (o_id bigint, o_at tid)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_left integer := p_want;
    v_visits integer := 10 * p_want + 100;
    v_cursor text := coalesce(pg_catalog.current_setting('x_jobs.claim_rate_cursor', TRUE), '');
    v_key text;
    v_next text;
    v_last text;
    v_room integer;
    v_per interval;
    v_limited boolean;
    v_ids bigint[];
    v_gone bigint[];
    v_n integer;
    v_window timestamptz;
BEGIN
    FOR v_lap IN 1..2 LOOP
        EXIT WHEN v_lap = 2 AND v_cursor = '';
        -- Keys are never empty, so '' is before the first one.
        v_key := CASE WHEN v_lap = 1 THEN v_cursor ELSE '' END;
        LOOP
            EXIT WHEN v_left <= 0 OR v_visits <= 0;
            SELECT min(f.key)
            INTO v_next
            FROM unnest(p_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT r.rate_limit_key AS key
                FROM x_jobs.job_rate AS r
                WHERE r.queue = o.queue
                    AND r.rate_limit_key > v_key
                    AND r.parked_state IS NOT NULL
                ORDER BY r.rate_limit_key
                LIMIT 1
            ) AS f;
            EXIT WHEN v_next IS NULL OR (v_lap = 2 AND v_next > v_cursor);
            v_key := v_next;
            v_last := v_key;
            v_visits := v_visits - 1;

            -- p_now is the claim's transaction start, so a claim that began before a window's
            -- end can take the lock after one that began in the next window: its window is
            -- closed then, and it starts nothing (counting its starts in the old window afresh
            -- would spend that window's budget twice).
            SELECT l.per,
                   CASE
                       WHEN l.window_start > x_jobs._rate_window(l.per, p_now) THEN 0
                       WHEN l.window_start = x_jobs._rate_window(l.per, p_now) THEN l.max_starts - l.starts
                       ELSE l.max_starts
                   END
            INTO v_per, v_room
            FROM x_jobs.rate_limit AS l
            WHERE l.key = v_key
            FOR UPDATE SKIP LOCKED;
            v_limited := FOUND;
            IF NOT v_limited THEN
                -- Held by another claimer now (pass it over), or no limit at all (none to keep).
                CONTINUE WHEN EXISTS (SELECT FROM x_jobs.rate_limit AS l WHERE l.key = v_key);
                v_room := v_left;
            END IF;
            CONTINUE WHEN v_room <= 0;

            -- The key's first due parked jobs, locked: up to the room, plus ten to step over
            -- jobs that are parked no longer (their rows here are let go of below).
            SELECT coalesce(pg_catalog.array_agg(c.job_id) FILTER (WHERE c.parked AND c.n <= LEAST(v_room, v_left)), '{}'),
                   coalesce(pg_catalog.array_agg(c.job_id) FILTER (WHERE NOT c.parked), '{}')
            INTO v_ids, v_gone
            FROM (
                SELECT w.job_id, l.id IS NOT NULL AS parked,
                       pg_catalog.row_number() OVER (
                           PARTITION BY l.id IS NOT NULL ORDER BY w.priority, w.run_at, w.job_id
                       ) AS n
                FROM (
                    SELECT e.*
                    FROM unnest(p_queues) AS o (queue)
                    CROSS JOIN LATERAL (
                        SELECT r.job_id, r.priority, r.run_at
                        FROM x_jobs.job_rate AS r
                        WHERE r.queue = o.queue
                            AND r.rate_limit_key = v_key
                            AND r.parked_state IS NOT NULL
                            AND r.run_at <= p_now
                        ORDER BY r.priority, r.run_at, r.job_id
                        LIMIT LEAST(v_room, v_left) + 10
                    ) AS e
                ) AS w
                LEFT JOIN LATERAL (
                    SELECT j.id
                    FROM x_jobs.job AS j
                    WHERE j.id = w.job_id
                        AND j.state = 'delayed'
                        AND j.run_at = x_jobs._rate_parked_at()
                    FOR UPDATE SKIP LOCKED
                ) AS l ON TRUE
            ) AS c;

            -- Let go of the rows of jobs parked no longer: cancelled, or held by another claim
            -- (SKIP LOCKED answers those as missing too, so only the ones not parked in a fresh
            -- look are let go of).
            IF pg_catalog.cardinality(v_gone) > 0 THEN
                UPDATE x_jobs.job_rate AS r
                SET parked_state = NULL
                WHERE r.job_id = ANY (v_gone)
                    AND NOT EXISTS (
                        SELECT FROM x_jobs.job AS j
                        WHERE j.id = r.job_id AND j.state = 'delayed'
                            AND j.run_at = x_jobs._rate_parked_at()
                    );
            END IF;

            v_n := pg_catalog.cardinality(v_ids);
            CONTINUE WHEN v_n = 0;
            IF v_limited THEN
                v_window := x_jobs._rate_window(v_per, p_now);
                UPDATE x_jobs.rate_limit AS l
                SET starts = CASE WHEN l.window_start = v_window THEN l.starts ELSE 0 END + v_n,
                    window_start = v_window,
                    updated_at = p_now
                WHERE l.key = v_key;
            END IF;
            v_left := v_left - v_n;

            RETURN QUERY
            WITH granted AS (
                UPDATE x_jobs.job_rate AS r
                SET parked_state = NULL
                FROM x_jobs.job_rate AS o
                WHERE r.job_id = ANY (v_ids) AND o.job_id = r.job_id
                RETURNING r.job_id, o.parked_state, o.run_at
            )
            UPDATE x_jobs.job AS j
            SET state = g.parked_state, run_at = g.run_at
            FROM granted AS g
            WHERE j.id = g.job_id
            RETURNING j.id, j.ctid;
        END LOOP;
        EXIT WHEN v_left <= 0 OR v_visits <= 0;
    END LOOP;

    IF v_last IS NOT NULL THEN
        PERFORM pg_catalog.set_config('x_jobs.claim_rate_cursor', v_last, FALSE);
    END IF;
END
$$;

-- Tests: tests/pgtap/47-rate-limits.sql, tests/python/test_rate_limits.py
