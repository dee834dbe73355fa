-- Declarations (0.4.0): x_jobs.declare_job and declare_jobs record what a job type declares,
-- enqueue and enqueue_many fill what a request leaves out from it (an explicit value wins, an
-- explicit NULL is left out), and a worker hands back what it has no handler for (hand_back):
-- delayed for a worker that serves the name, else parked until one announces it or declares it.
-- The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(80);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

------------------------------------------------------------------------------------------------
-- declare_job
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT name, queue, max_attempts, priority, dead_letter, backoff_base, backoff_max, keep_done,
             concurrency_key, concurrency_limit, timeout, declared_at, declared_by, build
      FROM x_jobs.declare_job(
          name => 't12_mail', queue => 't12-mail', max_attempts => 2, backoff_base => '2 seconds',
          backoff_max => '10 minutes', dead_letter => FALSE, timeout => '30 seconds',
          concurrency_limit => 3, concurrency_key => 'job:t12_mail', keep_done => FALSE, priority => 5,
          declared_by => 'host:1:a', build => 'v2')$$,
    $$VALUES ('t12_mail', 't12-mail', 2, 5, FALSE, interval '2 seconds', interval '10 minutes', FALSE,
              'job:t12_mail', 3, interval '30 seconds', '2030-01-01 10:00:00+00'::timestamptz, 'host:1:a', 'v2')$$,
    'declare_job should record every declared field and answer the row'
);

SELECT is(
    (SELECT declared_by FROM x_jobs.declare_job('t12_bare')),
    session_user::text,
    'A declaration that names no worker should be declared by the login'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, timeout FROM x_jobs.declare_job('t12_bare', max_attempts => 4)$$,
    $$VALUES (NULL::text, 4, NULL::interval)$$,
    'A later declaration of a name should replace the whole row'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job_type
        WHERE name = 't12_bare'
    ),
    1,
    'Declaring a name twice should keep one row per name'
);

------------------------------------------------------------------------------------------------
-- enqueue fills what a request leaves out
------------------------------------------------------------------------------------------------

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_mail', idempotency_key => 't12-defaults')$$,
    'An enqueue of a declared job with no options should be accepted'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, priority::integer, dead_letter, backoff_base, backoff_max, keep_done,
             concurrency_key, concurrency_limit, tenant_id
      FROM x_jobs.job WHERE idempotency_key = 't12-defaults'$$,
    $$VALUES ('t12-mail', 2, 5, FALSE, interval '2 seconds', interval '10 minutes', FALSE, 'job:t12_mail', 3,
              'none')$$,
    'An enqueue should take every option it leaves out from the declaration (tenant_id stays none)'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_mail', idempotency_key => 't12-explicit', queue => 'default',
                            max_attempts => 25, priority => 0, dead_letter => TRUE, backoff_base => '1 second',
                            backoff_max => '1 hour', keep_done => TRUE, concurrency_key => 'own',
                            concurrency_limit => 1)$$,
    'An enqueue that passes every option should be accepted'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, priority::integer, dead_letter, backoff_base, backoff_max, keep_done,
             concurrency_key, concurrency_limit
      FROM x_jobs.job WHERE idempotency_key = 't12-explicit'$$,
    $$VALUES ('default', 25, 0, TRUE, interval '1 second', interval '1 hour', TRUE, 'own', 1)$$,
    'An explicit value should win over the declaration, the built-in default''s value included'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_mail', idempotency_key => 't12-nulls', queue => NULL, max_attempts => NULL,
                            priority => NULL, dead_letter => NULL, backoff_base => NULL, backoff_max => NULL,
                            keep_done => NULL, concurrency_key => NULL, concurrency_limit => NULL)$$,
    'An enqueue that passes NULL for every option should be accepted'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, priority::integer, dead_letter, keep_done, concurrency_key, concurrency_limit
      FROM x_jobs.job WHERE idempotency_key = 't12-nulls'$$,
    $$VALUES ('t12-mail', 2, 5, FALSE, FALSE, 'job:t12_mail', 3)$$,
    'An explicit NULL should mean the default: the declaration''s'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_undeclared', idempotency_key => 't12-undeclared')$$,
    'An enqueue of a name nobody declared should be accepted'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, priority::integer, dead_letter, backoff_base, backoff_max, keep_done,
             concurrency_key, concurrency_limit
      FROM x_jobs.job WHERE idempotency_key = 't12-undeclared'$$,
    $$VALUES ('default', 25, 0, TRUE, interval '1 second', interval '1 hour', TRUE, NULL::text, NULL::integer)$$,
    'A name nobody declared should get the built-in defaults'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_bare', idempotency_key => 't12-partial')$$,
    'An enqueue of a job declared in part should be accepted'
);

