-- Fair queues: a policy is set, listed and cleared; a fair queue's claims take ready rows in
-- turns across tenants (A A A A B B C comes out A B C A B A A), by weight, by priority within a
-- tenant, from where the session's last claim ended; rows coming due from a delay, rows with a
-- concurrency key and lapsed leases are claimed as in any queue; queue_demand counts exactly;
-- a bound worker takes its tenants' rows only; bad input is refused with coded errors.

BEGIN;
SELECT plan(43);

-- The tenants of the rows one claim took, sorted (a claim answers its rows in claim order, by
-- priority, run_at and id, not in the turns that picked them).
CREATE FUNCTION pg_temp.claimed(p_queue text, p_qty integer)
RETURNS text
LANGUAGE sql
AS $$
    SELECT coalesce(string_agg(j.tenant_id, ' ' ORDER BY j.tenant_id), '')
    FROM x_jobs.claim(ARRAY[p_queue], 'w-fair', '10 minutes', p_qty) AS j
$$;

-- Rows of the queue that are not done yet are cancelled, between the parts.
CREATE FUNCTION pg_temp.clear()
RETURNS void
LANGUAGE sql
AS $$
    UPDATE x_jobs.job
    SET state = 'cancelled', finished_at = now(), claimed_by = NULL, visible_at = NULL
    WHERE queue = 'fq' AND state IN ('ready', 'delayed', 'running');
    SELECT set_config('x_jobs.claim_fair_cursor', '', FALSE);
$$;

