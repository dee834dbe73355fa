------------------------------------------------------------------------------------------------
-- Functions: fair queues
------------------------------------------------------------------------------------------------

-- The name of a fair queue's index on x_jobs.job (see set_queue_policy): from a hash of the
-- queue's name, which may be up to 200 characters of anything, where an index name is 63 bytes.
CREATE FUNCTION x_jobs._fair_index(p_queue text)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'job_fair_' || pg_catalog.left(pg_catalog.md5(p_queue), 20) || '_idx'
$$;

-- Every queue with a policy: whether it is fair, its tenants' weights (an object, tenant to
-- rows a turn), its index, whether that and the queue's function are there and the index valid
-- (a dump restored elsewhere keeps the policy but not the index: set the policy again to make
-- it), and who set it when.
-- SECURITY DEFINER: workers, monitors and the CLI read policies without rights on the tables.
CREATE FUNCTION x_jobs.queue_policies()
RETURNS TABLE (
    queue text,
    fair boolean,
    weights jsonb,
    fair_index text,
    index_ready boolean,
    updated_at timestamptz,
    updated_by text
)
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT p.queue, p.fair,
           coalesce((
               SELECT pg_catalog.jsonb_object_agg(w.tenant_id, w.weight)
               FROM x_jobs.queue_weight AS w
               WHERE w.queue = p.queue
           ), '{}'::jsonb),
           CASE WHEN p.fair THEN x_jobs._fair_index(p.queue) END,
           CASE WHEN p.fair THEN EXISTS (
               SELECT FROM pg_catalog.pg_class AS c
               JOIN pg_catalog.pg_index AS i ON i.indexrelid = c.oid
               WHERE c.relname = x_jobs._fair_index(p.queue)
                   AND c.relnamespace = 'x_jobs'::regnamespace
                   AND i.indisvalid
           ) AND pg_catalog.to_regproc('x_jobs.' || x_jobs._fair_function(p.queue)) IS NOT NULL END,
           p.updated_at, p.updated_by
    FROM x_jobs.queue_policy AS p
    ORDER BY p.queue COLLATE "C"
$$;

-- Set the policy of `queue`. fair => true: its claims take ready rows round-robin across
-- tenants (see x_jobs._claim_fair); false: in the claim's FIFO order again; NULL keeps it.
-- weights (an object, tenant to a whole number of rows a turn from 1 to 1000) replaces the
-- queue's weights; '{}' clears them, NULL keeps them. Answers the queue's policy row
-- (x_jobs.queue_policies has its weights and index too).
--
-- Making a queue fair builds its index, a partial index of x_jobs.job on that queue's ready rows
-- without a concurrency key, tenant first: what lets a claim step from one tenant to the next
-- with a seek. It is the queue's alone, so no other queue's enqueue or claim writes to it. And
-- it makes the queue's function, the claim's statements with the queue's name in them (see
-- _claim_fair); a queue without either (a restored dump has the function, not the index) is
-- claimed in FIFO order. The
-- build reads the table and holds off writes to it until this call's transaction commits (a
-- CREATE INDEX, not CONCURRENTLY, which no function may run): set a policy when the table is
-- quiet, or before the queue fills. Ending fairness drops the index and the function.
-- SECURITY DEFINER: the index is made on the owner's table, the function is the owner's (the
-- claim runs it as the owner), and admins hold no right to write the policy tables (every
-- change goes through the checks here).
CREATE FUNCTION x_jobs.set_queue_policy(queue text, fair boolean DEFAULT NULL, weights jsonb DEFAULT NULL)
RETURNS x_jobs.queue_policy
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_queue text := set_queue_policy.queue;
    v_fair boolean;
    v_bad text;
    v_row x_jobs.queue_policy;
