-- Rate limits: declared, listed and dropped; named at enqueue (enqueue, enqueue_many) or by a
-- declaration; a claim hands out no more of a key's rows in a window than its budget, takes the
-- rows of other keys and those without a key past a key out of budget, and the budget recovers
-- when the next window starts. Bad input is refused with coded errors. Time is moved with
-- x_jobs.fake_now (windows of a minute, aligned to the epoch).

BEGIN;
SELECT plan(41);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:10+00';

-- Declaring.
SELECT is(
    (SELECT (r).max_starts FROM (SELECT x_jobs.set_rate_limit('api', 3, '1 minute') AS r) AS s),
    3,
    'set_rate_limit should answer the declared limit'
);
SELECT lives_ok(
    $$SELECT x_jobs.set_rate_limit(key => 'other', max_starts => 2, per => '1 minute')$$,
    'set_rate_limit should take named arguments'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit('api', 0, '1 minute')$$,
    'XJ063', 'X_RATE_LIMIT_INVALID: max_starts 0 is below 1',
    'A max_starts below 1 should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit('api', 1, '0 seconds')$$,
    'XJ063', 'X_RATE_LIMIT_INVALID: period 00:00:00 is not a positive interval up to 366 days',
    'A period of zero should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit('api', 1, '-1 minute')$$,
    'XJ063', NULL,
    'A negative period should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit('', 1, '1 minute')$$,
    'XJ063', 'X_RATE_LIMIT_INVALID: rate limit key '''' is empty',
    'An empty key should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit(NULL, 1, '1 minute')$$,
    'XJ063', 'X_RATE_LIMIT_INVALID: rate limit key NULL is empty',
    'A NULL key should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.set_rate_limit(repeat('k', 401), 1, '1 minute')$$,
    'XJ063', NULL,
    'A key longer than 400 characters should be refused'
);

-- Naming one.
SELECT throws_ok(
    $$SELECT x_jobs.enqueue('call', rate_limit_key => 'nope')$$,
    'XJ064', 'X_RATE_LIMIT_UNKNOWN: no rate limit has key ''nope''',
    'An enqueue naming a key without a declared limit should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.enqueue('call', rate_limit_key => 'api', concurrency_key => 'c')$$,
    'XJ065', 'X_RATE_LIMIT_CONFLICT: rate limit key ''api'' and concurrency key ''c'' on one job',
    'A job with both a rate limit key and a concurrency key should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.enqueue('call', rate_limit_key => '')$$,
    'XJ063', NULL,
    'An empty rate_limit_key at enqueue should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue_many('[{"name": "call", "rate_limit_key": 7}]')$$,
    'XJ009', NULL,
    'enqueue_many should refuse a rate_limit_key that is not a string'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue_many('[{"name": "call", "rate_limit_key": "nope"}]')$$,
    'XJ064', NULL,
    'enqueue_many should refuse a key without a declared limit'
);

-- Five rows of 'api' (budget 3), two of 'other' (budget 2), two without a key; the oldest first.
SELECT x_jobs.enqueue('call', queue => 'rl', rate_limit_key => 'api') FROM generate_series(1, 3);
SELECT count(*) FROM x_jobs.enqueue_many(
    '[{"name": "call", "queue": "rl", "rate_limit_key": "api"},
      {"name": "call", "queue": "rl", "rate_limit_key": "api"},
      {"name": "other", "queue": "rl", "rate_limit_key": "other"},
      {"name": "other", "queue": "rl", "rate_limit_key": "other"},
      {"name": "plain", "queue": "rl"},
      {"name": "plain", "queue": "rl"}]'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job_rate AS r INNER JOIN x_jobs.job AS j ON r.job_id = j.id
        WHERE r.rate_limit_key = 'api' AND r.parked_state = 'ready' AND j.state = 'delayed'
    ),
    5,
    'enqueue and enqueue_many should park the jobs of a rate limit key for its budget'
);

CREATE TEMPORARY TABLE got AS
SELECT
    c.id,
    c.name,
    r.rate_limit_key
FROM x_jobs.claim(ARRAY['rl'], 'w1', '10 minutes', 100) AS c
LEFT JOIN x_jobs.job_rate AS r ON c.id = r.job_id;
SELECT is(
    (
        SELECT count(*)::integer FROM got
        WHERE rate_limit_key = 'api'
    ),
    3,
    'A claim should hand out no more of a key''s rows than its budget'
);
SELECT is(
    (
        SELECT count(*)::integer FROM got
        WHERE rate_limit_key = 'other'
    ),
    2,
    'A key out of budget should not hold back the rows of another key'
);
SELECT is(
    (
        SELECT count(*)::integer FROM got
        WHERE rate_limit_key IS NULL
    ),
    2,
    'A key out of budget should not hold back rows without a key'
);
SELECT results_eq(
    $$SELECT starts, remaining, waiting FROM x_jobs.rate_limits() WHERE key = 'api'$$,
    $$VALUES (3, 0, 2::bigint)$$,
    'rate_limits should list what the window spent and what waits'
);
SELECT is(
    (
        SELECT demand FROM x_jobs.queue_demand()
        WHERE queue = 'rl'
    ),
    7::bigint,
    'queue_demand should count the running rows and no row of a key out of budget'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['rl'], 'w2', '10 minutes', 100)$$,
    'A second claim in the same window should get nothing of a spent key'
);

