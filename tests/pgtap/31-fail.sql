-- x_jobs.fail: the worker that holds a running row fails its attempt. With attempts left the row
-- waits out retry_delay or its backoff (min(backoff_max, backoff_base * 2^(attempt - 1)) times a
-- jitter factor in [0.5, 1.0]); on its last attempt, or when not retryable, it settles dead (or
-- failed). Every failure is kept in x_jobs.job_error; anyone else's fail changes nothing.
-- The clock is moved with SET LOCAL "x_jobs.fake_now" (quoted so that sqlfluff parses it).
BEGIN;
SELECT plan(50);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- What every claim of the test handed out.
CREATE TEMP TABLE claims (id bigint NOT NULL, worker text NOT NULL, attempt integer NOT NULL);

-- 20 jobs per backoff case: the jitter is random, the bounds must hold for every one.
-- b1 and b3: base 10 s, max 1 h; cap: base 10 s, max 15 s. The input names g.n so that the
-- planner cannot run enqueue once per kind and repeat its row for every n.
INSERT INTO j (tag, id)
SELECT
    c.kind || '-' || g.n AS tag,
    e.id
FROM (VALUES ('b1', '1 hour'::interval), ('b3', '1 hour'), ('cap', '15 seconds')) AS c (kind, backoff_max)
CROSS JOIN generate_series(1, 20) AS g (n)
CROSS JOIN LATERAL x_jobs.enqueue(
    't31_' || c.kind, pg_catalog.jsonb_build_object('n', g.n), queue => 't31-' || c.kind, max_attempts => 5,
    backoff_base => '10 seconds', backoff_max => c.backoff_max
) AS e;

-- One job per single case, each in a queue of its own.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('basic', 5, TRUE),
    ('rd', 5, TRUE),
    ('zero', 5, TRUE),
    ('last', 2, TRUE),
    ('nodl', 1, FALSE),
    ('nonretry', 5, TRUE),
    ('nonretry_nodl', 5, FALSE),
    ('held', 5, TRUE)
) AS t (tag, max_attempts, dead_letter)
CROSS JOIN LATERAL x_jobs.enqueue(
    't31_' || t.tag, queue => 't31-' || t.tag, max_attempts => t.max_attempts,
    dead_letter => t.dead_letter, backoff_base => '1 hour', backoff_max => '2 hours'
) AS e;

INSERT INTO claims (id, worker, attempt)
SELECT
    c.id,
    c.claimed_by,
    c.attempt
FROM
    x_jobs.claim(array(SELECT DISTINCT k.queue FROM x_jobs.job AS k INNER JOIN j ON k.id = j.id), 'w1', qty => 1000)
        AS c;

SELECT results_eq(
    'SELECT count(*), min(attempt), max(attempt) FROM claims',
    'SELECT count(*), 1, 1 FROM j',
    'Every job of the test should be running its first attempt before anything fails'
);

------------------------------------------------------------------------------------------------
-- With attempts left: delayed by the backoff, or by retry_delay
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:02+00';

SELECT is(
    x_jobs.fail(tap_helpers.jid('basic'), 'w1', 'boom', 'Traceback: line 1'),
    'delayed'::x_jobs.job_state,
    'fail with attempts left should answer delayed'
);

SELECT results_eq(
    $$SELECT state::text, attempt, claimed_by, visible_at, finished_at, last_error, last_error_stack
      FROM x_jobs.job WHERE id = tap_helpers.jid('basic')$$,
    $$VALUES ('delayed', 1, NULL::text, NULL::timestamptz, NULL::timestamptz, 'boom', 'Traceback: line 1')$$,
    'A failed row with attempts left should be delayed, unheld, unfinished, and keep the error and stack'
);

SELECT results_eq(
    $$SELECT job_id, attempt, failed_at, worker, error, error_stack
      FROM x_jobs.job_error WHERE job_id = tap_helpers.jid('basic')$$,
    $$VALUES (tap_helpers.jid('basic'), 1, '2030-01-01 10:00:02+00'::timestamptz, 'w1', 'boom', 'Traceback: line 1')$$,
    'fail should record the failed attempt in job_error'
);

