------------------------------------------------------------------------------------------------
-- Functions: claim and heartbeat
------------------------------------------------------------------------------------------------

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
--   lapsed    job_running_idx  running rows whose lease (visible_at) ran out, in lease order
--                              (but not in the first lease after the server started: see there).
-- One `state IN (...) OR running` test over all queues cannot be served in order by any index:
-- it reads and sorts every due row, so a queue slows down exactly when it is behind. The outer
-- sort sees at most 3 x qty x queues rows. Priority orders the ready arm exactly; a row coming
-- due from a delay competes by priority among the earliest-due ones the waiting arm read.
-- The first two arms hold rows without a concurrency key; those with one, see below.
--
-- A lapsed row on its final attempt is buried instead (dead, or failed for a job that wants no
-- dead letters), counted, and returned with that state: handing it out again would be an attempt
-- past max_attempts every lease, forever. Its claimed_by is cleared, so the stalled body cannot
-- settle a row it lost.
--
-- Concurrency keys: a row with a key is taken only while fewer than its limit of the key's rows
-- run. Such rows are looked for in a window of each queue's oldest due keyed rows (10 x qty +
-- 100 ready ones in claim order, as many waiting ones), ranked per key, and as many of each
-- key's first ones as its room are locked in claim order, skipping those another claimer holds.
-- When a window is full of rows whose keys have no room (one key backed up by thousands) and
-- yields fewer than wanted, the claim visits the keys of its queues instead, at most as many
-- as the window holds rows, one seek from each key to the next, starting where the session's
-- last visit ended, and takes the first due rows of those with room, rather than walk every
-- row of a full key ahead of the rows behind it. So a claim reads about the window when keyed
-- rows are at hand, and a few seeks per key of a window's worth of keys at worst.
-- The rows found are then granted under an advisory lock per key, counted again in a new
-- statement, so two claimers cannot both take the last slot. That needs READ COMMITTED, which
-- a claim refuses to run without.
--
-- Rate limits: a job naming a rate limit key waits parked ('delayed' at _rate_parked_at(), which
-- no arm reaches) until its key has budget; on its first pass the claim hands out such jobs first,
-- as _claim_rated grants them (a walk of the keys with parked jobs, each key's budget counted
-- under its row's lock), and looks for the remaining slots in the arms above. Queues without a
-- parked job cost one probe of an empty index range.
--
-- Slots spent on rows it could not hand out (buried, or denied by a key) are claimed again in
-- up to two more passes. Rows a scan locked and the outer LIMIT dropped stay locked until the
-- transaction ends; called on its own, a claim is its own transaction and that is at once. Over
-- several queues the first pass reads first how many ready rows to lock in each (see there).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.claim(
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
-- ones (LIMIT of a parameter), so the plan cache keeps re-planning, which costs twice the
-- claim itself. The generic plans are the same seeks.
SET plan_cache_mode = force_generic_plan
-- A generic plan costs the LIMIT as if every due row were read, which is above the JIT
-- thresholds on a big table: each call then compiles its plan with LLVM, tens to hundreds of
-- times the cost of the claim. The seeks read a few rows; compiling never pays.
SET jit = off
-- Every statement is index walks and seeks from them. A generic plan costs a window as if it
-- were thousands of rows, which invites hashing the whole table to join it back.
SET enable_hashjoin = off
SET enable_mergejoin = off
-- Index and TID scans only, whatever the statistics say. A session keeps the generic plans it
-- built at its first claim until the table is next analysed; planned on an empty or
-- never-analysed table (a fresh install, a TRUNCATE), where a sequential scan of the few pages
-- costs least, the pick and the update then read the whole table on every claim as it fills:
-- 8 ms a claim at 50,000 rows, and a worker fell behind steady production for the minute until
-- the first autoanalyze.
SET enable_seqscan = off
-- A bitmap scan reads every row its condition matches, to sort them after: an arm must come out
-- of its index in claim order, for its LIMIT to stop after qty rows.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_window integer;
    v_window_full boolean;
    v_found bigint[];
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
    v_limits integer[];
    v_peeked integer;
    v_cursor text;
    v_visit_keys text[];
    v_visit_lims integer[];
    v_last bigint;
    -- The tenants the worker's role acts for (NULL: all). A bound worker takes only their rows:
    -- a filter in each arm, on rows the index hands out in order, so an unbound worker pays a
    -- NULL test a row read. A bound worker on a queue shared with other tenants reads past their
    -- due rows: give a bound tenant's jobs queues of their own. With no binding in the database
    -- and no x_jobs.tenant set (v_scoped), the scope is NULL without the call (20 us of a 500 us
    -- claim).
    v_scope text[];
    v_scoped boolean;
    v_fenced boolean;
    v_rated boolean;
    v_any_keyed boolean;
    v_rated_ids bigint[] := ARRAY[]::bigint[];
    v_rated_at tid[] := ARRAY[]::tid[];
    -- The fair queues among v_queues (x_jobs.queue_policy), and what _claim_fair locked in them.
    v_fair text[];
    v_fair_at tid[];
    v_fair_priority smallint[];
    v_fair_run_at timestamptz[];
    v_fair_seq integer[];
    v_parked bigint[];
    v_any_rate boolean;
BEGIN
    -- The checks are expressions, no statements, and the shared helpers that word a refusal are
    -- called only to refuse: each statement or call of a function with settings costs a claim
    -- several microseconds, of about 300 at qty 1.
    IF claim.queues IS NULL OR pg_catalog.cardinality(claim.queues) = 0
        OR pg_catalog.array_position(claim.queues, NULL) IS NOT NULL OR '' = ANY (claim.queues) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ010',
            MESSAGE = pg_catalog.format('X_QUEUES_INVALID: queue list %s names no queue',
                coalesce(claim.queues::text, 'NULL')),
            HINT = 'Pass the queues to serve, such as ARRAY[''default''].';
    END IF;
    IF claim.worker IS NULL OR claim.worker = '' OR pg_catalog.length(claim.worker) > 400 THEN
        PERFORM x_jobs._require_worker(
            claim.worker, 'Pass an id unique to the worker process, such as host:pid:random.'
        );
    END IF;
    IF claim.lease IS NULL OR claim.lease <= interval '0' OR claim.lease > interval '1000 years' THEN
        PERFORM x_jobs._require_lease(
            claim.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
        );
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

    -- What the claim needs to know before it looks for rows, in one statement (a probe each):
    --   v_queues  the queues named, each once (a queue named twice would be two scans over one
    --             queue, and rows this statement locked are not skipped by itself: the repeat
    --             would spend slots on rows already picked), less the paused ones;
    --   v_fair    those of them that are fair (see x_jobs._claim_fair); one whose function or
    --             index is missing (a restored dump has the function, not the index) is claimed
    --             in FIFO order;
    --   v_rated   whether any has jobs parked for a rate limit's budget (job_rate_parked_idx);
    --   v_any_keyed  whether any has due rows with a concurrency key (their two indexes): if none,
    --                the window of keyed rows below is not read;
    --   v_fenced  whether the worker id is bound to the caller's login within the day. The
    --             fence (see x_jobs._fence): the first claim with an id binds it to the caller's
    --             login, and only that login claims, and then settles, with it. Claiming with
    --             another login's id would hand it rows it could settle in that worker's name,
    --             so that is refused (XJ052). An id bound within the day needs neither binding
    --             nor renewal;
    --   v_scoped  whether a tenant binding exists or x_jobs.tenant is set: only then is the
    --             caller's scope worked out (see the declaration of v_scope);
    --   v_any_rate  whether any rate limit exists: only then are the picked rows checked for a
    --             rate limit key (see x_jobs._park_picked_rated).
    SELECT coalesce(pg_catalog.array_agg(q.queue), '{}'),
           coalesce(pg_catalog.array_agg(q.queue) FILTER (WHERE q.fair), '{}'),
           coalesce(pg_catalog.bool_or(q.rated), FALSE),
           coalesce(pg_catalog.bool_or(q.keyed), FALSE),
           EXISTS (
               SELECT FROM x_jobs.worker_login AS l
               WHERE l.worker = claim.worker AND l.login = x_jobs._caller()
                   AND l.bound_at >= v_now - interval '1 day'
           ),
           EXISTS (SELECT FROM x_jobs.tenant_binding)
               OR pg_catalog.current_setting('x_jobs.tenant', TRUE) <> '',
           EXISTS (SELECT FROM x_jobs.rate_limit)
    INTO v_queues, v_fair, v_rated, v_any_keyed, v_fenced, v_scoped, v_any_rate
    FROM (
        SELECT DISTINCT q.queue,
               CASE WHEN EXISTS (SELECT FROM x_jobs.queue_policy AS f WHERE f.queue = q.queue AND f.fair)
                   THEN pg_catalog.to_regproc('x_jobs.' || x_jobs._fair_function(q.queue)) IS NOT NULL
                       AND pg_catalog.to_regclass('x_jobs.' || x_jobs._fair_index(q.queue)) IS NOT NULL
                   ELSE FALSE
               END AS fair,
               EXISTS (
                   SELECT FROM x_jobs.job_rate AS r
                   WHERE r.queue = q.queue AND r.parked_state IS NOT NULL
               ) AS rated,
               EXISTS (
                   SELECT FROM x_jobs.job AS j
                   WHERE j.queue = q.queue
                       AND j.state = 'ready' AND j.concurrency_key IS NOT NULL
               ) OR EXISTS (
                   SELECT FROM x_jobs.job AS j
                   WHERE j.queue = q.queue
                       AND j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
               ) AS keyed
        FROM unnest(claim.queues) AS q (queue)
        WHERE NOT EXISTS (SELECT FROM x_jobs.queue_pause AS p WHERE p.queue = q.queue)
    ) AS q;
    IF NOT v_fenced THEN
        PERFORM x_jobs._require_fence(claim.worker);
    END IF;
    IF v_scoped THEN
        v_scope := x_jobs._tenant_scope();
    END IF;

    -- While the server was down no holder could heartbeat: every lease that ran out meanwhile
    -- looks lapsed once it is back, and the first worker to reconnect took the jobs of the
    -- others, which still ran them (seen with a 3 s lease and an 8 s outage). So for one lease
    -- (this claim's) after the server took connections again, a lease last renewed before then
    -- is not taken as lapsed: its holder has that long to reconnect and renew it (a worker
    -- reconnects at least once a heartbeat interval). A holder that died meanwhile costs its
    -- jobs that much more wait. Counted from the end of recovery (_ready_since), not the
    -- postmaster's start: a crash recovery longer than the lease would use the grace up before
    -- any holder could connect, and a crash of one backend (the postmaster resets every
    -- process and recovers, without starting again) would give no grace at all. The lapsed arm asks
    -- for it only when it meets a lapsed lease (an InitPlan runs on first use), so a claim
    -- with none pays nothing for it.


    WHILE v_pass < 3 AND v_got < claim.qty AND pg_catalog.cardinality(v_queues) > 0 LOOP
        v_pass := v_pass + 1;
        v_want := claim.qty - v_got;
        v_granted := NULL;

        -- Jobs parked for a rate limit's budget (x_jobs.job_rate), on the first pass: those of
        -- keys with budget are restored, locked and their starts spent (see _claim_rated), and
        -- the arms below look for the rest of the slots. They go first, ahead of the other rows'
        -- claim order: a budget is there to be used while its window lasts. Whether any is
        -- parked in these queues is one probe of job_rate_parked_idx (v_rated), so a claim with
        -- none pays that and no more.
        v_rated_ids := ARRAY[]::bigint[];
        v_rated_at := ARRAY[]::tid[];
        IF v_pass = 1 AND v_rated THEN
            SELECT coalesce(pg_catalog.array_agg(r.o_id), ARRAY[]::bigint[]),
                   coalesce(pg_catalog.array_agg(r.o_at), ARRAY[]::tid[])
            INTO v_rated_ids, v_rated_at
            FROM x_jobs._claim_rated(v_queues, v_want, v_now) AS r;
            v_want := v_want - pg_catalog.cardinality(v_rated_ids);
        END IF;

        -- How many rows the ready arm may lock in each queue. Up to v_want in every queue, as
        -- the other arms, the outer LIMIT keeping v_want of them: over 10 queues with a backlog
        -- a claim of 50 locked 500 rows (a WAL record each), and took half again the time of a
        -- claim over one queue. So the first pass over several queues reads first, without
        -- locks, which queues hold the first v_want ready rows in claim order, and locks that
        -- many in each. A row another claimer holds is counted there and skipped below, where
        -- its queue's next row stands in; should a queue run out that way, the next pass locks
        -- as before, up to v_want in each.
        v_limits := pg_catalog.array_fill(v_want, ARRAY[pg_catalog.cardinality(v_queues)]);
        v_peeked := NULL;
        IF v_pass = 1 AND pg_catalog.cardinality(v_queues) > 1 THEN
            v_limits := ARRAY(
                SELECT count(t.queue)::integer
                FROM unnest(v_queues) WITH ORDINALITY AS q (queue, n)
                LEFT JOIN (
                    SELECT arm.queue
                    FROM unnest(v_queues) AS o (queue)
                    CROSS JOIN LATERAL (
                        SELECT j.queue, j.priority, j.run_at, j.id
                        FROM x_jobs.job AS j
                        WHERE j.queue = o.queue
                            AND j.state = 'ready' AND j.concurrency_key IS NULL
                            AND j.run_at <= v_now
                            AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                            AND o.queue <> ALL (v_fair)
                        ORDER BY j.priority, j.run_at, j.id
                        LIMIT v_want
                    ) AS arm
                    ORDER BY arm.priority, arm.run_at, arm.id
                    LIMIT v_want
                ) AS t ON t.queue = q.queue
                GROUP BY q.n
                ORDER BY q.n
            );
            v_peeked := (SELECT sum(l)::integer FROM unnest(v_limits) AS l);
        END IF;

        -- A fair queue's ready rows come from _claim_fair, in turns across its tenants, and
        -- not from the ready arm (whose limit is 0 there).
        v_fair_at := '{}';
        IF pg_catalog.cardinality(v_fair) > 0 THEN
            v_limits := ARRAY(
                SELECT CASE WHEN q.queue = ANY (v_fair) THEN 0 ELSE q.lim END
                FROM unnest(v_queues, v_limits) WITH ORDINALITY AS q (queue, lim, n)
                ORDER BY q.n
            );
            SELECT coalesce(pg_catalog.array_agg(f.o_at), '{}'),
                   coalesce(pg_catalog.array_agg(f.o_priority), '{}'),
                   coalesce(pg_catalog.array_agg(f.o_run_at), '{}'),
                   coalesce(pg_catalog.array_agg(f.o_seq), '{}')
            INTO v_fair_at, v_fair_priority, v_fair_run_at, v_fair_seq
            FROM unnest(v_fair) AS q (queue)
            CROSS JOIN LATERAL x_jobs._claim_fair(q.queue, v_want, v_now, v_scope) AS f;
        END IF;

        -- Rows with a concurrency key: the oldest due ones of each queue (ready ones in claim
        -- order, waiting ones in run_at order), ranked per key in grant order; each key's first
        -- ones up to its room are locked in claim order until v_want are held.
        v_window := 10 * v_want + 100;
        v_found := '{}';
        v_window_full := FALSE;
        -- Read only where the queues hold keyed rows (v_any_keyed): a statement saved otherwise.
        IF v_any_keyed THEN
            WITH win AS (
                SELECT o.queue, FALSE AS waiting, r.*
                FROM unnest(v_queues) AS o (queue)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.concurrency_limit
                    FROM x_jobs.job AS j
                    WHERE j.queue = o.queue
                        AND j.state = 'ready' AND j.concurrency_key IS NOT NULL
                        AND j.run_at <= v_now
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT v_window
                ) AS r
                UNION ALL
                SELECT o.queue, TRUE AS waiting, r.*
                FROM unnest(v_queues) AS o (queue)
                CROSS JOIN LATERAL (
                    SELECT j.id, j.priority, j.run_at, j.concurrency_key, j.concurrency_limit
                    FROM x_jobs.job AS j
                    WHERE j.queue = o.queue
                        AND j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NOT NULL
                        AND j.run_at <= v_now
                    ORDER BY j.run_at, j.id
                    LIMIT v_window
                ) AS r
            ),
            ranked AS (
                SELECT w.id, w.priority, w.run_at, w.concurrency_key, w.concurrency_limit,
                       pg_catalog.row_number() OVER (
                           PARTITION BY w.concurrency_key ORDER BY w.priority, w.run_at, w.id
                       ) AS rank
                FROM win AS w
                WHERE w.id <> ALL (v_seen)
            )
            SELECT coalesce((
                       SELECT pg_catalog.array_agg(t.id)
                       FROM (
                           SELECT l.id
                           FROM (
                               SELECT r.* FROM ranked AS r
                               WHERE r.rank <= r.concurrency_limit
                               ORDER BY r.priority, r.run_at, r.id
                           ) AS r
                           -- The key's running rows are counted here, for the rows reached in claim
                           -- order only: counted in the window they cost a seek per key in it.
                           CROSS JOIN LATERAL (
                               SELECT j.id FROM x_jobs.job AS j
                               WHERE j.id = r.id
                                   AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                                   AND j.state IN ('ready', 'delayed', 'suspended')
                                   AND j.run_at <= v_now
                                   AND r.rank <= r.concurrency_limit - (
                                       SELECT count(*) FROM x_jobs.job AS h
                                       WHERE h.concurrency_key = r.concurrency_key AND h.state = 'running'
                                   )
                               FOR UPDATE SKIP LOCKED
                           ) AS l
                           ORDER BY r.priority, r.run_at, r.id
                           LIMIT v_want
                       ) AS t
                   ), '{}'),
                   EXISTS (
                       SELECT FROM win AS w GROUP BY w.queue, w.waiting HAVING count(*) >= v_window
                   )
            INTO v_found, v_window_full;
        END IF;

        IF v_window_full AND pg_catalog.cardinality(v_found) < v_want THEN
            -- The windows are mostly rows of keys without room: visit the keys instead. Only keys
            -- with waiting rows in these queues, walked in key order through job_queue_key_idx
            -- (a seek per queue from one key to the next), at most v_window of them per pass, so
            -- that a claim costs the same beside 100 keys or 100,000, and never walks the keys
            -- of other queues.
            -- The walk starts after the key the session's last visit ended on, and wraps around:
            -- successive claims reach every key. What it trades, in this fallback only: rows are
            -- taken key by key in walk order, not in (priority, run_at, id) order across keys, and
            -- a key behind v_window others waits for a later claim of this session (a session
            -- that claims once starts at the first key each time).
            v_cursor := coalesce(pg_catalog.current_setting('x_jobs.claim_key_cursor', true), '');
            v_visit_keys := '{}';
            v_visit_lims := '{}';
            -- Two laps: the keys after the cursor, then from the first key up to the cursor.
            FOR v_lap IN 1..2 LOOP
                EXIT WHEN pg_catalog.cardinality(v_visit_keys) >= v_window
                    OR (v_lap = 2 AND v_cursor = '');
                SELECT v_visit_keys || coalesce(pg_catalog.array_agg(k.key ORDER BY k.n), '{}'),
                       v_visit_lims || coalesce(pg_catalog.array_agg(k.lim ORDER BY k.n), '{}')
                INTO v_visit_keys, v_visit_lims
                FROM (
                    WITH RECURSIVE keys AS (
                        SELECT s.key, s.lim, 1 AS n
                        FROM (
                            -- Keys are never empty, so '' is before the first one.
                            SELECT f.key, max(f.lim) AS lim
                            FROM unnest(v_queues) AS o (queue)
                            CROSS JOIN LATERAL (
                                SELECT j.concurrency_key AS key, j.concurrency_limit AS lim
                                FROM x_jobs.job AS j
                                WHERE j.queue = o.queue
                                    AND j.concurrency_key > CASE WHEN v_lap = 1 THEN v_cursor ELSE '' END
                                    AND j.concurrency_key IS NOT NULL
                                    AND j.state IN ('ready', 'delayed', 'suspended')
                                ORDER BY j.concurrency_key, j.concurrency_limit DESC
                                LIMIT 1
                            ) AS f
                            GROUP BY f.key
                            ORDER BY f.key
                            LIMIT 1
                        ) AS s
                        UNION ALL
                        SELECT s.key, s.lim, k.n + 1
                        FROM keys AS k
                        CROSS JOIN LATERAL (
                            -- The next key of any of these queues, with the highest limit its rows
                            -- there carry (the index holds the limits of a key highest first):
                            -- no row of the key can run while its running rows reach that.
                            SELECT f.key, max(f.lim) AS lim
                            FROM unnest(v_queues) AS o (queue)
                            CROSS JOIN LATERAL (
                                SELECT j.concurrency_key AS key, j.concurrency_limit AS lim
                                FROM x_jobs.job AS j
                                WHERE j.queue = o.queue
                                    AND j.concurrency_key > k.key
                                    AND j.concurrency_key IS NOT NULL
                                    AND j.state IN ('ready', 'delayed', 'suspended')
                                ORDER BY j.concurrency_key, j.concurrency_limit DESC
                                LIMIT 1
                            ) AS f
                            GROUP BY f.key
                            ORDER BY f.key
                            LIMIT 1
                        ) AS s
                        WHERE k.n < v_window - pg_catalog.cardinality(v_visit_keys)
                            AND (v_lap = 1 OR k.key < v_cursor)
                    )
                    SELECT k.key, k.lim, k.n
                    FROM keys AS k
                    WHERE v_lap = 1 OR k.key <= v_cursor
                ) AS k;
            END LOOP;

            -- Of each key visited that has room by its highest limit, rank its first due rows in
            -- these queues in grant order and keep those whose own limit leaves room at their
            -- rank, as the window does (a row of a lower limit ahead, one from before the limit
            -- was raised, does not hide them). Ranks beyond the highest limit less the running
            -- rows cannot have room, so at most that many rows are read per queue (and at most
            -- v_window), plus ten to step over rows not due yet that rank ahead (a better
            -- priority). Locked key by key, in walk order, until enough are held.
            SELECT v_found || coalesce(pg_catalog.array_agg(t.id), '{}'), max(t.n)
            INTO v_found, v_last
            FROM (
                SELECT l.id, k.n
                FROM unnest(v_visit_keys, v_visit_lims) WITH ORDINALITY AS k (key, lim, n)
                CROSS JOIN LATERAL (
                    SELECT count(*) AS running FROM x_jobs.job AS h
                    WHERE h.concurrency_key = k.key AND h.state = 'running'
                ) AS b
                CROSS JOIN LATERAL (
                    SELECT r.id
                    FROM (
                        SELECT e.id, e.concurrency_limit,
                               pg_catalog.row_number() OVER (ORDER BY e.priority, e.run_at, e.id) AS rank
                        FROM unnest(v_queues) AS o (queue)
                        CROSS JOIN LATERAL (
                            SELECT e.id, e.priority, e.run_at, e.concurrency_limit
                            FROM x_jobs.job AS e
                            WHERE e.concurrency_key = k.key
                                AND e.queue = o.queue
                                AND e.concurrency_key IS NOT NULL
                                AND e.state IN ('ready', 'delayed', 'suspended')
                                AND e.id <> ALL (v_seen)
                                AND e.id <> ALL (v_found)
                            ORDER BY e.priority, e.run_at, e.id
                            LIMIT LEAST(GREATEST(k.lim - b.running, 0), v_window) + 10
                        ) AS e
                        WHERE e.run_at <= v_now
                    ) AS r
                    WHERE k.lim > b.running
                        AND r.rank <= r.concurrency_limit - b.running
                ) AS c
                CROSS JOIN LATERAL (
                    SELECT j.id FROM x_jobs.job AS j
                    WHERE j.id = c.id
                        AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                        AND j.state IN ('ready', 'delayed', 'suspended')
                        AND j.run_at <= v_now
                    FOR UPDATE SKIP LOCKED
                ) AS l
                LIMIT v_want - pg_catalog.cardinality(v_found)
            ) AS t;

            -- The next visit starts after the last key this one took a row of when it got enough
            -- (the keys after it get their turn before it comes again), else after the last key
            -- it walked.
            IF pg_catalog.cardinality(v_visit_keys) > 0 THEN
                PERFORM pg_catalog.set_config('x_jobs.claim_key_cursor',
                    v_visit_keys[CASE WHEN pg_catalog.cardinality(v_found) >= v_want THEN v_last
                                      ELSE pg_catalog.cardinality(v_visit_keys) END],
                    FALSE);
            END IF;
        END IF;

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
            FROM unnest(v_queues, v_limits) AS o (queue, lim)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at, 0 AS fair_seq
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'ready' AND j.concurrency_key IS NULL
                    AND j.run_at <= v_now
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                ORDER BY j.priority, j.run_at, j.id
                LIMIT o.lim
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at, 0 AS fair_seq
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state IN ('delayed', 'suspended') AND j.concurrency_key IS NULL
                    AND j.run_at <= v_now
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                ORDER BY j.run_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            UNION ALL
            -- Locked above already.
            SELECT j.id, j.priority, j.run_at, FALSE AS lapsed, FALSE AS exhausted,
                   j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at, 0 AS fair_seq
            FROM x_jobs.job AS j
            WHERE j.id = ANY (v_found)
            UNION ALL
            -- Locked by _claim_fair, with the claim order it gave them.
            SELECT j.id, f.priority, f.run_at, FALSE AS lapsed, FALSE AS exhausted,
                   j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at, f.seq AS fair_seq
            FROM unnest(v_fair_at, v_fair_priority, v_fair_run_at, v_fair_seq) AS f (at, priority, run_at, seq)
            JOIN x_jobs.job AS j ON j.ctid = f.at
            WHERE j.ctid = ANY (v_fair_at)
            UNION ALL
            SELECT arm.*
            FROM unnest(v_queues) AS o (queue)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at, TRUE AS lapsed,
                       j.attempt >= j.max_attempts AS exhausted,
                       j.concurrency_key, j.attempt, j.claimed_by, j.ctid AS at, 0 AS fair_seq
                FROM x_jobs.job AS j
                WHERE j.queue = o.queue
                    AND j.state = 'running'
                    AND j.visible_at <= v_now
                    AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
                    AND (j.updated_at >= (SELECT x_jobs._ready_since())
                        OR v_now >= (SELECT x_jobs._ready_since()) + claim.lease)
                ORDER BY j.visible_at, j.id
                LIMIT v_want
                FOR UPDATE SKIP LOCKED
            ) AS arm
            ORDER BY 2, 3, 10, 1
            LIMIT v_want
        ) AS c;

        -- Nothing to take; or, on a first pass that read its limits, nothing free under them.
        EXIT WHEN v_picked = 0 AND coalesce(v_peeked, 0) < v_want
            AND pg_catalog.cardinality(v_rated_ids) = 0;

        -- A job that names a rate limit key and came due by a path that did not park it (a
        -- lapsed lease, a resumed suspension, an operator's retry) starts only on its key's
        -- budget: it waits parked again rather than be taken here (a lapse is logged and counted
        -- below as any other). Only where some rate limit exists (v_any_rate).
        -- (The arms see the rows _claim_rated restored, in this transaction: those are not
        -- parked again.)
        IF v_any_rate AND pg_catalog.cardinality(v_take) > 0 THEN
            v_parked := x_jobs._park_picked_rated(ARRAY(
                SELECT t.id FROM unnest(v_take) AS t (id) WHERE t.id <> ALL (v_rated_ids)
            ));
            IF pg_catalog.cardinality(v_parked) > 0 THEN
                SELECT coalesce(pg_catalog.array_agg(t.id ORDER BY t.n), '{}'),
                       coalesce(pg_catalog.array_agg(t.at ORDER BY t.n), '{}')
                INTO v_take, v_take_at
                FROM unnest(v_take, v_take_at) WITH ORDINALITY AS t (id, at, n)
                WHERE t.id <> ALL (v_parked);
            END IF;
        END IF;

        -- The jobs _claim_rated restored and spent budget on are claimed whatever else happens.
        v_take := v_take || v_rated_ids;
        v_take_at := v_take_at || v_rated_at;

        IF pg_catalog.cardinality(v_keyed) > 0 THEN
            -- Serialize the claimers of each key, then count its running rows afresh: this
            -- statement's snapshot is taken after the locks, so it sees every claim that held
            -- them before. The rows not granted stay locked, unclaimed, until this call ends.
            -- It only tries, and leaves the rows of a key it cannot have now to other claims: a
            -- claim never waits for another claimer. Waiting, in key order, would stall every
            -- claimer of a key behind a claim made in a long transaction, and deadlock two
            -- claims whose keys' hashes collided (the lock is taken on the hash, and text order
            -- is not hash order).
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
            -- In claim order; over a fair queue, in the order of the turns that picked them (the
            -- order of v_take), so that a worker that runs a claim's rows one after another
            -- keeps to the turns.
            SELECT * FROM claimed AS c
            ORDER BY CASE WHEN pg_catalog.cardinality(v_fair_at) > 0 THEN pg_catalog.array_position(v_take, c.id) END,
                     c.priority, c.run_at, c.id;
        ELSE
            -- Buried rows are answered after every claimed one, so they wait for the last pass.
            WITH buried AS (
                UPDATE x_jobs.job AS j
                SET state = CASE WHEN j.dead_letter THEN 'dead' ELSE 'failed' END::x_jobs.job_state,
                    visible_at = NULL,
                    claimed_by = NULL,
                    -- No attempt is left to run the compensations (code in the handler) of the
                    -- steps it completed: name those steps, as a final attempt that did not reach
                    -- them does, so that an operator knows what to undo by hand.
                    last_error = 'lease lapsed on the final attempt' || coalesce((
                        SELECT pg_catalog.format(
                            ': steps %s completed and their compensations, if any, did not run',
                            pg_catalog.string_agg(pg_catalog.quote_literal(s.name), ', ' ORDER BY s.created_at, s.name))
                        FROM x_jobs.step AS s
                        WHERE s.job_id = j.id AND s.kind = 'run' AND NOT s.compensation AND s.status = 'done'
                            AND NOT EXISTS (
                                SELECT FROM x_jobs.step AS c
                                WHERE c.job_id = s.job_id AND c.name = s.name AND c.compensation
                            )
                        HAVING count(*) > 0
                    ), ''),
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
                       -- Taken again, or parked for its rate limit's budget (see above).
                       count(*) FILTER (WHERE l.state IN ('running', 'delayed')),
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
            SELECT (SELECT pg_catalog.array_agg(ROW(c.*)::x_jobs.job ORDER BY
                        CASE WHEN pg_catalog.cardinality(v_fair_at) > 0 THEN pg_catalog.array_position(v_take, c.id) END,
                        c.priority, c.run_at, c.id)
                    FROM claimed AS c),
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
            AND pg_catalog.cardinality(v_keyed) = coalesce(v_granted, 0)
            -- Short for a queue that ran out under the limit the first pass read for it?
            AND coalesce(v_peeked, 0) < v_want;
    END LOOP;

    IF pg_catalog.cardinality(v_buried_all) > 0 THEN
        RETURN QUERY SELECT * FROM unnest(v_buried_all);
    END IF;
END
$$;

-- The heartbeat: push the lease of the running rows `worker` holds among `ids` to now + lease.
-- Answers the ids still held; an id missing from the answer was lost (lapsed and re-claimed,
-- cancelled, or settled), and its body should stop. As complete_many: `worker` must be the
-- caller's (x_jobs._fence), and with `attempts` (one per id) a row only at its attempt.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.extend_lease(
    ids bigint[],
    worker text,
    lease interval DEFAULT '30 seconds',
    attempts integer[] DEFAULT NULL
)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
-- A bitmap scan of the ids would lock the rows in the table's order, not in id order.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- A bound worker settles its tenants' rows only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
    v_attempts jsonb;
