-- x_jobs.queue_stats: the live rows of each queue by state, whether it is paused, and its demand;
-- x_jobs.version: the API version a client checks before it speaks.
BEGIN;
SELECT plan(5);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

SELECT is(x_jobs.version(), '0.4.2', 'version() should answer the version of the installed SQL API');
SELECT is(
    x_jobs.version(),
    (
        SELECT e.extversion::text FROM pg_catalog.pg_extension AS e
        WHERE e.extname = 'x_jobs'
    ),
    'version() should agree with the extension''s recorded version'
);

-- t51-a: 2 ready (one of them then claimed), 1 delayed, 1 done; t51-b: paused with 1 ready;
-- t51-c: paused and empty.
SELECT x_jobs.enqueue('t51', queue => 't51-a') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t51', queue => 't51-a', run_at => '2030-01-02 00:00:00+00');
SELECT x_jobs.complete(c.id, 'w1') FROM x_jobs.claim(ARRAY['t51-a'], 'w1', '1 minute', 1) AS c;
SELECT c.id FROM x_jobs.claim(ARRAY['t51-a'], 'w1', '1 minute', 1) AS c;
SELECT x_jobs.enqueue('t51', queue => 't51-b');
SELECT x_jobs.pause_queue('t51-b');
SELECT x_jobs.pause_queue('t51-c');

SELECT results_eq(
    $$ SELECT s.queue, s.ready, s.delayed, s.suspended, s.running, s.paused, s.demand
       FROM x_jobs.queue_stats() AS s WHERE s.queue LIKE 't51-%' $$,
    $$ VALUES ('t51-a', 1::bigint, 1::bigint, 0::bigint, 1::bigint, FALSE, 2::bigint),
              ('t51-b', 1::bigint, 0::bigint, 0::bigint, 0::bigint, TRUE, 0::bigint),
              ('t51-c', 0::bigint, 0::bigint, 0::bigint, 0::bigint, TRUE, 0::bigint) $$,
    'queue_stats should count live rows by state per queue, never finished ones, and show pauses'
);

SELECT is(
    (
        SELECT s.demand FROM x_jobs.queue_stats() AS s
        WHERE s.queue = 't51-a'
    ),
    (
        SELECT d.demand FROM x_jobs.queue_demand() AS d
        WHERE d.queue = 't51-a'
    ),
    'queue_stats should report the same demand as queue_demand'
);

SELECT is_empty(
    $$ SELECT FROM x_jobs.queue_stats() AS s WHERE s.queue = 't51-none' $$,
    'A queue with no live row and no pause should not be listed'
);

SELECT * FROM finish();
ROLLBACK;