SELECT results_eq(
    $$SELECT DISTINCT x_jobs.fail(j.id, 'w1', 'first failure') FROM j WHERE j.tag LIKE 'b1-%'$$,
    $$VALUES ('delayed'::x_jobs.job_state)$$,
    'fail on the first attempt without retry_delay should answer delayed for every row'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job AS k INNER JOIN j ON k.id = j.id
        WHERE
            j.tag LIKE 'b1-%' AND k.state = 'delayed'
            AND k.run_at BETWEEN '2030-01-01 10:00:02+00'::timestamptz + interval '5 seconds'
            AND '2030-01-01 10:00:02+00'::timestamptz + interval '10 seconds'
    ),
    20,
    'Attempt 1 should wait backoff_base (10 s) times a factor in [0.5, 1.0]: 5 to 10 s'
);

SELECT cmp_ok(
    (
        SELECT count(DISTINCT k.run_at)::integer FROM x_jobs.job AS k INNER JOIN j ON k.id = j.id
        WHERE j.tag LIKE 'b1-%'
    ),
    '>',
    1,
    'Rows failing together should not all retry at the same instant (jitter)'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('rd'), 'w1', 'rate limited', retry_delay => '5 minutes'),
    'delayed'::x_jobs.job_state,
    'fail with a positive retry_delay should answer delayed'
);

SELECT results_eq(
    $$SELECT state::text, run_at FROM x_jobs.job WHERE id = tap_helpers.jid('rd')$$,
    $$VALUES ('delayed', '2030-01-01 10:05:02+00'::timestamptz)$$,
    'retry_delay should win over the backoff policy (1 hour here): run_at is now + retry_delay'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('zero'), 'w1', 'try again now', retry_delay => '0'),
    'ready'::x_jobs.job_state,
    'fail with retry_delay 0 should answer ready'
);

SELECT results_eq(
    $$SELECT state::text, run_at, claimed_by, visible_at FROM x_jobs.job WHERE id = tap_helpers.jid('zero')$$,
    $$VALUES ('ready', '2030-01-01 10:00:02+00'::timestamptz, NULL::text, NULL::timestamptz)$$,
    'A row failed with retry_delay 0 should be ready now and held by nobody'
);

SELECT results_eq(
    $$SELECT id, claimed_by, attempt FROM x_jobs.claim(ARRAY['t31-zero'], 'w2')$$,
    $$VALUES (tap_helpers.jid('zero'), 'w2', 2)$$,
    'A row failed with retry_delay 0 should be claimable at once, for its next attempt'
);

------------------------------------------------------------------------------------------------
-- No attempts left, or not retryable: dead, or failed without dead letters
------------------------------------------------------------------------------------------------

DO $$
BEGIN
    PERFORM x_jobs.fail(tap_helpers.jid('last'), 'w1', 'attempt 1 of 2', retry_delay => '0');
END
$$;

INSERT INTO claims (id, worker, attempt)
SELECT
    c.id,
    c.claimed_by,
    c.attempt
FROM x_jobs.claim(ARRAY['t31-last'], 'w2') AS c;

SELECT is(
    x_jobs.fail(tap_helpers.jid('last'), 'w2', 'attempt 2 of 2'),
    'dead'::x_jobs.job_state,
    'fail on the last attempt should answer dead'
);

SELECT results_eq(
    $$SELECT state::text, attempt, finished_at, claimed_by, visible_at, last_error
      FROM x_jobs.job WHERE id = tap_helpers.jid('last')$$,
    $$VALUES ('dead', 2, '2030-01-01 10:00:02+00'::timestamptz, NULL::text, NULL::timestamptz, 'attempt 2 of 2')$$,
    'A row out of attempts should be dead, finished now, held by nobody'
);