BEGIN
    -- A queue is every tenant's: a bound role may not change how it serves the others.
    IF x_jobs._tenant_scope() IS NOT NULL THEN
        PERFORM x_jobs._refuse_cross_tenant('set a queue''s policy', NULL);
    END IF;
    -- The names enqueue accepts: 1 to 200 characters.
    IF v_queue IS NULL OR v_queue = '' OR pg_catalog.length(v_queue) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ002',
            MESSAGE = pg_catalog.format('X_QUEUE_INVALID: queue %s is not a queue name',
                coalesce(pg_catalog.quote_literal(v_queue), 'NULL')),
            HINT = 'Name the queue (1 to 200 characters), such as ''default''.';
    END IF;
    IF set_queue_policy.weights IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(set_queue_policy.weights) <> 'object' THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ066',
                MESSAGE = pg_catalog.format('X_QUEUE_POLICY_INVALID: weights %s is not a JSON object',
                    pg_catalog.left(set_queue_policy.weights::text, 200)),
                HINT = 'Pass weights as an object of tenant to rows a turn, such as ''{"acme": 3}''.';
        END IF;
        SELECT pg_catalog.format('%s: %s', pg_catalog.to_jsonb(e.key), pg_catalog.left(e.value::text, 100))
        INTO v_bad
        FROM pg_catalog.jsonb_each(set_queue_policy.weights) AS e
        WHERE e.key = '' OR pg_catalog.length(e.key) > 200
            OR pg_catalog.jsonb_typeof(e.value) <> 'number'
            OR e.value::text !~ '^[0-9]+$'
            OR e.value::numeric NOT BETWEEN 1 AND 1000
        LIMIT 1;
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ066',
                MESSAGE = pg_catalog.format('X_QUEUE_POLICY_INVALID: weight %s is not a tenant id with a whole number from 1 to 1000', v_bad),
                HINT = 'Give each tenant (1 to 200 characters) the rows it takes a turn, 1 to 1000; 1 is every tenant''s without a weight.';
        END IF;
    END IF;

    v_fair := coalesce(
        set_queue_policy.fair,
        (SELECT p.fair FROM x_jobs.queue_policy AS p WHERE p.queue = v_queue),
        FALSE
    );
    INSERT INTO x_jobs.queue_policy AS p (queue, fair, updated_at, updated_by)
    VALUES (v_queue, v_fair, x_jobs.now(), x_jobs._caller())
    ON CONFLICT ON CONSTRAINT queue_policy_pkey DO UPDATE
    SET fair = excluded.fair, updated_at = excluded.updated_at, updated_by = excluded.updated_by
    RETURNING p.* INTO v_row;
    IF set_queue_policy.weights IS NOT NULL THEN
        DELETE FROM x_jobs.queue_weight AS w WHERE w.queue = v_queue;
        INSERT INTO x_jobs.queue_weight (queue, tenant_id, weight)
        SELECT v_queue, e.key, e.value::integer
        FROM pg_catalog.jsonb_each_text(set_queue_policy.weights) AS e;
    END IF;

    -- The predicate is the claim's (_claim_fair) word for word, with the queue as a literal:
    -- the planner uses a partial index only where it can prove the predicate.
    IF v_fair THEN
        EXECUTE pg_catalog.format(
            'CREATE INDEX IF NOT EXISTS %I ON x_jobs.job (tenant_id, priority, run_at, id) '
            'WHERE queue = %L AND state = ''ready'' AND concurrency_key IS NULL',
            x_jobs._fair_index(v_queue), v_queue
        );
        -- The queue's claim statements (see _claim_fair); run by the claim only, as its owner.
        EXECUTE x_jobs._fair_source(v_queue);
        EXECUTE pg_catalog.format(
            'REVOKE ALL ON FUNCTION x_jobs.%I(text, integer, timestamptz, text[], integer) FROM PUBLIC',
            x_jobs._fair_function(v_queue)
        );
        -- DROP EXTENSION drops it with the schema (it is no member: made after the scripts ran).
        IF EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'x_jobs') THEN
            EXECUTE pg_catalog.format(
                'ALTER FUNCTION x_jobs.%I(text, integer, timestamptz, text[], integer) DEPENDS ON EXTENSION x_jobs',
                x_jobs._fair_function(v_queue)
            );
        END IF;
    ELSE
        EXECUTE pg_catalog.format(
            'DROP FUNCTION IF EXISTS x_jobs.%I(text, integer, timestamptz, text[], integer)',
            x_jobs._fair_function(v_queue)
        );
        EXECUTE pg_catalog.format('DROP INDEX IF EXISTS x_jobs.%I', x_jobs._fair_index(v_queue));
    END IF;

    RETURN v_row;
END
$$;

