-- x_jobs.claim behind a window full of keys at their limit, where it visits the keys: a row is
-- granted by its own limit (a lower limit on an older row of its key hides nothing), the visit
-- reads as much beside thousands of keys of other queues, or of keys with nothing due, as
-- beside none, and successive claims move on through the keys so that every key with room is
-- reached. A claim of qty 1 reads a window of 10 x 1 + 100 keyed rows per queue and arm, so
-- each scenario puts 150 rows of a key at its limit ahead. Time is moved with x_jobs.fake_now.

BEGIN;
SELECT plan(12);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- Enqueues p_count rows named p_name in p_queue, due at p_run_at, of the keys format(p_key, n)
-- makes of n = 1..p_count (one key for all when p_key has no %s), with concurrency_limit p_limit.
CREATE FUNCTION pg_temp.seed_keys(
    p_queue text, p_key text, p_count integer, p_limit integer, p_run_at timestamptz, p_name text
)
RETURNS void
LANGUAGE sql
AS $$
    SELECT count(*) FROM x_jobs.enqueue_many((
        SELECT
            jsonb_agg(
                jsonb_build_object(
                    'name', p_name, 'queue', p_queue, 'concurrency_key', format(p_key, g),
                    'concurrency_limit', p_limit, 'run_at', p_run_at
                )
            )
        FROM generate_series(1, p_count) AS g
    ));
$$;

-- A key at its limit of 1 with one running row and 150 rows behind it: the window of a claim of
-- qty 1 holds only rows of this key.
CREATE FUNCTION pg_temp.seed_full(p_queue text, p_run_at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM x_jobs.enqueue('head', queue => p_queue, concurrency_key => p_queue || '-full');
    PERFORM x_jobs.claim(ARRAY[p_queue], 'holder', '1 minute', 1);
    PERFORM pg_temp.seed_keys(p_queue, p_queue || '-full', 150, 1, p_run_at, 'backlog');
END
$$;

-- Claims one job at a time, p_times times, and answers the names of the rows handed out, in order.
CREATE FUNCTION pg_temp.claim_times(p_queue text, p_worker text, p_times integer)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_names text[] := '{}';
BEGIN
    FOR i IN 1..p_times LOOP
        v_names := v_names || ARRAY(
            SELECT c.name FROM x_jobs.claim(ARRAY[p_queue], p_worker, '1 minute', 1) AS c
            WHERE c.state = 'running'
        );
    END LOOP;
    RETURN v_names;
END
$$;

-- The shared buffers a claim of qty 1 reads (the function scan counts every statement it runs).
-- Statistics first, as a live table has them: planned for a table of a few pages, the claim's
-- statements read some of it whole, and that grows with the rows seeded.
CREATE FUNCTION pg_temp.claim_buffers(p_queue text)
RETURNS integer
LANGUAGE plpgsql
AS $$
DECLARE
    v_plan jsonb;
BEGIN
    ANALYZE x_jobs.job;
    EXECUTE format(
        'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM x_jobs.claim(ARRAY[%L], %L, %L, 1)',
        p_queue, 'buffers-worker', '1 minute'
    ) INTO v_plan;
    RETURN (v_plan -> 0 -> 'Plan' ->> 'Shared Hit Blocks')::integer
        + (v_plan -> 0 -> 'Plan' ->> 'Shared Read Blocks')::integer;
END
$$;

-- Mixed limits: a key whose limit was raised ---------------------------------------------------

-- Key mix-smtp ran with limit 1 (a row of it runs, one more waits), then was raised to 3: the
-- first row of the key still says 1, but the next one, of limit 3, has room (rank 2 of 3 less
-- 1 running), as a claim takes it when the window reaches it.
SELECT pg_temp.seed_full('mix', '2030-01-01 11:00:00+00');
SELECT x_jobs.enqueue('smtp_run', queue => 'mix', concurrency_key => 'mix-smtp', priority => -1);
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['mix'], 'mix-worker', '1 minute', 1) AS c),
    'smtp_run',
    'The first row of the key should be claimed (setup)'
);
SELECT x_jobs.enqueue('smtp_l1', queue => 'mix', concurrency_key => 'mix-smtp', concurrency_limit => 1);
SELECT x_jobs.enqueue('smtp_l3_1', queue => 'mix', concurrency_key => 'mix-smtp', concurrency_limit => 3);
SELECT x_jobs.enqueue('smtp_l3_2', queue => 'mix', concurrency_key => 'mix-smtp', concurrency_limit => 3);
SELECT x_jobs.enqueue('smtp_l3_3', queue => 'mix', concurrency_key => 'mix-smtp', concurrency_limit => 3);

SELECT is(
    (
        SELECT d.demand FROM x_jobs.queue_demand() AS d
        WHERE d.queue = 'mix'
    ),
    3::bigint,
    'queue_demand should count the two running rows and one waiting row of the raised key (setup)'
);
SELECT results_eq(
    $$
    SELECT unnest(pg_temp.claim_times('mix', 'mix-worker', 3))
    $$,
    $$ VALUES ('smtp_l3_1') $$,
    'Behind a full window, a row whose own limit leaves room should be claimed though a row of a lower limit '
    'is ahead of it, and no more than the limits allow'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE concurrency_key = 'mix-smtp' AND state = 'running'
    ),
    2,
    'Two rows of the raised key should run: the third of limit 3 would be rank 2 of 3 less 2 running'
);