SELECT results_eq(
    $$SELECT attempt, worker, error FROM x_jobs.job_error WHERE job_id = tap_helpers.jid('last') ORDER BY attempt$$,
    $$VALUES (1, 'w1', 'attempt 1 of 2'), (2, 'w2', 'attempt 2 of 2')$$,
    'The final failure should be recorded in job_error too'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('nodl'), 'w1', 'no dead letters'),
    'failed'::x_jobs.job_state,
    'fail on the last attempt of a job enqueued with dead_letter false should answer failed'
);

SELECT results_eq(
    $$SELECT state::text, finished_at FROM x_jobs.job WHERE id = tap_helpers.jid('nodl')$$,
    $$VALUES ('failed', '2030-01-01 10:00:02+00'::timestamptz)$$,
    'A row without dead letters and out of attempts should be failed and finished now'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('nonretry'), 'w1', 'bad input', retryable => FALSE),
    'dead'::x_jobs.job_state,
    'fail with retryable false should answer dead even with attempts left'
);

SELECT results_eq(
    $$SELECT state::text, attempt, max_attempts, finished_at FROM x_jobs.job WHERE id = tap_helpers.jid('nonretry')$$,
    $$VALUES ('dead', 1, 5, '2030-01-01 10:00:02+00'::timestamptz)$$,
    'A row failed as not retryable should be dead and finished at once, on attempt 1 of 5'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('nonretry_nodl'), 'w1', 'bad input', retry_delay => '1 second', retryable => FALSE),
    'failed'::x_jobs.job_state,
    'fail with retryable false on a job without dead letters should answer failed, whatever retry_delay'
);

------------------------------------------------------------------------------------------------
-- Attempt 3: the backoff doubles per attempt, and backoff_max caps it
------------------------------------------------------------------------------------------------

-- Attempts 1 and 2 fail with retry_delay 0, each by a different worker, so that the third
-- claim finds the rows at once.
DO $$
BEGIN
    PERFORM x_jobs.fail(j.id, 'w1', 'failure 1', retry_delay => '0')
    FROM j WHERE j.tag LIKE 'b3-%' OR j.tag LIKE 'cap-%';
END
$$;

INSERT INTO claims (id, worker, attempt)
SELECT
    c.id,
    c.claimed_by,
    c.attempt
FROM x_jobs.claim(ARRAY['t31-b3', 't31-cap'], 'w2', qty => 1000) AS c;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:04+00';

DO $$
BEGIN
    PERFORM x_jobs.fail(j.id, 'w2', 'failure 2', retry_delay => '0')
    FROM j WHERE j.tag LIKE 'b3-%' OR j.tag LIKE 'cap-%';
END
$$;

INSERT INTO claims (id, worker, attempt)
SELECT
    c.id,
    c.claimed_by,
    c.attempt
FROM x_jobs.claim(ARRAY['t31-b3', 't31-cap'], 'w3', qty => 1000) AS c;

SELECT results_eq(
    $$SELECT count(*)::integer, min(k.attempt), max(k.attempt) FROM x_jobs.job AS k JOIN j ON j.id = k.id
      WHERE (j.tag LIKE 'b3-%' OR j.tag LIKE 'cap-%') AND k.state = 'running' AND k.claimed_by = 'w3'$$,
    $$VALUES (40, 3, 3)$$,
    'The b3 and cap rows should be on their third attempt, held by w3'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:06+00';

SELECT results_eq(
    $$SELECT DISTINCT x_jobs.fail(j.id, 'w3', 'failure 3', 'stack 3') FROM j
      WHERE j.tag LIKE 'b3-%' OR j.tag LIKE 'cap-%'$$,
    $$VALUES ('delayed'::x_jobs.job_state)$$,
    'fail on attempt 3 of 5 should answer delayed'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job AS k INNER JOIN j ON k.id = j.id
        WHERE
            j.tag LIKE 'b3-%' AND k.state = 'delayed'
            AND k.run_at BETWEEN '2030-01-01 10:00:06+00'::timestamptz + interval '20 seconds'
            AND '2030-01-01 10:00:06+00'::timestamptz + interval '40 seconds'
    ),
    20,
    'Attempt 3 should wait backoff_base * 2^2 (40 s) times a factor in [0.5, 1.0]: 20 to 40 s'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job AS k INNER JOIN j ON k.id = j.id
        WHERE
            j.tag LIKE 'cap-%' AND k.state = 'delayed'
            AND k.run_at BETWEEN '2030-01-01 10:00:06+00'::timestamptz + interval '7.5 seconds'
            AND '2030-01-01 10:00:06+00'::timestamptz + interval '15 seconds'
    ),
    20,
    'backoff_max (15 s) should cap the attempt 3 backoff of 40 s: 7.5 to 15 s'
);