-- The claim's part for a fair queue: lock up to `p_want` of `p_queue`'s ready rows without a
-- concurrency key, round-robin across its tenants, for x_jobs.claim to hand out. Called by the
-- claim only, in its transaction (the rows stay locked until it ends).
--
-- A turn: each tenant with ready rows, in tenant order, takes its first rows in (priority,
-- run_at, id) order, its weight's worth (x_jobs.queue_weight, 1 when absent); turns go on until
-- p_want rows are taken. So A A A A B B C is taken A B C A B A A, and a tenant's million rows
-- delay another's first row by at most one turn of the tenants between them.
--
-- The cost stays flat however many tenants there are: the claim visits at most p_want tenants
-- (a tenant visited takes a row, or p_want would be reached sooner), stepping from one to the
-- next with a seek in the queue's index (a loose index scan: x_jobs._fair_index), and reads at
-- most a few rows of each (the most a tenant can take when the others take one each). It starts
-- where the session's last claim of the queue ended its turns (the cursor, kept per queue in
-- the session setting x_jobs.claim_fair_cursor: the tenant, and the rows it took of its turn)
-- and wraps around, so successive claims of a session go round every tenant; workers of other
-- sessions go round on their own (each takes its turns in its own order, and the tenants share
-- every worker). A session's first claim starts after the tenant claimed last by any session
-- (see below), so that sessions that claim once each (a pool that resets them) go round too. A
-- bound worker (p_scope) visits its tenants only, by probe, never reading another's rows.
--
-- The statements are the queue's own function (x_jobs._fair_function, made with its index by
-- set_queue_policy, see _fair_source): the queue's name must be a literal in them for the
-- planner to use its index, and a function's statements are planned once a session, where an
-- EXECUTE of them would be planned at every call (three times the cost of the claim).
--
-- Answers the rows locked in turn order (o_seq) with the (priority, run_at) of the picks in
-- claim order given to them in turn order: so the queue competes with the claim's other arms
-- and queues for as many of the slots as FIFO order would give it, and which of its rows fill
-- them is decided by the turns.
CREATE FUNCTION x_jobs._claim_fair(p_queue text, p_want integer, p_now timestamptz, p_scope text[])
RETURNS TABLE (o_at tid, o_priority smallint, o_run_at timestamptz, o_seq integer)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cursors jsonb := coalesce(
        NULLIF(pg_catalog.current_setting('x_jobs.claim_fair_cursor', TRUE), ''), '{}'
    )::jsonb;
    -- The cursor: [the tenant the last turn ended on, how many rows it took in that turn].
    v_cursor jsonb;
    v_tenant text := '';
    v_spent integer := 0;
    v_last jsonb;
    v_at tid[];
    v_priority smallint[];
    v_run_at timestamptz[];
BEGIN
    -- Where the walk starts: at the cursor's tenant while its turn goes on (it took fewer rows
    -- than its weight), else after it (it comes last, in the lap from the first tenant).
    v_cursor := CASE WHEN pg_catalog.jsonb_typeof(v_cursors -> p_queue) = 'array' THEN v_cursors -> p_queue END;
    IF v_cursor IS NOT NULL THEN
        v_tenant := v_cursor ->> 0;
        v_spent := (v_cursor ->> 1)::integer;
        IF v_spent >= coalesce((
            SELECT w.weight FROM x_jobs.queue_weight AS w WHERE w.queue = p_queue AND w.tenant_id = v_tenant
        ), 1) THEN
            v_spent := 0;
        END IF;
    ELSE
        -- A session's first claim of the queue (a new connection, one a pool reset) starts after
        -- the tenant whose row was claimed last, by any session (the running row with the latest
        -- lease: one backward step of job_running_idx), so that sessions that claim once each
        -- still go round the tenants rather than all serve the first one.
        v_tenant := coalesce((
            SELECT j.tenant_id FROM x_jobs.job AS j
            WHERE j.queue = p_queue AND j.state = 'running'
            ORDER BY j.visible_at DESC, j.id DESC
            LIMIT 1
        ), '');
    END IF;

    EXECUTE pg_catalog.format('SELECT * FROM x_jobs.%I($1, $2, $3, $4, $5)', x_jobs._fair_function(p_queue))
    INTO v_at, v_priority, v_run_at, v_last
    USING v_tenant, p_want, p_now, p_scope, v_spent;

    RETURN QUERY
    SELECT p.at, p.priority, p.run_at, p.seq::integer
    FROM unnest(v_at, v_priority, v_run_at) WITH ORDINALITY AS p (at, priority, run_at, seq);

    -- The next claim of the queue in this session starts where this one's last turn ended.
    IF v_last IS NOT NULL THEN
        PERFORM pg_catalog.set_config('x_jobs.claim_fair_cursor',
            pg_catalog.jsonb_set(v_cursors, ARRAY[p_queue], v_last)::text, FALSE);
    END IF;
END
$$;

-- The name of a fair queue's function (see _claim_fair), from a hash of its name as the index's.
CREATE FUNCTION x_jobs._fair_function(p_queue text)
RETURNS text
LANGUAGE sql
IMMUTABLE
STRICT
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '_claim_fair_' || pg_catalog.left(pg_catalog.md5(p_queue), 20)
$$;