-- The same with delayed rows come due (the waiting arm), behind as many due rows of a full key.
SELECT pg_temp.seed_full('mixd', '2030-01-01 12:30:00+00');
SELECT x_jobs.enqueue('smtp_run', queue => 'mixd', concurrency_key => 'mixd-smtp', priority => -1);
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['mixd'], 'mix-worker', '1 minute', 1) AS c),
    'smtp_run',
    'The first row of the key should be claimed (setup)'
);
SELECT x_jobs.enqueue(
    'smtp_l1', queue => 'mixd', concurrency_key => 'mixd-smtp', concurrency_limit => 1,
    run_at => '2030-01-01 12:31:00+00'
);
SELECT x_jobs.enqueue(
    'smtp_l3_1', queue => 'mixd', concurrency_key => 'mixd-smtp', concurrency_limit => 3,
    run_at => '2030-01-01 12:32:00+00'
);
SELECT x_jobs.enqueue(
    'smtp_l3_2', queue => 'mixd', concurrency_key => 'mixd-smtp', concurrency_limit => 3,
    run_at => '2030-01-01 12:33:00+00'
);
-- Due an hour ago, still delayed: what a claim sees once time has passed and no claim ran.
UPDATE x_jobs.job SET run_at = run_at - interval '1 hour'
WHERE queue = 'mixd' AND state = 'delayed';

SELECT results_eq(
    $$
    SELECT unnest(pg_temp.claim_times('mixd', 'mix-worker', 3))
    $$,
    $$ VALUES ('smtp_l3_1') $$,
    'Behind a full window of due delayed rows, a due row whose own limit leaves room should be claimed though '
    'a row of a lower limit is ahead of it'
);

-- A bounded visit ------------------------------------------------------------------------------

-- Keys of another queue are not the claim's: its visit never meets them.
SELECT set_config('x_jobs.claim_key_cursor', '', FALSE);
SELECT pg_temp.seed_full('far', '2030-01-01 11:00:00+00');
CREATE TEMP TABLE far_buffers AS SELECT pg_temp.claim_buffers('far') AS alone;
SELECT pg_temp.seed_keys('far-away', 'far-away-%s', 3000, 1, '2030-01-01 11:00:00+00', 'away');
ALTER TABLE far_buffers ADD COLUMN beside integer;
UPDATE far_buffers SET beside = pg_temp.claim_buffers('far');
SELECT cmp_ok(
    (SELECT f.beside - f.alone FROM far_buffers AS f),
    '<',
    50,
    'A claim behind a full window should read as much beside 3,000 keys of another queue as beside none'
);

-- Keys of the queue with nothing due (a row each tomorrow) are visited, but no more of them per
-- claim with 3,000 than with 300.
SELECT set_config('x_jobs.claim_key_cursor', '', FALSE);
SELECT pg_temp.seed_full('soon', '2030-01-01 11:00:00+00');
SELECT pg_temp.seed_keys('soon', 'soon-a-%s', 300, 1, '2030-01-02 12:00:00+00', 'tomorrow');
CREATE TEMP TABLE soon_buffers AS SELECT pg_temp.claim_buffers('soon') AS few;
SELECT pg_temp.seed_keys('soon', 'soon-b-%s', 2700, 1, '2030-01-02 12:00:00+00', 'tomorrow');
ALTER TABLE soon_buffers ADD COLUMN many integer;
UPDATE soon_buffers SET many = pg_temp.claim_buffers('soon');
SELECT cmp_ok(
    (SELECT s.many FROM soon_buffers AS s),
    '<',
    (SELECT s.few * 3 / 2 FROM soon_buffers AS s),
    'A claim behind a full window should read no more beside 3,000 keys with nothing due than beside 300'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE queue = 'soon' AND state = 'running'
    ),
    1,
    'No row of those keys should have been claimed before it is due'
);

-- Every key with room is reached --------------------------------------------------------------

-- 200 keys at their limit come first in key order, more than one visit of a claim of qty 1 walks
-- (110 keys); 50 keys with room come after them. Successive claims move on from where the last
-- visit ended, so they reach the keys with room, and each of them in turn.
SELECT set_config('x_jobs.claim_key_cursor', '', FALSE);
SELECT pg_temp.seed_keys('rot', 'rot-a-%s', 200, 1, '2030-01-01 11:00:00+00', 'a_run');
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['rot'], 'holder', '1 minute', 200)),
    200,
    'One row of each key should run (setup)'
);
SELECT pg_temp.seed_full('rot', '2030-01-01 11:00:00+00');
SELECT pg_temp.seed_keys('rot', 'rot-a-%s', 200, 1, '2030-01-01 11:00:00+00', 'a_wait');
SELECT pg_temp.seed_keys('rot', 'rot-b-%s', 50, 1, '2030-01-01 11:00:00+00', 'b');
SELECT pg_temp.seed_keys('rot', 'rot-b-%s', 50, 1, '2030-01-01 11:30:00+00', 'b_later');

SELECT is(
    (
        SELECT pg_catalog.cardinality(pg_temp.claim_times('rot', 'rot-worker', 60))
    ),
    50,
    'Successive claims behind a full window should reach every one of 50 keys with room behind 200 without'
);
SELECT results_eq(
    $$
    SELECT j.name, count(*)::integer, count(DISTINCT j.concurrency_key)::integer
    FROM x_jobs.job AS j
    WHERE j.queue = 'rot' AND j.state = 'running' AND j.claimed_by = 'rot-worker'
    GROUP BY j.name
    $$,
    $$ VALUES ('b', 50, 50) $$,
    'Each key with room should have been given its first row, and no key at its limit any'
);

SELECT * FROM finish();
ROLLBACK;