SELECT results_eq(
    $$SELECT attempt, failed_at, worker, error, error_stack FROM x_jobs.job_error
      WHERE job_id = tap_helpers.jid('b3-7') ORDER BY attempt$$,
    $$VALUES (1, '2030-01-01 10:00:02+00'::timestamptz, 'w1', 'failure 1', NULL::text),
             (2, '2030-01-01 10:00:04+00'::timestamptz, 'w2', 'failure 2', NULL::text),
             (3, '2030-01-01 10:00:06+00'::timestamptz, 'w3', 'failure 3', 'stack 3')$$,
    'Each failed attempt should leave its own job_error row with its attempt, worker and error'
);

SELECT results_eq(
    $$SELECT last_error, last_error_stack FROM x_jobs.job WHERE id = tap_helpers.jid('b3-7')$$,
    $$VALUES ('failure 3', 'stack 3')$$,
    'The row should keep the error of its latest failure'
);

------------------------------------------------------------------------------------------------
-- A worker that does not hold the row
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE snap AS
SELECT * FROM x_jobs.job
WHERE id IN (SELECT j.id FROM j);

SELECT is(
    x_jobs.fail(tap_helpers.jid('held'), 'w2', 'not mine'),
    NULL::x_jobs.job_state,
    'fail should answer NULL to a worker that does not hold the row'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('last'), 'w2', 'already dead'),
    NULL::x_jobs.job_state,
    'fail should answer NULL for a row that is no longer running (dead), even from its last worker'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('basic'), 'w1', 'waiting'),
    NULL::x_jobs.job_state,
    'fail should answer NULL for a delayed row, even from the worker that last held it'
);

SELECT set_eq(
    'SELECT * FROM x_jobs.job WHERE id IN (SELECT j.id FROM j)',
    'SELECT * FROM snap',
    'A fail by a worker that does not hold the row should change nothing'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.job_error
      WHERE job_id = tap_helpers.jid('held') OR error IN ('not mine', 'already dead', 'waiting')$$,
    'A fail by a worker that does not hold the row should record no job_error row'
);

------------------------------------------------------------------------------------------------
-- Refusals (checked before anything is touched)
------------------------------------------------------------------------------------------------

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.fail(%s, %L, NULL)', tap_helpers.jid('held'), 'w1'),
    'XJ023',
    pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message', tap_helpers.jid('held')),
    'fail should refuse a NULL error'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.fail(%s, %L, %L)', tap_helpers.jid('held'), 'w1', ''),
    'XJ023',
    pg_catalog.format('X_ERROR_MISSING: job %s failed without an error message', tap_helpers.jid('held')),
    'fail should refuse an empty error'
);

-- Without an id either, the message says NULL (0.3.8: it read "job  failed ...").
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.fail(id => NULL, worker => 'w', error => NULL) $q$)$$,
    $$VALUES ('XJ023', 'X_ERROR_MISSING: job NULL failed without an error message', '',
              'Pass what went wrong as error, such as the exception''s message.')$$,
    'fail without an id or an error should name the id as NULL, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.fail(tap_helpers.jid('held'), 'w1', 'boom', retry_delay => '-1 second')$$,
    'XJ018',
    pg_catalog.format('X_DELAY_INVALID: retry delay %s is negative', interval '-1 second'),
    'fail should refuse a negative retry_delay'
);

SELECT throws_ok(
    $$SELECT x_jobs.fail(tap_helpers.jid('held'), '', 'boom')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'fail should refuse an empty worker id'
);