-- The CREATE FUNCTION statement of a fair queue's function (see _claim_fair): its arguments are
-- the cursor's tenant, the rows wanted, the claim's time, the caller's scope (NULL: every
-- tenant) and the rows the cursor's tenant took of its turn already (0: its turn is over, and
-- the walk starts after it); it answers the locked rows' ctids, in turn order, the (priority,
-- run_at) pairs of the picks in claim order, and the new cursor. Four statements, one for each
-- way the walk starts (scoped or not, at the cursor's tenant or after it), from one template.
CREATE FUNCTION x_jobs._fair_source(p_queue text)
RETURNS text
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $source$
DECLARE
    -- Tenants with ready rows in the queue, from the cursor then from the first up to it, at
    -- most p_want: a seek each from one to the next (%2$s and %3$s: where each lap starts and
    -- stops, with or without the cursor's tenant).
    v_walk constant text := $walk$
        after AS (
            (SELECT j.tenant_id AS tenant, 1 AS n
             FROM x_jobs.job AS j
             WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                 AND j.tenant_id %2$s p_tenant
             ORDER BY j.tenant_id
             LIMIT 1)
            UNION ALL
            SELECT s.tenant, a.n + 1
            FROM after AS a
            CROSS JOIN LATERAL (
                SELECT j.tenant_id AS tenant
                FROM x_jobs.job AS j
                WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                    AND j.tenant_id > a.tenant
                ORDER BY j.tenant_id
                LIMIT 1
            ) AS s
            WHERE a.n < p_want
        ),
        upto AS (
            (SELECT j.tenant_id AS tenant, 1 AS n
             FROM x_jobs.job AS j
             WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                 AND j.tenant_id %3$s p_tenant
                 AND (SELECT count(*) FROM after) < p_want
             ORDER BY j.tenant_id
             LIMIT 1)
            UNION ALL
            SELECT s.tenant, u.n + 1
            FROM upto AS u
            CROSS JOIN LATERAL (
                SELECT j.tenant_id AS tenant
                FROM x_jobs.job AS j
                WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                    AND j.tenant_id > u.tenant AND j.tenant_id %3$s p_tenant
                ORDER BY j.tenant_id
                LIMIT 1
            ) AS s
            WHERE u.n < p_want - (SELECT count(*) FROM after)
        ),
        visited AS (
            SELECT a.tenant, a.n FROM after AS a
            UNION ALL
            SELECT u.tenant, u.n + (SELECT count(*) FROM after) FROM upto AS u
        )
    $walk$;
    -- A bound caller's: the scope's tenants with a ready row, in the same order.
    v_walk_scoped constant text := $walk$
        visited AS (
            SELECT s.tenant, pg_catalog.row_number() OVER (ORDER BY s.tenant %3$s p_tenant, s.tenant) AS n
            FROM (SELECT DISTINCT t.tenant FROM unnest(p_scope) AS t (tenant)) AS s
            WHERE EXISTS (
                SELECT FROM x_jobs.job AS j
                WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                    AND j.tenant_id = s.tenant
            )
            ORDER BY s.tenant %3$s p_tenant, s.tenant
            LIMIT p_want
        )
    $walk$;
    -- How many rows each visited tenant takes: its first rows, read without locks and ranked,
    -- in turn order until p_want (at most the few a tenant can take are read of it). Then that
    -- many of its rows, locked as they are read: SKIP LOCKED steps over a row another claimer
    -- holds and the tenant's next one stands in (as in the claim's arms), so racing claimers
    -- take different rows, and no row is locked that the claim does not take.
    v_pick constant text := $pick$
        WITH RECURSIVE %2$s,
        counted AS (SELECT count(*)::integer AS tenants FROM visited),
        weighted AS (
            SELECT v.n, v.tenant,
                   coalesce((
                       SELECT q.weight FROM x_jobs.queue_weight AS q
                       WHERE q.queue = %1$L AND q.tenant_id = v.tenant
                   ), 1) AS weight,
                   -- The cursor's tenant, when its turn goes on, took p_spent rows of it already.
                   CASE WHEN v.tenant = p_tenant THEN p_spent ELSE 0 END AS spent
            FROM visited AS v
        ),
        -- Whether the shares follow from the count alone: one tenant takes them all; as many
        -- tenants as rows wanted, none weighted, take one each.
        plain AS (
            SELECT c.tenants = 1
                OR (c.tenants = p_want AND NOT EXISTS (SELECT FROM weighted AS w WHERE w.weight > 1)) AS known
            FROM counted AS c
        ),
        shares AS (
            SELECT w.n, w.tenant, w.weight, w.spent, CASE WHEN c.tenants = 1 THEN p_want ELSE 1 END AS take
            FROM weighted AS w
            CROSS JOIN counted AS c
            CROSS JOIN plain AS k
            WHERE k.known
            UNION ALL
            SELECT t.n, t.tenant, t.weight, t.spent, count(*) AS take
            FROM (
                SELECT w.n, w.tenant, w.weight, w.spent
                FROM weighted AS w
                CROSS JOIN counted AS c
                CROSS JOIN plain AS k
                CROSS JOIN LATERAL (
                    SELECT pg_catalog.row_number() OVER (ORDER BY r.priority, r.run_at, r.id) AS rank
                    FROM (
                        SELECT j.priority, j.run_at, j.id
                        FROM x_jobs.job AS j
                        WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                            AND j.tenant_id = w.tenant
                            AND j.run_at <= p_now
                        ORDER BY j.priority, j.run_at, j.id
                        LIMIT LEAST(p_want, GREATEST(w.weight, p_want - c.tenants + 1))
                    ) AS r
                ) AS e
                WHERE NOT k.known
                ORDER BY (e.rank - 1 + w.spent) / w.weight, w.n, e.rank
                LIMIT p_want
            ) AS t
            GROUP BY t.n, t.tenant, t.weight, t.spent
        ),
        locked AS MATERIALIZED (
            SELECT s.n, s.tenant, e.at, e.priority, e.run_at, e.id,
                   (e.rank - 1 + s.spent) %% s.weight + 1 AS place,
                   pg_catalog.row_number() OVER (
                       ORDER BY (e.rank - 1 + s.spent) / s.weight, s.n, e.rank
                   ) AS turn
            FROM shares AS s
            CROSS JOIN LATERAL (
                SELECT r.at, r.priority, r.run_at, r.id,
                       pg_catalog.row_number() OVER (ORDER BY r.priority, r.run_at, r.id) AS rank
                FROM (
                    SELECT j.ctid AS at, j.priority, j.run_at, j.id
                    FROM x_jobs.job AS j
                    WHERE j.queue = %1$L AND j.state = 'ready' AND j.concurrency_key IS NULL
                        AND j.tenant_id = s.tenant
                        AND j.run_at <= p_now
                    ORDER BY j.priority, j.run_at, j.id
                    LIMIT s.take
                    FOR UPDATE SKIP LOCKED
                ) AS r
            ) AS e
        ),
        turns AS (
            SELECT l.at, l.tenant, l.place, pg_catalog.row_number() OVER (ORDER BY l.turn) AS seq
            FROM locked AS l
        ),
        keys AS (
            SELECT l.priority, l.run_at,
                   pg_catalog.row_number() OVER (ORDER BY l.priority, l.run_at, l.id) AS seq
            FROM locked AS l
        )
        SELECT pg_catalog.array_agg(t.at ORDER BY t.seq),
               pg_catalog.array_agg(k.priority ORDER BY t.seq),
               pg_catalog.array_agg(k.run_at ORDER BY t.seq),
               (pg_catalog.array_agg(pg_catalog.jsonb_build_array(t.tenant, t.place) ORDER BY t.seq DESC))[1]
        INTO o_at, o_priority, o_run_at, o_last
        FROM turns AS t
        JOIN keys AS k ON k.seq = t.seq;
    $pick$;
BEGIN
    RETURN pg_catalog.format(
        $fn$CREATE OR REPLACE FUNCTION x_jobs.%1$I(
    p_tenant text, p_want integer, p_now timestamptz, p_scope text[], p_spent integer,
    OUT o_at tid[], OUT o_priority smallint[], OUT o_run_at timestamptz[], OUT o_last jsonb
)
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $body$
BEGIN
    IF p_scope IS NULL AND p_spent > 0 THEN
%2$s
    ELSIF p_scope IS NULL THEN
%3$s
    ELSIF p_spent > 0 THEN
%4$s
    ELSE
%5$s
    END IF;
END
$body$$fn$,
        x_jobs._fair_function(p_queue),
        pg_catalog.format(v_pick, p_queue, pg_catalog.format(v_walk, p_queue, '>=', '<')),
        pg_catalog.format(v_pick, p_queue, pg_catalog.format(v_walk, p_queue, '>', '<=')),
        pg_catalog.format(v_pick, p_queue, pg_catalog.format(v_walk_scoped, p_queue, '>=', '<')),
        pg_catalog.format(v_pick, p_queue, pg_catalog.format(v_walk_scoped, p_queue, '>', '<='))
    );
END
$source$;

-- Tests: tests/pgtap/49-fair-queues.sql, tests/python/test_fair_queues.py
