-- The grants: a producer enqueues and no more, a worker claims and settles but does not operate,
-- an admin operates, a role without a grant cannot reach the schema, and pg_monitor reads demand
-- counts but not the jobs. Each role is created here and rolled back with the test; each block
-- runs under SET ROLE and ends with RESET ROLE. The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(25);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE ROLE t80_producer LOGIN;
CREATE ROLE t80_worker LOGIN;
CREATE ROLE t80_admin LOGIN;
CREATE ROLE t80_nobody LOGIN;
CREATE ROLE t80_monitor LOGIN;
GRANT x_jobs_producer TO t80_producer;
GRANT x_jobs_worker TO t80_worker;
GRANT x_jobs_admin TO t80_admin;
GRANT pg_monitor TO t80_monitor;

------------------------------------------------------------------------------------------------
-- Producer
------------------------------------------------------------------------------------------------

SET ROLE t80_producer;

SELECT is(
    (SELECT e.deduped FROM x_jobs.enqueue('t80_p1', queue => 't80-q') AS e),
    FALSE,
    'A producer should be able to enqueue a job'
);

SELECT is(
    (
        SELECT count(*)::integer
        FROM x_jobs.enqueue_many('[{"name": "t80_p2", "queue": "t80-q"}, {"name": "t80_p3", "queue": "t80-q"}]')
    ),
    2,
    'A producer should be able to enqueue a batch with enqueue_many'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.claim(ARRAY['t80-q'], 't80-w')$$,
    '42501',
    'permission denied for function claim',
    'A producer should not be able to claim'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel(1)$$,
    '42501',
    'permission denied for function cancel',
    'A producer should not be able to cancel'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- Worker
------------------------------------------------------------------------------------------------

SET ROLE t80_worker;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t80-q'], 't80-w', qty => 10)),
    3,
    'A worker should be able to claim'
);

SELECT
    is(
        x_jobs.complete(k.id, 't80-w', '{"ok": true}'),
        TRUE,
        'A worker should be able to complete the row it holds'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p1';

SELECT
    is(
        x_jobs.fail(k.id, 't80-w', 'boom', retry_delay => '1 hour'),
        'delayed'::x_jobs.job_state,
        'A worker should be able to fail the row it holds'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p2';

SELECT results_eq(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY(SELECT id FROM x_jobs.job WHERE name = 't80_p3'), 't80-w')$$,
    $$SELECT id FROM x_jobs.job WHERE name = 't80_p3'$$,
    'A worker should be able to extend the lease of the row it holds'
);

SELECT is(
    (SELECT w.id FROM x_jobs.announce_worker('t80-w', ARRAY['t80-q']) AS w),
    't80-w',
    'A worker should be able to announce itself'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel((SELECT id FROM x_jobs.job WHERE name = 't80_p3'))$$,
    '42501',
    'permission denied for function cancel',
    'A worker should not be able to cancel'
);

SELECT throws_ok(
    $$SELECT x_jobs.purge('0 seconds')$$,
    '42501',
    'permission denied for function purge',
    'A worker should not be able to purge'
);

RESET ROLE;

-- 10:00:40: p3's lease (extended to 10:00:30) lapsed. Taking over a lapsed row also writes the
-- lapse into job_error and counter, which a worker must be allowed to do.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:40+00';

SET ROLE t80_worker;

SELECT results_eq(
    $$SELECT name, claimed_by, attempt FROM x_jobs.claim(ARRAY['t80-q'], 't80-w2')$$,
    $$VALUES ('t80_p3', 't80-w2', 2)$$,
    'A worker should be able to take over a row whose lease lapsed'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT e.worker, e.attempt FROM x_jobs.job_error AS e JOIN x_jobs.job AS k ON k.id = e.job_id
      WHERE k.name = 't80_p3'$$,
    $$VALUES ('t80-w', 1)$$,
    'The take-over by the worker role should have logged the lapsed attempt'
);

------------------------------------------------------------------------------------------------
-- Admin
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:50+00';

SET ROLE t80_admin;

SELECT
    is(
        x_jobs.cancel(k.id),
        TRUE,
        'An admin should be able to cancel a running row'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p3';

SELECT
    is(
        x_jobs.retry(k.id),
        TRUE,
        'An admin should be able to retry a cancelled row'
    )
FROM x_jobs.job AS k
WHERE k.name = 't80_p3';

SELECT is(x_jobs.pause_queue('t80-q'), TRUE, 'An admin should be able to pause a queue');

SELECT is(x_jobs.resume_queue('t80-q'), TRUE, 'An admin should be able to resume a queue');

SELECT is(x_jobs.purge('0 seconds'), 1::bigint, 'An admin should be able to purge (the done row)');

SELECT is(
    x_jobs.rollup_counters('0 seconds', '2 days', '400 days'),
    3::bigint,
    'An admin should be able to roll the counters up (the 10:00 minute of each of the three job names)'
);

SELECT results_eq(
    $$SELECT name, state::text FROM x_jobs.job WHERE name LIKE 't80%' ORDER BY name$$,
    $$VALUES ('t80_p2', 'delayed'), ('t80_p3', 'ready')$$,
    'The admin''s calls should have taken effect: p1 purged, p3 retried'
);

RESET ROLE;

------------------------------------------------------------------------------------------------
-- No grant
------------------------------------------------------------------------------------------------

SET ROLE t80_nobody;

SELECT throws_ok(
    $$SELECT x_jobs.enqueue('t80_nobody')$$,
    '42501',
    'permission denied for schema x_jobs',
    'A role without a grant should not be able to enqueue'
);

RESET ROLE;

SELECT is_empty(
    $$SELECT * FROM x_jobs.job WHERE name = 't80_nobody'$$,
    'The refused enqueue should have inserted nothing'
);

------------------------------------------------------------------------------------------------
-- Monitoring
------------------------------------------------------------------------------------------------

SET ROLE t80_monitor;

-- p3 is ready again; p2 waits until 11:00.
SELECT results_eq(
    $$SELECT * FROM x_jobs.queue_demand() WHERE queue = 't80-q'$$,
    $$VALUES ('t80-q', 1::bigint)$$,
    'A pg_monitor member should be able to read queue_demand'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.job',
    '42501',
    'permission denied for table job',
    'A pg_monitor member should not be able to read the jobs'
);

SELECT throws_ok(
    'SELECT * FROM x_jobs.job_error',
    '42501',
    'permission denied for table job_error',
    'A pg_monitor member should not be able to read the error history'
);

RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
