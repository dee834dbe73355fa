-- x_jobs.queue_gauges: what queue_stats answers, from a snapshot at most max_age old, counted
-- again only once it is older (or, a clock moved back, newer) than that, and never stored by a
-- read-only transaction. The clock is moved with SET LOCAL "x_jobs.fake_now". That two callers
-- never count at once (the second is answered the stored snapshot without waiting) takes two
-- sessions: tests/python/test_metrics.py.
BEGIN;
SELECT plan(15);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- t52-a: 2 ready, 1 delayed, 1 running; t52-b: paused with 1 ready.
SELECT x_jobs.enqueue('t52', queue => 't52-a') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t52', queue => 't52-a', run_at => '2030-01-02 00:00:00+00');
SELECT c.id FROM x_jobs.claim(ARRAY['t52-a'], 'w52', '1 minute', 1) AS c;
SELECT x_jobs.enqueue('t52', queue => 't52-b');
SELECT x_jobs.pause_queue('t52-b');

SELECT results_eq(
    $$ SELECT g.queue, g.ready, g.delayed, g.suspended, g.running, g.paused, g.demand, g.taken_at
       FROM x_jobs.queue_gauges(max_age => '15 seconds') AS g WHERE g.queue LIKE 't52-%' $$,
    $$ VALUES ('t52-a', 2::bigint, 1::bigint, 0::bigint, 1::bigint, FALSE, 3::bigint,
               '2030-01-01 12:00:00+00'::timestamptz),
              ('t52-b', 1::bigint, 0::bigint, 0::bigint, 0::bigint, TRUE, 0::bigint,
               '2030-01-01 12:00:00+00'::timestamptz) $$,
    'queue_gauges should count the live rows by state per queue, the pauses and the demand, taken now'
);

SELECT results_eq(
    $$ SELECT g.queue, g.ready, g.delayed, g.suspended, g.running, g.paused, g.demand
       FROM x_jobs.queue_gauges() AS g WHERE g.queue LIKE 't52-%' $$,
    $$ SELECT s.queue, s.ready, s.delayed, s.suspended, s.running, s.paused, s.demand
       FROM x_jobs.queue_stats() AS s WHERE s.queue LIKE 't52-%' $$,
    'queue_gauges should answer what queue_stats answers when it has just counted'
);

-- Three more ready rows, 10 s later: the snapshot is 10 s old.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:10+00';
SELECT x_jobs.enqueue('t52', queue => 't52-a') FROM generate_series(1, 3);

SELECT results_eq(
    $$ SELECT g.queue, g.ready, g.taken_at FROM x_jobs.queue_gauges(max_age => '15 seconds') AS g
       WHERE g.queue = 't52-a' $$,
    $$ VALUES ('t52-a', 2::bigint, '2030-01-01 12:00:00+00'::timestamptz) $$,
    'queue_gauges should answer the stored snapshot, not count, while it is younger than max_age'
);

SELECT is(
    (SELECT s.taken_at FROM x_jobs.queue_snapshot AS s),
    '2030-01-01 12:00:00+00'::timestamptz,
    'A read of a fresh snapshot should leave it as it was'
);

SELECT results_eq(
    $$ SELECT g.queue, g.ready, g.taken_at FROM x_jobs.queue_gauges(max_age => '5 seconds') AS g
       WHERE g.queue = 't52-a' $$,
    $$ VALUES ('t52-a', 5::bigint, '2030-01-01 12:00:10+00'::timestamptz) $$,
    'queue_gauges should count again, and store it, once the snapshot is older than max_age'
);

SELECT is(
    (SELECT s.taken_at FROM x_jobs.queue_snapshot AS s),
    '2030-01-01 12:00:10+00'::timestamptz,
    'The new count should be stored for the next callers'
);

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.queue_snapshot),
    1,
    'The snapshot should be one row, however often it is taken'
);

-- max_age 0: every call counts.
SELECT x_jobs.enqueue('t52', queue => 't52-a');
SELECT is(
    (
        SELECT g.ready FROM x_jobs.queue_gauges(max_age => '0') AS g
        WHERE g.queue = 't52-a'
    ),
    6::bigint,
    'A max_age of 0 should count at every call'
);

-- A clock moved back by more than max_age: the stored snapshot comes from its future. (At 11:00
-- no ready row is due yet: the demand is the running row alone.)
SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:00:00+00';
SELECT is(
    (
        SELECT g.taken_at FROM x_jobs.queue_gauges(max_age => '15 seconds') AS g
        WHERE g.queue = 't52-a'
    ),
    '2030-01-01 11:00:00+00'::timestamptz,
    'A snapshot taken further in the future than max_age should be counted again'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.queue_gauges(max_age => NULL) $$,
    'XJ051',
    'X_MAX_AGE_INVALID: max_age NULL is outside 0 to 1 day',
    'queue_gauges should refuse a NULL max_age'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.queue_gauges(max_age => '-1 second') $$,
    'XJ051',
    'X_MAX_AGE_INVALID: max_age -00:00:01 is outside 0 to 1 day',
    'queue_gauges should refuse a negative max_age'
);

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.queue_gauges(max_age => '25 hours') $$,
    'XJ051',
    'X_MAX_AGE_INVALID: max_age 25:00:00 is outside 0 to 1 day',
    'queue_gauges should refuse a max_age longer than a day'
);

SELECT results_eq(
    $$ SELECT g.queue, g.ready, g.delayed, g.suspended, g.running, g.paused, g.demand, g.taken_at
       FROM x_jobs.queue_gauges(max_age => '15 seconds', queues => ARRAY['t52-none', 't52-b', NULL, 't52-none']) AS g
       WHERE g.queue LIKE 't52-%' $$,
    $$ VALUES ('t52-a', 6::bigint, 1::bigint, 0::bigint, 1::bigint, FALSE, 1::bigint,
               '2030-01-01 11:00:00+00'::timestamptz),
              ('t52-b', 1::bigint, 0::bigint, 0::bigint, 0::bigint, TRUE, 0::bigint,
               '2030-01-01 11:00:00+00'::timestamptz),
              ('t52-none', 0::bigint, 0::bigint, 0::bigint, 0::bigint, FALSE, 0::bigint,
               '2030-01-01 11:00:00+00'::timestamptz) $$,
    'queue_gauges should answer the queues asked for at 0, once each, when the snapshot lists them not'
);

-- Last: a read-only transaction (a hot standby) counts for itself and stores nothing.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:01:00+00';
SELECT x_jobs.enqueue('t52', queue => 't52-a');
SET LOCAL transaction_read_only = on;

SELECT results_eq(
    $$ SELECT g.ready, g.taken_at FROM x_jobs.queue_gauges(max_age => '15 seconds') AS g
       WHERE g.queue = 't52-a' $$,
    $$ VALUES (7::bigint, '2030-01-01 11:01:00+00'::timestamptz) $$,
    'In a read-only transaction queue_gauges should count a stale snapshot again for its caller'
);

SELECT is(
    (SELECT s.taken_at FROM x_jobs.queue_snapshot AS s),
    '2030-01-01 11:00:00+00'::timestamptz,
    'A read-only transaction should store nothing'
);

SELECT * FROM finish();
ROLLBACK;