BEGIN
    PERFORM x_jobs._require_worker(extend_lease.worker, 'Pass the id the worker claimed with.');
    PERFORM x_jobs._require_lease(
        extend_lease.lease, 'Pass a lease longer than the heartbeat interval, such as ''30 seconds''.'
    );
    PERFORM x_jobs._require_attempts(extend_lease.ids, extend_lease.attempts);
    v_attempts := x_jobs._attempt_map(extend_lease.ids, extend_lease.attempts);
    IF NOT x_jobs._fence(extend_lease.worker) THEN
        RETURN;
    END IF;

    RETURN QUERY
    UPDATE x_jobs.job AS j
    SET visible_at = v_now + extend_lease.lease,
        updated_at = v_now
    WHERE j.id = ANY (extend_lease.ids)
        AND j.state::text = 'running' -- by id only: see job_running_idx
        AND j.claimed_by = extend_lease.worker
        AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
        AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
    RETURNING j.id;
END
$$;

-- Hand running jobs back: the worker holding them stops without running them to the end (a
-- drain whose grace ran out, a shutdown). They are due again at once, in their old place in the
-- queue (run_at is kept), and the interrupted attempt is not counted, so that deploys cannot
-- use up a job's attempts. Answers the ids released; those the worker no longer held are left.
-- As complete_many: `worker` must be the caller's (x_jobs._fence), and with `attempts` (one
-- per id) a row only at its attempt.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.release(ids bigint[], worker text, attempts integer[] DEFAULT NULL)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- Planned for a batch of any size, as complete_many is (see there).
SET plan_cache_mode = force_generic_plan
-- Index plans only: they lock the rows in id order, as complete_many does (see there).
SET enable_seqscan = off
-- A bitmap scan of the ids would lock the rows in the table's order, not in id order.
SET enable_bitmapscan = off
AS $$
#variable_conflict use_column
DECLARE
    -- A bound worker settles its tenants' rows only (see x_jobs._tenant_scope).
    v_scope text[] := x_jobs._tenant_scope();
    v_now timestamptz := x_jobs.now();
    v_queues text[];
    v_ids bigint[];
    v_attempts jsonb;