-- The next window: the budget is back, with no maintenance.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['rl'], 'w2', '10 minutes', 100)),
    2,
    'In the next window the key''s budget should be back'
);
SELECT results_eq(
    $$SELECT window_start, starts, remaining FROM x_jobs.rate_limits() WHERE key = 'api'$$,
    $$VALUES ('2030-01-01 12:01:00+00'::timestamptz, 2, 1)$$,
    'The window should start at a multiple of the period'
);

-- A declaration names the key for every enqueue of the job.
SELECT x_jobs.declare_job(name => 'declared', rate_limit_key => 'other');
SELECT x_jobs.enqueue('declared', queue => 'dq');
SELECT is(
    (
        SELECT r.rate_limit_key FROM x_jobs.job_rate AS r INNER JOIN x_jobs.job AS j ON r.job_id = j.id
        WHERE j.name = 'declared'
    ),
    'other',
    'An enqueue should take the rate limit key of the job''s declaration'
);

-- Setting a limit again keeps the window's count; dropping one.
SELECT is(
    (SELECT (r).starts FROM (SELECT x_jobs.set_rate_limit('api', 10, '1 minute') AS r) AS s),
    2,
    'Setting a limit again with the same period should keep what the window spent'
);
SELECT is(x_jobs.drop_rate_limit('api'), 'api', 'drop_rate_limit should answer the key');
SELECT throws_ok(
    $$SELECT x_jobs.drop_rate_limit('api')$$,
    'XJ064', 'X_RATE_LIMIT_UNKNOWN: no rate limit has key ''api''',
    'Dropping a key without a limit should be refused'
);
SELECT x_jobs.set_rate_limit('tmp', 1, '1 hour');
SELECT x_jobs.enqueue('t', queue => 'tq', rate_limit_key => 'tmp') FROM generate_series(1, 3);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['tq'], 'w4', '10 minutes', 100)),
    1,
    'A claim should start one row of a key with a budget of one'
);
SELECT x_jobs.drop_rate_limit('tmp');
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['tq'], 'w4', '10 minutes', 100)),
    2,
    'The waiting rows of a dropped limit should run without one'
);

-- A claim whose clock (its transaction's start) is behind the window a later claim opened
-- starts nothing: the old window is closed, and its budget must not be counted afresh.
SELECT x_jobs.set_rate_limit('late', 2, '1 minute');
SELECT x_jobs.enqueue('t', queue => 'lq', rate_limit_key => 'late') FROM generate_series(1, 6);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:06:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq'], 'w5', '10 minutes', 10)),
    2,
    'A claim in a fresh window should start the whole budget'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:05:59.9+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq'], 'w5', '10 minutes', 10)),
    0,
    'A claim whose clock is in the window before the limit''s current one should start none'
);

-- A retry, and a job released by a worker that stopped, start again: they wait for the budget.
SELECT x_jobs.set_rate_limit('retry', 2, '1 minute');
SELECT x_jobs.enqueue('t', queue => 'rq', rate_limit_key => 'retry') FROM generate_series(1, 2);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:10:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['rq'], 'w6', '10 minutes', 10)),
    2,
    'A claim should start the budget of two'
);
SELECT is(
    x_jobs.fail(
        id => (
            SELECT min(id) FROM x_jobs.job
            WHERE queue = 'rq'
        ), worker => 'w6', error => 'boom',
        retry_delay => '0 seconds'
    )::text,
    'ready',
    'A failed attempt should be retried at once'
);
SELECT is(
    (SELECT array_length(array_agg(r), 1) FROM x_jobs.release(
        ids => ARRAY[(
            SELECT max(id) FROM x_jobs.job
            WHERE queue = 'rq'
        )], worker => 'w6'
    ) AS r),
    1,
    'A stopping worker should release the other'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['rq'], 'w6', '10 minutes', 10)),
    0,
    'The retry and the released job should not start past the window''s spent budget'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:11:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['rq'], 'w6', '10 minutes', 10)),
    2,
    'They should start in the next window'
);

-- A lapsed lease taken again is a start too: the job waits for the budget again.
SELECT x_jobs.set_rate_limit('lapse', 1, '1 hour');
SELECT x_jobs.enqueue('t', queue => 'lq2', rate_limit_key => 'lapse');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq2'], 'w7', '1 minute', 10)),
    1,
    'A claim should start the budget of one'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:05:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq2'], 'w7', '1 minute', 10)),
    0,
    'A lapsed lease of a key out of budget should not be taken again in the window'
);
SELECT results_eq(
    $$SELECT j.state::text, (SELECT count(*)::integer FROM x_jobs.job_error AS e WHERE e.job_id = j.id)
      FROM x_jobs.job AS j WHERE j.queue = 'lq2'$$,
    $$VALUES ('delayed', 1)$$,
    'It should wait parked, its lapse logged'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:00:00+00';
SELECT is(
    (SELECT attempt FROM x_jobs.claim(ARRAY['lq2'], 'w7', '1 minute', 10)),
    2,
    'It should start again in the next window, its second attempt'
);

-- An operator's retry of a failed job is a start too.
SELECT x_jobs.fail(
    id => (
        SELECT id FROM x_jobs.job
        WHERE queue = 'lq2'
    ), worker => 'w7', error => 'boom', retryable => FALSE
);
SELECT x_jobs.retry((
    SELECT id FROM x_jobs.job
    WHERE queue = 'lq2'
));
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq2'], 'w7', '1 minute', 10)),
    0,
    'A job retried by an operator should not start past the window''s spent budget'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 15:00:00+00';
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['lq2'], 'w7', '1 minute', 10)),
    1,
    'It should start in the next window'
);

SELECT * FROM finish();
ROLLBACK;