SELECT results_eq(
    $$SELECT queue, max_attempts, priority::integer, dead_letter, backoff_base, keep_done
      FROM x_jobs.job WHERE idempotency_key = 't12-partial'$$,
    $$VALUES ('default', 4, 0, TRUE, interval '1 second', TRUE)$$,
    'A field the declaration leaves NULL should get the built-in default'
);

-- A concurrency key derived from the input is declared as a limit alone: it goes with the key
-- each enqueue passes, and an enqueue without a key gets no limit (a limit needs a key).
SELECT lives_ok(
    $$SELECT x_jobs.declare_job('t12_keyed', concurrency_limit => 2)$$,
    'A limit without a key should be declarable'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_keyed', idempotency_key => 't12-key-own', concurrency_key => 'customer-1')$$,
    'An enqueue passing its own key should be accepted'
);

SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t12_keyed', idempotency_key => 't12-key-none')$$,
    'An enqueue of a job declared with a limit alone, without a key, should be accepted'
);

SELECT results_eq(
    $$SELECT idempotency_key, concurrency_key, concurrency_limit FROM x_jobs.job
      WHERE idempotency_key IN ('t12-key-own', 't12-key-none') ORDER BY idempotency_key$$,
    $$VALUES ('t12-key-none', NULL::text, NULL::integer), ('t12-key-own', 'customer-1', 2)$$,
    'A declared limit should go with the key an enqueue passes, and make no limit without a key'
);

SELECT throws_ok(
    $$SELECT x_jobs.enqueue('t12_keyed', concurrency_limit => 5)$$,
    'XJ007',
    'X_CONCURRENCY_INVALID: concurrency limit 5 with key NULL is not a limit',
    'An explicit limit without any key should still be refused'
);

------------------------------------------------------------------------------------------------
-- enqueue_many fills each request alike
------------------------------------------------------------------------------------------------

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.enqueue_many($$[
        {"name": "t12_mail", "idempotency_key": "t12-many-1"},
        {"name": "t12_mail", "idempotency_key": "t12-many-2", "queue": null, "max_attempts": null},
        {"name": "t12_mail", "idempotency_key": "t12-many-3", "max_attempts": 9, "keep_done": true},
        {"name": "t12_undeclared", "idempotency_key": "t12-many-4"},
        {"name": "t12_bare", "input": {}}
    ]$$)),
    5,
    'A batch mixing declared and undeclared names should be enqueued in one call'
);

SELECT results_eq(
    $$SELECT idempotency_key, queue, max_attempts, keep_done FROM x_jobs.job
      WHERE idempotency_key LIKE 't12-many-%' ORDER BY idempotency_key$$,
    $$VALUES ('t12-many-1', 't12-mail', 2, FALSE), ('t12-many-2', 't12-mail', 2, FALSE),
             ('t12-many-3', 't12-mail', 9, TRUE), ('t12-many-4', 'default', 25, TRUE)$$,
    'enqueue_many should fill a field absent or null from the request''s own declaration, and keep explicit ones'
);

SELECT results_eq(
    $$SELECT queue, max_attempts FROM x_jobs.job WHERE name = 't12_bare' AND idempotency_key IS NULL$$,
    $$VALUES ('default', 4)$$,
    'A request without an idempotency key should be filled alike (the keyless insert)'
);