BEGIN
    PERFORM x_jobs._require_worker(release.worker, 'Pass the id the worker claimed with.');
    PERFORM x_jobs._require_attempts(release.ids, release.attempts);
    v_attempts := x_jobs._attempt_map(release.ids, release.attempts);
    IF NOT x_jobs._fence(release.worker) THEN
        RETURN;
    END IF;

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
            AND (v_attempts IS NULL OR coalesce((v_attempts ->> j.id::text)::integer, j.attempt) = j.attempt)
            AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(r.id), '{}'),
           coalesce(pg_catalog.array_agg(DISTINCT r.queue), '{}')
    INTO v_ids, v_queues
    FROM released AS r;
    -- A released job that names a rate limit key waits for the key's budget again.
    IF pg_catalog.cardinality(v_ids) > 0 THEN
        PERFORM x_jobs._repark_rated(v_ids);
    END IF;

    -- Another worker should take them now, not at its next poll.
    PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', q.queue))
        FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT unnest(v_ids);
END
$$;

-- Tests: tests/pgtap/20-claim.sql, tests/pgtap/21-claim-keys.sql, tests/pgtap/32-extend-lease.sql,
--        tests/pgtap/33-release.sql, tests/python/test_plan.py, tests/python/test_claim_race.py,
--        tests/python/test_lease.py, tests/python/test_restart_grace.py,
--        tests/python/test_failover.py