-- Setting and listing.
SELECT is(
    (SELECT (p).fair FROM (SELECT x_jobs.set_queue_policy(queue => 'fq', fair => TRUE) AS p) AS s),
    TRUE,
    'set_queue_policy should answer the queue''s policy'
);
SELECT results_eq(
    $$SELECT queue, fair, weights, index_ready FROM x_jobs.queue_policies()$$,
    $$VALUES ('fq'::text, TRUE, '{}'::jsonb, TRUE)$$,
    'queue_policies should list the fair queue, its index made'
);
SELECT is(
    (
        SELECT count(*)::integer FROM pg_catalog.pg_indexes
        WHERE schemaname = 'x_jobs' AND indexname = x_jobs._fair_index('fq')
    ),
    1,
    'A fair queue should have an index of its own'
);
SELECT is(
    (
        SELECT
            p.proowner = (
                SELECT c.relowner FROM pg_catalog.pg_class AS c
                WHERE c.oid = 'x_jobs.job'::regclass
            )
        FROM pg_catalog.pg_proc AS p
        WHERE p.oid = ('x_jobs.' || x_jobs._fair_function('fq'))::regproc
    ),
    TRUE,
    'A fair queue should have a function of its own, the owner''s'
);
SELECT ok(
    NOT has_function_privilege(
        'x_jobs_admin',
        ('x_jobs.' || x_jobs._fair_function('fq') || '(text, integer, timestamptz, text[], integer)')::regprocedure,
        'EXECUTE'
    )
    AND NOT has_function_privilege(
        'public',
        ('x_jobs.' || x_jobs._fair_function('fq') || '(text, integer, timestamptz, text[], integer)')::regprocedure,
        'EXECUTE'
    ),
    'A fair queue''s function should be executable by no role but its owner (the claim runs it)'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('', fair => TRUE)$$,
    'XJ002', 'X_QUEUE_INVALID: queue '''' is not a queue name',
    'An empty queue name should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', weights => '[1]')$$,
    'XJ066', 'X_QUEUE_POLICY_INVALID: weights [1] is not a JSON object',
    'Weights that are not an object should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', weights => '{"acme": 0}')$$,
    'XJ066', 'X_QUEUE_POLICY_INVALID: weight "acme": 0 is not a tenant id with a whole number from 1 to 1000',
    'A weight below 1 should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', weights => '{"acme": 2.5}')$$,
    'XJ066', NULL,
    'A weight that is not a whole number should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', weights => '{"acme": "3"}')$$,
    'XJ066', NULL,
    'A weight that is not a number should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', weights => '{"": 3}')$$,
    'XJ066', NULL,
    'An empty tenant id should be refused'
);

-- Turns: A A A A B B C, claimed one at a time, is A B C A B A A.
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A') FROM generate_series(1, 4);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B') FROM generate_series(1, 2);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'C');
SELECT is(
    (SELECT string_agg(pg_temp.claimed('fq', 1), ' ' ORDER BY g) FROM generate_series(1, 7) AS g),
    'A B C A B A A',
    'Claims of one should take the tenants in turns'
);
SELECT is(pg_temp.claimed('fq', 1), '', 'The fair queue should then be empty');

-- A claim of several answers its rows in the order of the turns.
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A') FROM generate_series(1, 4);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B') FROM generate_series(1, 2);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'C');
SELECT set_config('x_jobs.claim_fair_cursor', '', FALSE);
SELECT is(
    (
        SELECT string_agg(c.tenant_id, ' ' ORDER BY c.n)
        FROM (
            SELECT
                j.tenant_id,
                row_number() OVER () AS n
            FROM x_jobs.claim(ARRAY['fq'], 'w-fair', '10 minutes', 7) AS j
        ) AS c
    ),
    'A B C A B A A',
    'A claim of seven should answer its rows in the order of the turns'
);

-- A claim of several takes whole turns, and the next claim goes on where it ended.
SELECT pg_temp.clear();
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => t)
FROM unnest(ARRAY['A', 'B', 'C']) AS t, generate_series(1, 4);
SELECT is(pg_temp.claimed('fq', 4), 'A A B C', 'A claim of 4 over 3 tenants should take a turn and a row');
SELECT is(
    current_setting('x_jobs.claim_fair_cursor')::jsonb -> 'fq',
    '["A", 1]'::jsonb,
    'The session''s cursor should name the tenant the last turn ended on, and its rows in that turn'
);
SELECT is(pg_temp.claimed('fq', 3), 'A B C', 'The next claim should start after the tenant the last one ended on');
SELECT is(pg_temp.claimed('fq', 100), 'A B B C C', 'A claim of more than is there should take every row');

-- A flood: a tenant's thousand rows delay another's first by one turn.
SELECT x_jobs.enqueue_many(
    (
        SELECT jsonb_agg(jsonb_build_object('name', 't', 'queue', 'fq', 'tenant_id', 'flood'))
        FROM generate_series(1, 1000)
    )
);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'late') FROM generate_series(1, 3);
SELECT is(
    (SELECT count(*)::integer FROM regexp_matches(
        (SELECT string_agg(pg_temp.claimed('fq', 2), ' ' ORDER BY g) FROM generate_series(1, 3) AS g),
        'late', 'g'
    )),
    3,
    'Three claims of two should take the late tenant''s three rows past a thousand of another'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE queue = 'fq' AND tenant_id = 'flood' AND state = 'running'
    ),
    3,
    'and three of the flood'
);

-- queue_demand counts a fair queue's due rows (and those running) exactly.
SELECT is(
    (
        SELECT d.demand FROM x_jobs.queue_demand() AS d
        WHERE d.queue = 'fq'
    ),
    (
        SELECT count(*) FROM x_jobs.job
        WHERE queue = 'fq' AND state IN ('ready', 'running')
    ),
    'queue_demand should count every due and running row of a fair queue'
);
SELECT pg_temp.clear();

-- Priority orders within a tenant; weights give rows a turn.
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A', input => jsonb_build_object('n', g), priority => 10)
FROM generate_series(1, 2) AS g;
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A', input => '{"n": "urgent"}', priority => -5);
SELECT is(
    (SELECT j.input ->> 'n' FROM x_jobs.claim(ARRAY['fq'], 'w-fair', '10 minutes', 1) AS j),
    'urgent',
    'A tenant''s best priority row should go first in its turn'
);
SELECT pg_temp.clear();
SELECT x_jobs.set_queue_policy('fq', weights => '{"A": 3}');
SELECT is(
    (
        SELECT weights FROM x_jobs.queue_policies()
        WHERE queue = 'fq'
    ),
    '{"A": 3}'::jsonb,
    'queue_policies should list the weights'
);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => t)
FROM unnest(ARRAY['A', 'B']) AS t, generate_series(1, 6);
SELECT is(
    (SELECT string_agg(pg_temp.claimed('fq', 1), ' ' ORDER BY g) FROM generate_series(1, 8) AS g),
    'A A A B A A A B',
    'A tenant of weight 3 should take three rows a turn, across claims of one'
);
SELECT pg_temp.clear();
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => t)
FROM unnest(ARRAY['A', 'B']) AS t, generate_series(1, 6);
SELECT is(
    pg_temp.claimed('fq', 5),
    'A A A A B',
    'A claim of five should take a turn (three of the weighted tenant, one of the other) and the next turn''s first row'
);
SELECT x_jobs.set_queue_policy('fq', weights => '{}');
SELECT is(
    (
        SELECT weights FROM x_jobs.queue_policies()
        WHERE queue = 'fq'
    ),
    '{}'::jsonb,
    'Empty weights should clear them'
);
SELECT is(
    (
        SELECT fair FROM x_jobs.queue_policies()
        WHERE queue = 'fq'
    ),
    TRUE,
    'Setting the weights alone should keep the queue fair'
);
SELECT pg_temp.clear();

-- What stays as in any queue: rows due from a delay, rows with a concurrency key, lapsed leases.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A', run_at => '2030-01-01 11:00:00+00');
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B', run_at => '2030-01-01 13:00:00+00');
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'C', concurrency_key => 'k', concurrency_limit => 1);
SELECT is(
    (
        SELECT string_agg(j.tenant_id, ' ' ORDER BY j.tenant_id)
        FROM x_jobs.claim(ARRAY['fq'], 'w-fair', '10 minutes', 10) AS j
    ),
    'A C',
    'A fair queue should hand out its due delayed rows and its keyed rows, and none not due'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:30:00+00';
SELECT is(
    (
        SELECT string_agg(j.tenant_id, ' ' ORDER BY j.tenant_id)
        FROM x_jobs.claim(ARRAY['fq'], 'w-fair', '10 minutes', 10) AS j
    ),
    'A C',
    'and take its lapsed leases again'
);
RESET "x_jobs.fake_now";
SELECT pg_temp.clear();

-- A claim over a fair and a plain queue takes from both.
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => t) FROM unnest(ARRAY['A', 'B']) AS t, generate_series(1, 3);
SELECT x_jobs.enqueue('t', queue => 'plainq', tenant_id => 'A') FROM generate_series(1, 3);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['fq', 'plainq'], 'w-fair', '10 minutes', 100)),
    9,
    'A claim over a fair queue and a plain one should take the rows of both'
);

-- A bound worker takes its tenants' rows only.
CREATE ROLE x_jobs_test_fair_b IN ROLE x_jobs_worker;
SELECT x_jobs.bind_tenant('x_jobs_test_fair_b', 'B');
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => t) FROM unnest(ARRAY['A', 'B', 'C']) AS t, generate_series(1, 3);
SET LOCAL ROLE x_jobs_test_fair_b;
SELECT is(
    (SELECT string_agg(j.tenant_id, ' ') FROM x_jobs.claim(ARRAY['fq'], 'w-fair-b', '10 minutes', 10) AS j),
    'B B B',
    'A bound worker should claim its tenant''s rows of a fair queue only'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', fair => FALSE)$$,
    '42501', NULL,
    'A worker should not set a queue''s policy'
);
RESET ROLE;
CREATE ROLE x_jobs_test_fair_admin IN ROLE x_jobs_admin;
SELECT x_jobs.bind_tenant('x_jobs_test_fair_admin', 'B');
SET LOCAL ROLE x_jobs_test_fair_admin;
SELECT throws_ok(
    $$SELECT x_jobs.set_queue_policy('fq', fair => FALSE)$$,
    'XJ062', NULL,
    'A bound admin should not change how a queue serves every tenant'
);
RESET ROLE;

-- A fair queue whose function is gone (a restored dump) is claimed in FIFO order, and listed
-- as not ready; setting the policy again makes it.
SELECT pg_temp.clear();
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B') FROM generate_series(1, 3);
SELECT set_config('x_jobs.test_fair_function', x_jobs._fair_function('fq'), TRUE);
DO $$ BEGIN
    EXECUTE format('DROP FUNCTION x_jobs.%I', current_setting('x_jobs.test_fair_function'));
END $$;
SELECT is(
    (
        SELECT index_ready FROM x_jobs.queue_policies()
        WHERE queue = 'fq'
    ),
    FALSE,
    'queue_policies should list a fair queue without its function as not ready'
);
SELECT is(pg_temp.claimed('fq', 3), 'A A A', 'A fair queue without its function should be claimed in FIFO order');
SELECT x_jobs.set_queue_policy('fq', fair => TRUE);
SELECT is(pg_temp.claimed('fq', 2), 'B B', 'Setting the policy again should make the queue fair again');

-- Likewise without its index (what a restored dump gives: pg_dump keeps the function).
SELECT pg_temp.clear();
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B') FROM generate_series(1, 3);
SELECT set_config('x_jobs.test_fair_index', x_jobs._fair_index('fq'), TRUE);
DO $$ BEGIN
    EXECUTE format('DROP INDEX x_jobs.%I', current_setting('x_jobs.test_fair_index'));
END $$;
SELECT is(pg_temp.claimed('fq', 3), 'A A A', 'A fair queue without its index should be claimed in FIFO order');
SELECT x_jobs.set_queue_policy('fq', fair => TRUE);
SELECT is(pg_temp.claimed('fq', 2), 'B B', 'Setting the policy again should build the index');

-- Fair no more: the index goes, and the claim takes rows in FIFO order again.
SELECT x_jobs.set_queue_policy('fq', fair => FALSE);
SELECT is(
    (
        SELECT count(*)::integer FROM pg_catalog.pg_indexes
        WHERE schemaname = 'x_jobs' AND indexname = x_jobs._fair_index('fq')
    ),
    0,
    'A queue made fair no more should lose its index'
);
SELECT results_eq(
    $$SELECT fair, fair_index, index_ready FROM x_jobs.queue_policies() WHERE queue = 'fq'$$,
    $$VALUES (FALSE, NULL::text, NULL::boolean)$$,
    'queue_policies should list it as not fair'
);
SELECT pg_temp.clear();
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'A') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t', queue => 'fq', tenant_id => 'B') FROM generate_series(1, 3);
SELECT is(
    pg_temp.claimed('fq', 3),
    'A A A',
    'A queue fair no more should be claimed in FIFO order'
);
SELECT is(
    (SELECT fair FROM x_jobs.set_queue_policy('other')),
    FALSE,
    'A new queue''s policy should not be fair unless asked'
);

-- DROP EXTENSION takes a fair queue's function with it (the index goes with the table).
SELECT x_jobs.set_queue_policy('fq', fair => TRUE);
SELECT lives_ok('DROP EXTENSION x_jobs', 'DROP EXTENSION should drop a fair queue''s function too');

SELECT * FROM finish();
ROLLBACK;