------------------------------------------------------------------------------------------------
-- Refusals: enqueue's codes for the values enqueue would refuse
------------------------------------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT x_jobs.declare_job('')$$,
    'XJ001', 'X_NAME_INVALID: job name '''' is not a name',
    'An empty name should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job(NULL)$$,
    'XJ001', 'X_NAME_INVALID: job name NULL is not a name',
    'A NULL name should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job(repeat('n', 201))$$,
    'XJ001', NULL,
    'A name over 200 characters should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', queue => '')$$,
    'XJ002', 'X_QUEUE_INVALID: queue '''' is not a queue name',
    'An empty queue should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', max_attempts => 0)$$,
    'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts 0 is below 1',
    'max_attempts below 1 should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', priority => 40000)$$,
    'XJ005', 'X_PRIORITY_INVALID: priority 40000 is out of range',
    'A priority outside smallint should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', concurrency_limit => 0)$$,
    'XJ007', 'X_CONCURRENCY_INVALID: concurrency limit 0 with key NULL is not a limit',
    'A concurrency limit below 1 should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', concurrency_key => '')$$,
    'XJ007', 'X_CONCURRENCY_INVALID: concurrency limit NULL with key '''' is not a limit',
    'An empty concurrency key should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', concurrency_key => repeat('k', 401))$$,
    'XJ007', NULL,
    'A concurrency key over 400 characters should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', backoff_base => '2 hours')$$,
    'XJ008', 'X_BACKOFF_INVALID: backoff from 02:00:00 to 01:00:00 is not a range',
    'A backoff base above the (default) max should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', backoff_max => '-1 second')$$,
    'XJ008', NULL,
    'A negative backoff should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', timeout => '0 seconds')$$,
    'XJ048', 'X_JOB_TIMEOUT_INVALID: timeout 00:00:00 is not a run time',
    'A timeout of zero should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', timeout => '1001 years')$$,
    'XJ048', NULL,
    'A timeout over 1000 years should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.declare_job('t12_r', declared_by => '')$$,
    'XJ011', NULL,
    'An empty declaring worker id should be refused'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_type WHERE name = 't12_r'$$,
    'A refused declaration should record nothing'
);

------------------------------------------------------------------------------------------------
-- declare_jobs
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT name, max_attempts, timeout, declared_by, build FROM x_jobs.declare_jobs(
          '[{"name": "t12_b", "max_attempts": 7, "timeout": "5 seconds"}, {"name": "t12_a"}]', 'host:2:b', 'v3')$$,
    $$VALUES ('t12_b', 7, interval '5 seconds', 'host:2:b', 'v3'), ('t12_a', NULL, NULL, 'host:2:b', 'v3')$$,
    'declare_jobs should record every declaration and answer them in input order'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.declare_jobs('[]')$$,
    'declare_jobs of an empty array should declare nothing'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('{"name": "t12_x"}')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: jobs is object, not an array',
    'declare_jobs of something other than an array should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x"}, 5]')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: declaration 2 is number, not an object',
    'A declaration that is not an object should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x", "max_attempt": 3}]')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: declaration 1 has an unknown field ''max_attempt''',
    'A declaration with an unknown field (a typo) should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x", "declared_at": "2030-01-01"}]')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: declaration 1 has an unknown field ''declared_at''',
    'A declaration should not set when it was declared'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": ["t12_x"]}]')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: name of declaration 1 is not a string',
    'A name that is not a JSON string should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x", "max_attempts": "many"}]')$$,
    'XJ047', NULL,
    'A field of the wrong type should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x"}, {"name": "t12_x"}]')$$,
    'XJ047', 'X_DECLARATIONS_INVALID: job ''t12_x'' is declared twice in one call',
    'A name declared twice in one call should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.declare_jobs('[{"name": "t12_x"}, {"name": "t12_y", "max_attempts": 0}]')$$,
    'XJ004', NULL,
    'A batch with one invalid declaration should be refused whole'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_type WHERE name IN ('t12_x', 't12_y')$$,
    'A refused batch should record nothing'
);

------------------------------------------------------------------------------------------------
-- drop_job_type
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT x_jobs.drop_job_type('t12_a') UNION ALL SELECT x_jobs.drop_job_type('t12_a')$$,
    ARRAY[TRUE, FALSE],
    'drop_job_type should answer whether there was a declaration'
);

SELECT lives_ok(
    $$SELECT x_jobs.drop_job_type('t12_b'), x_jobs.enqueue('t12_b', idempotency_key => 't12-dropped')$$,
    'An enqueue after drop_job_type should be accepted'
);
SELECT is(
    (
        SELECT max_attempts FROM x_jobs.job
        WHERE idempotency_key = 't12-dropped'
    ),
    25,
    'After drop_job_type an enqueue should get the built-in defaults again'
);

------------------------------------------------------------------------------------------------
-- hand_back: no attempt spent, not due at once; parked when no worker serves the name
------------------------------------------------------------------------------------------------

-- A queue of its own: the row of t12_new, which the old worker has no handler for.
DO $$ BEGIN
    PERFORM x_jobs.enqueue('t12_new', queue => 't12-hb', idempotency_key => 't12-hb-1');
END $$;
DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-old', ARRAY['t12-hb'], jobs => ARRAY['t12_old_job']);
END $$;

SELECT results_eq(
    $$SELECT name, attempt FROM x_jobs.claim(ARRAY['t12-hb'], 't12-old', '30 seconds', 10)$$,
    $$VALUES ('t12_new', 1)$$,
    'A claim should take a row whatever its name (the old worker claims the new job)'
);

SELECT results_eq(
    $$SELECT name, parked, served_by FROM x_jobs.hand_back(
          ARRAY(SELECT id FROM x_jobs.job WHERE idempotency_key = 't12-hb-1'), 't12-old')$$,
    $$VALUES ('t12_new', TRUE, '{}'::text[])$$,
    'A hand-back of a name no live worker serves should park the row'
);

SELECT results_eq(
    $$SELECT state::text, run_at, attempt, claimed_by, visible_at FROM x_jobs.job WHERE idempotency_key = 't12-hb-1'$$,
    $$VALUES ('delayed', 'infinity'::timestamptz, 0, NULL::text, NULL::timestamptz)$$,
    'A parked row should be delayed until infinity, its attempt given back, held by nobody'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-02 10:00:00+00';

SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['t12-hb'], 't12-old', '30 seconds', 10)$$,
    'A parked row should not be claimed, however late'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue = 't12-hb'$$,
    'A parked row should count as no demand'
);
SELECT results_eq(
    $$SELECT parked, served_by, declared_at FROM x_jobs.job_types() WHERE name = 't12_new'$$,
    $$VALUES (1::bigint, '{}'::text[], NULL::timestamptz)$$,
    'job_types should list an undeclared name that has parked rows, with their count'
);

-- A worker that serves the name, but another queue, or draining: the row stays parked.
DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-elsewhere', ARRAY['t12-other'], jobs => ARRAY['t12_new']);
END $$;
DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-draining', ARRAY['t12-hb'], draining => TRUE, jobs => ARRAY['t12_new']);
END $$;
SELECT is(
    (
        SELECT run_at FROM x_jobs.job
        WHERE idempotency_key = 't12-hb-1'
    ),
    'infinity'::timestamptz,
    'An announce by a worker of another queue, or a draining one, should leave the row parked'
);

DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-new', ARRAY['t12-hb', 't12-other'], jobs => ARRAY['t12_new']);
END $$;
SELECT results_eq(
    $$SELECT state::text, run_at FROM x_jobs.job WHERE idempotency_key = 't12-hb-1'$$,
    $$VALUES ('ready', '2030-01-02 10:00:00+00'::timestamptz)$$,
    'An announce by a worker that serves the name in the row''s queue should make the parked row due now'
);

-- Now a hand-back finds the serving worker: delayed for it, not parked.
SELECT results_eq(
    $$SELECT name FROM x_jobs.claim(ARRAY['t12-hb'], 't12-old', '30 seconds', 10)$$,
    $$VALUES ('t12_new')$$,
    'The old worker may claim the woken row again'
);
SELECT results_eq(
    $$SELECT name, parked, served_by FROM x_jobs.hand_back(
          ARRAY(SELECT id FROM x_jobs.job WHERE idempotency_key = 't12-hb-1'), 't12-old', '3 seconds')$$,
    $$VALUES ('t12_new', FALSE, ARRAY['t12-new'])$$,
    'A hand-back of a name a live worker serves should answer that worker and park nothing'
);
SELECT results_eq(
    $$SELECT state::text, run_at, attempt FROM x_jobs.job WHERE idempotency_key = 't12-hb-1'$$,
    $$VALUES ('delayed', '2030-01-02 10:00:03+00'::timestamptz, 0)$$,
    'A row handed back for a serving worker should be due after the delay, its attempt given back'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['t12-hb'], 't12-old', '30 seconds', 10)$$,
    'A row handed back should not be claimed again before its delay'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-02 10:00:03+00';

SELECT results_eq(
    $$SELECT name, attempt FROM x_jobs.claim(ARRAY['t12-hb'], 't12-new', '30 seconds', 10)$$,
    $$VALUES ('t12_new', 1)$$,
    'After the delay the serving worker should claim it on its first attempt: the hand-backs cost none'
);

SELECT results_eq(
    $$SELECT served_by, parked FROM x_jobs.job_types() WHERE name = 't12_new'$$,
    $$VALUES (ARRAY['t12-elsewhere', 't12-new'], 0::bigint)$$,
    'job_types should list the live, non-draining workers that announced the name, in any queue'
);

-- A worker that announced no list of jobs may serve anything of its queues.
DO $$ BEGIN
    PERFORM x_jobs.enqueue('t12_other_new', queue => 't12-anything', idempotency_key => 't12-hb-2');
END $$;
DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-listless', ARRAY['t12-anything']);
END $$;
SELECT results_eq(
    $$SELECT h.parked, h.served_by FROM x_jobs.hand_back(
          ARRAY(SELECT c.id FROM x_jobs.claim(ARRAY['t12-anything'], 't12-old', '30 seconds', 10) AS c),
          't12-old') AS h$$,
    $$VALUES (FALSE, ARRAY['t12-listless'])$$,
    'A live worker that announced no list of jobs should count as serving every job of its queues'
);

-- Once every serving worker's announce expired, a hand-back parks; a declaration wakes it.
SET LOCAL "x_jobs.fake_now" = '2030-01-03 10:00:00+00';
SELECT results_eq(
    $$SELECT h.parked FROM x_jobs.hand_back(
          ARRAY(SELECT c.id FROM x_jobs.claim(ARRAY['t12-anything'], 't12-old', '30 seconds', 10) AS c),
          't12-old') AS h$$,
    ARRAY[TRUE],
    'A worker whose announce expired should not count as serving'
);
SELECT lives_ok(
    $$SELECT x_jobs.declare_job('t12_other_new')$$,
    'A declaration of a parked name should be accepted'
);
SELECT results_eq(
    $$SELECT state::text, run_at FROM x_jobs.job WHERE idempotency_key = 't12-hb-2'$$,
    $$VALUES ('ready', '2030-01-03 10:00:00+00'::timestamptz)$$,
    'A declaration should make the parked rows of its name due now'
);

-- A listless announce wakes the parked rows of its queues, whatever their name.
DO $$ BEGIN
    PERFORM x_jobs.hand_back(
        ARRAY(SELECT c.id FROM x_jobs.claim(ARRAY['t12-anything'], 't12-old', '30 seconds', 10) AS c), 't12-old'
    );
END $$;
SELECT is(
    (
        SELECT run_at FROM x_jobs.job
        WHERE idempotency_key = 't12-hb-2'
    ),
    'infinity'::timestamptz,
    'The row should be parked again'
);
DO $$ BEGIN
    PERFORM x_jobs.announce_worker('t12-listless-2', ARRAY['t12-anything']);
END $$;
SELECT is(
    (
        SELECT state::text FROM x_jobs.job
        WHERE idempotency_key = 't12-hb-2'
    ),
    'ready',
    'An announce that lists no jobs should wake the parked rows of its queues'
);

-- Only the holder hands back, and only running rows.
SELECT is_empty(
    $$SELECT * FROM x_jobs.hand_back(ARRAY(SELECT id FROM x_jobs.job WHERE idempotency_key = 't12-hb-2'), 't12-old')$$,
    'A hand-back of a row the worker does not hold should change nothing'
);
SELECT is(
    (
        SELECT state::text FROM x_jobs.job
        WHERE idempotency_key = 't12-hb-2'
    ),
    'ready',
    'The row not held should be left as it was'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.hand_back(ARRAY[1], '')$$,
    'XJ011', NULL,
    'A hand-back with an empty worker id should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.hand_back(ARRAY[1], 't12-old', '-1 second')$$,
    'XJ018', 'X_DELAY_INVALID: hand-back delay -00:00:01 is not a delay',
    'A negative hand-back delay should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.hand_back(ARRAY[1], 't12-old', NULL)$$,
    'XJ018', 'X_DELAY_INVALID: hand-back delay NULL is not a delay',
    'A NULL hand-back delay should be refused'
);

------------------------------------------------------------------------------------------------
-- announce_worker's jobs
------------------------------------------------------------------------------------------------

SELECT is(
    (SELECT w.jobs FROM x_jobs.announce_worker('t12-w', ARRAY['q'], jobs => ARRAY['a', 'b']) AS w),
    ARRAY['a', 'b'],
    'announce_worker should keep the jobs a worker serves'
);
SELECT is(
    (SELECT w.jobs FROM x_jobs.announce_worker('t12-w', ARRAY['q']) AS w),
    NULL,
    'An announce that lists no jobs should clear the list'
);
SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t12-w', ARRAY['q'], jobs => ARRAY['a', ''])$$,
    'XJ001', 'X_NAME_INVALID: job name '''' in the jobs list is not a name',
    'An empty job name in the jobs list should be refused'
);
SELECT throws_ok(
    $$SELECT x_jobs.announce_worker('t12-w', ARRAY['q'], jobs => ARRAY[NULL])$$,
    'XJ001', 'X_NAME_INVALID: job name NULL in the jobs list is not a name',
    'A NULL job name in the jobs list should be refused'
);

SELECT * FROM finish();
ROLLBACK;