SELECT throws_ok(
    $$SELECT x_jobs.fail(tap_helpers.jid('held'), NULL, 'boom')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id NULL is empty',
    'fail should refuse a NULL worker id'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.fail(tap_helpers.jid('held'), repeat('w', 401), 'boom') $q$)$$,
    $$VALUES ('XJ011',
              'X_WORKER_INVALID: worker id ''' || repeat('w', 64) || '''... is 401 characters, longer than 400',
              '', 'Use a worker id of 1 to 400 characters, such as host:pid:random.')$$,
    'fail should refuse a worker id of 401 characters, naming its length, with a HINT'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('held')$$,
    $$SELECT * FROM snap WHERE id = tap_helpers.jid('held')$$,
    'A refused fail should leave the row running under its worker'
);

------------------------------------------------------------------------------------------------
-- Counters: retried, dead, failed and run_ms, per job name and minute
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT job, bucket_seconds, bucket_start, sum(completed)::bigint, sum(retried)::bigint,
             sum(dead)::bigint, sum(failed)::bigint, sum(run_ms)::bigint
      FROM x_jobs.counter
      WHERE job IN ('t31_basic', 't31_b3', 't31_last', 't31_nodl', 't31_nonretry', 't31_nonretry_nodl', 't31_held')
      GROUP BY job, bucket_seconds, bucket_start ORDER BY job$$,
    $$VALUES
        ('t31_b3', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 60::bigint, 0::bigint, 0::bigint,
         120000::bigint),
        ('t31_basic', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 1::bigint, 0::bigint, 0::bigint,
         2000::bigint),
        ('t31_last', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 1::bigint, 1::bigint, 0::bigint,
         2000::bigint),
        ('t31_nodl', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 0::bigint, 0::bigint, 1::bigint,
         2000::bigint),
        ('t31_nonretry', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 0::bigint, 1::bigint, 0::bigint,
         2000::bigint),
        ('t31_nonretry_nodl', 60, '2030-01-01 10:00:00+00'::timestamptz, 0::bigint, 0::bigint, 0::bigint,
         1::bigint, 2000::bigint)$$,
    'Each fail should count once as retried, dead or failed, with its run time, and a refused one not at all'
);

SELECT results_eq(
    $$SELECT sum(retried)::bigint FROM x_jobs.counter WHERE job = 't31_b1'$$,
    $$VALUES (20::bigint)$$,
    'Twenty retried failures of one job name should add up to retried = 20'
);

-- A long backoff far into its attempts: base times 2^40 does not fit an interval once the base is
-- above 8.4 s, and fail used to raise "interval out of range", so the job could not fail at all.
SET LOCAL "x_jobs.fake_now" = '2030-01-02 00:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (VALUES ('long', 100), ('long_last', 34)) AS t (tag, max_attempts)
CROSS JOIN LATERAL x_jobs.enqueue(
    't31_' || t.tag, queue => 't31-' || t.tag, max_attempts => t.max_attempts,
    backoff_base => '1 hour', backoff_max => '1 day'
) AS e;

-- As if 44 and 33 attempts had run: the next claim runs the 45th and the 34th (the last).
UPDATE x_jobs.job SET attempt = 44
WHERE id = tap_helpers.jid('long');
UPDATE x_jobs.job SET attempt = 33
WHERE id = tap_helpers.jid('long_last');

SELECT results_eq(
    $$
    SELECT c.attempt FROM x_jobs.claim(ARRAY['t31-long', 't31-long_last'], 'w9', qty => 2) AS c
    ORDER BY c.attempt
    $$,
    $$VALUES (34), (45)$$,
    'The long-backoff jobs should be claimed for their 34th and 45th attempts'
);

SELECT results_eq(
    $$
    SELECT x_jobs.fail(tap_helpers.jid('long'), 'w9', 'still failing')::text,
           x_jobs.fail(tap_helpers.jid('long_last'), 'w9', 'failing for good', retryable => FALSE)::text
    $$,
    $$VALUES ('delayed', 'dead')$$,
    'fail far into a long backoff should settle the row (delayed, or dead when not retryable)'
);

SELECT is(
    (
        SELECT k.run_at BETWEEN x_jobs.now() + interval '12 hours' AND x_jobs.now() + interval '1 day'
        FROM x_jobs.job AS k
        WHERE k.id = tap_helpers.jid('long')
    ),
    TRUE,
    'A backoff far past backoff_max should wait backoff_max (1 day) times a factor in [0.5, 1.0]'
);

-- A backoff of many millennia, or such a retry_delay: now + the delay is past what timestamptz
-- holds, and fail used to raise "timestamp out of range" (the row stayed running until its lease
-- lapsed), or past the year 9999, which clients cannot read. The retry is due on the last day of
-- 9999 at the latest.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (VALUES ('eon'), ('eon_delay')) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue(
    't31_' || t.tag, queue => 't31-' || t.tag, backoff_base => '100000000 years', backoff_max => '100000000 years'
) AS e;

SELECT results_eq(
    $$
    SELECT c.id FROM x_jobs.claim(ARRAY['t31-eon', 't31-eon_delay'], 'w10', qty => 2) AS c
    ORDER BY c.id
    $$,
    $$VALUES (tap_helpers.jid('eon')), (tap_helpers.jid('eon_delay'))$$,
    'The jobs with a backoff of many millennia should be claimed'
);

SELECT results_eq(
    $$
    SELECT x_jobs.fail(tap_helpers.jid('eon'), 'w10', 'boom')::text,
           x_jobs.fail(tap_helpers.jid('eon_delay'), 'w10', 'boom', retry_delay => '10000 years')::text
    $$,
    $$VALUES ('delayed', 'delayed')$$,
    'fail should settle a job whose backoff, or retry_delay, reaches past the year 9999'
);

SELECT results_eq(
    $$
    SELECT k.run_at > '9999-12-30 23:59:59+00' AND k.run_at < '9999-12-31 00:00:01+00'
    FROM x_jobs.job AS k
    WHERE k.id IN (tap_helpers.jid('eon'), tap_helpers.jid('eon_delay'))
    $$,
    $$VALUES (TRUE), (TRUE)$$,
    'Such a retry should be due on the last day of the year 9999'
);

------------------------------------------------------------------------------------------------
-- Error texts are cut, not refused (0.3.8): 5,000,000 characters were stored whole, twice
------------------------------------------------------------------------------------------------

INSERT INTO j (tag, id)
SELECT
    'huge' AS tag,
    e.id
FROM x_jobs.enqueue('t31_huge', queue => 't31-huge', max_attempts => 5) AS e;

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t31-huge'], 'w11') AS c
        WHERE c.state = 'running'
    ),
    1,
    'The job of the error texts should be claimed (setup)'
);

SELECT is(
    x_jobs.fail(tap_helpers.jid('huge'), 'w11', repeat('e', 5000000), repeat('s', 70000))::text,
    'delayed',
    'fail with an error of 5,000,000 characters should still fail the attempt'
);

SELECT results_eq(
    $$
    SELECT length(k.last_error), left(k.last_error, 65536) = repeat('e', 65536), substr(k.last_error, 65537),
           length(k.last_error_stack), substr(k.last_error_stack, 65537)
    FROM x_jobs.job AS k WHERE k.id = tap_helpers.jid('huge')
    UNION ALL
    SELECT length(e.error), left(e.error, 65536) = repeat('e', 65536), substr(e.error, 65537),
           length(e.error_stack), substr(e.error_stack, 65537)
    FROM x_jobs.job_error AS e WHERE e.job_id = tap_helpers.jid('huge')
    $$,
    $$VALUES
        (65536 + 39, TRUE, E'\n[truncated: 5000000 characters in all]',
         65536 + 37, E'\n[truncated: 70000 characters in all]'),
        (65536 + 39, TRUE, E'\n[truncated: 5000000 characters in all]',
         65536 + 37, E'\n[truncated: 70000 characters in all]')$$,
    'The row and its history should keep the first 65,536 characters of the error and stack, and their length'
);

SELECT * FROM finish();
ROLLBACK;
