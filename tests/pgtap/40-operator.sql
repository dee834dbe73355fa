-- The operator's functions: cancel stops a live row (a running one loses its worker), retry
-- re-queues a dead, failed or cancelled row with all its attempts, pause_queue / resume_queue
-- hold a queue back from claims. The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(45);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- Each job has a queue of its own, so a claim picks exactly the jobs it names.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('ready', NULL::timestamptz, 25, TRUE, NULL),
    ('delayed', '2030-01-01 11:00:00+00', 25, TRUE, NULL),
    ('running', NULL, 25, TRUE, NULL),
    ('done', NULL, 25, TRUE, NULL),
    ('dead', NULL, 2, TRUE, NULL),
    ('failed', NULL, 1, FALSE, NULL),
    ('cancelled', NULL, 25, TRUE, NULL),
    ('r_ready', NULL, 25, TRUE, NULL),
    ('r_delayed', '2030-01-01 11:00:00+00', 25, TRUE, NULL),
    ('r_running', NULL, 25, TRUE, NULL),
    ('r_done', NULL, 25, TRUE, NULL),
    ('k_dead', NULL, 1, TRUE, 't40-key'),
    ('p', NULL, 25, TRUE, NULL),
    ('p2', NULL, 25, TRUE, NULL)
) AS t (tag, run_at, max_attempts, dead_letter, idempotency_key)
CROSS JOIN LATERAL x_jobs.enqueue(
    't40_' || t.tag, queue => 't40-' || t.tag, run_at => t.run_at, max_attempts => t.max_attempts,
    dead_letter => t.dead_letter, idempotency_key => t.idempotency_key
) AS e;

CREATE TEMP TABLE claims AS
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(
    ARRAY['t40-running', 't40-done', 't40-dead', 't40-failed', 't40-r_running', 't40-r_done', 't40-k_dead'],
    'w1', lease => '5 minutes', qty => 10
) AS c;

-- dead fails twice (two job_error rows); failed and k_dead fail their only attempt.
DO $$
BEGIN
    PERFORM x_jobs.complete(tap_helpers.jid('done'), 'w1');
    PERFORM x_jobs.complete(tap_helpers.jid('r_done'), 'w1');
    PERFORM x_jobs.fail(tap_helpers.jid('dead'), 'w1', 'first error', retry_delay => '0');
    PERFORM x_jobs.claim(ARRAY['t40-dead'], 'w2');
    PERFORM x_jobs.fail(tap_helpers.jid('dead'), 'w2', 'second error');
    PERFORM x_jobs.fail(tap_helpers.jid('failed'), 'w1', 'only error');
    PERFORM x_jobs.fail(tap_helpers.jid('k_dead'), 'w1', 'only error');
END
$$;

SELECT results_eq(
    $$SELECT j.tag, k.state::text FROM j JOIN x_jobs.job AS k ON k.id = j.id ORDER BY j.tag$$,
    $$VALUES ('cancelled', 'ready'), ('dead', 'dead'), ('delayed', 'delayed'), ('done', 'done'),
             ('failed', 'failed'), ('k_dead', 'dead'), ('p', 'ready'), ('p2', 'ready'),
             ('r_delayed', 'delayed'), ('r_done', 'done'), ('r_ready', 'ready'), ('r_running', 'running'),
             ('ready', 'ready'), ('running', 'running')$$,
    'Every job of the test should be in its starting state'
);

------------------------------------------------------------------------------------------------
-- cancel
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:05+00';

SELECT is(x_jobs.cancel(tap_helpers.jid('ready')), TRUE, 'cancel should answer true for a ready row');

SELECT is(x_jobs.cancel(tap_helpers.jid('delayed')), TRUE, 'cancel should answer true for a delayed row');

SELECT is(x_jobs.cancel(tap_helpers.jid('running')), TRUE, 'cancel should answer true for a running row');

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.claimed_by, k.visible_at, k.finished_at
      FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag IN ('ready', 'delayed', 'running') ORDER BY j.tag$$,
    $$VALUES ('delayed', 'cancelled', NULL::text, NULL::timestamptz, '2030-01-01 10:00:05+00'::timestamptz),
             ('ready', 'cancelled', NULL::text, NULL::timestamptz, '2030-01-01 10:00:05+00'::timestamptz),
             ('running', 'cancelled', NULL::text, NULL::timestamptz, '2030-01-01 10:00:05+00'::timestamptz)$$,
    'Cancelled rows should be cancelled, finished now, and a running one should lose its worker and lease'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('running'), 'w1', '{"late": true}'),
    FALSE,
    'The worker of a cancelled running row should not be able to complete it'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('running')], 'w1')$$,
    'The heartbeat of the worker of a cancelled row should not list it (the signal to stop)'
);

SELECT results_eq(
    $$SELECT state::text, output FROM x_jobs.job WHERE id = tap_helpers.jid('running')$$,
    $$VALUES ('cancelled', NULL::jsonb)$$,
    'A cancelled row should stay cancelled after its old worker tried to settle it'
);

CREATE TEMP TABLE snap AS
SELECT * FROM x_jobs.job
WHERE id IN (SELECT j.id FROM j);

SELECT results_eq(
    $$SELECT j.tag, x_jobs.cancel(j.id) FROM j WHERE j.tag IN ('done', 'dead', 'failed', 'ready') ORDER BY j.tag$$,
    $$VALUES ('dead', FALSE), ('done', FALSE), ('failed', FALSE), ('ready', FALSE)$$,
    'cancel should answer false for done, dead, failed and already cancelled rows'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id IN (SELECT j.id FROM j WHERE j.tag IN ('done', 'dead', 'failed', 'ready'))$$,
    $$SELECT * FROM snap WHERE id IN (SELECT j.id FROM j WHERE j.tag IN ('done', 'dead', 'failed', 'ready'))$$,
    'cancel of a finished row should change nothing'
);

SELECT throws_ok(
    'SELECT x_jobs.cancel(-1)',
    'XJ014',
    'X_JOB_NOT_FOUND: no job has id -1',
    'cancel should refuse an id no job has'
);

SELECT throws_ok(
    'SELECT x_jobs.cancel(NULL)',
    'XJ014',
    'X_JOB_NOT_FOUND: no job has id NULL',
    'cancel should refuse a NULL id'
);

DO $$
BEGIN
    PERFORM x_jobs.cancel(tap_helpers.jid('cancelled'));
END
$$;

SELECT results_eq(
    $$SELECT job, bucket_seconds, bucket_start, sum(cancelled)::bigint FROM x_jobs.counter
      WHERE job LIKE 't40%' GROUP BY job, bucket_seconds, bucket_start HAVING sum(cancelled) <> 0 ORDER BY job$$,
    $$VALUES ('t40_cancelled', 60, '2030-01-01 10:00:00+00'::timestamptz, 1::bigint),
             ('t40_delayed', 60, '2030-01-01 10:00:00+00'::timestamptz, 1::bigint),
             ('t40_ready', 60, '2030-01-01 10:00:00+00'::timestamptz, 1::bigint),
             ('t40_running', 60, '2030-01-01 10:00:00+00'::timestamptz, 1::bigint)$$,
    'Each cancel that cancelled should add 1 to cancelled in its minute, and a refused one nothing'
);

------------------------------------------------------------------------------------------------
-- retry
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:10+00';

SELECT is(x_jobs.retry(tap_helpers.jid('dead')), TRUE, 'retry should answer true for a dead row');

SELECT results_eq(
    $$SELECT k.state::text, k.attempt, k.run_at, k.finished_at, k.claimed_by, k.visible_at, k.run_id = s.run_id
      FROM x_jobs.job AS k JOIN snap AS s ON s.id = k.id WHERE k.id = tap_helpers.jid('dead')$$,
    $$VALUES ('ready', 0, '2030-01-01 10:00:10+00'::timestamptz, NULL::timestamptz, NULL::text,
              NULL::timestamptz, TRUE)$$,
    'A retried row should be ready now, at attempt 0, unfinished, unheld, with the same run_id'
);

SELECT results_eq(
    $$SELECT attempt, worker, error FROM x_jobs.job_error WHERE job_id = tap_helpers.jid('dead') ORDER BY attempt$$,
    $$VALUES (1, 'w1', 'first error'), (2, 'w2', 'second error')$$,
    'A retried row should keep its error history'
);

SELECT results_eq(
    $$SELECT id, attempt FROM x_jobs.claim(ARRAY['t40-dead'], 'w3')$$,
    $$VALUES (tap_helpers.jid('dead'), 1)$$,
    'A retried row should be claimable at once, starting again from attempt 1'
);

-- The failed row ran a saga: a step its compensation undid, a step whose compensation failed, a
-- wait that timed out and a step still in effect.
INSERT INTO x_jobs.step (job_id, name, compensation, kind, created_at, status, attempt, event)
SELECT
    tap_helpers.jid('failed') AS job_id,
    s.name,
    s.compensation,
    s.kind,
    '2030-01-01 10:00:05+00'::timestamptz AS created_at,
    s.status::x_jobs.step_status AS status,
    1 AS attempt,
    s.event
FROM (
    VALUES
    ('charge', FALSE, 'run', 'done', NULL),
    ('charge', TRUE, 'run', 'done', NULL),
    ('reserve', FALSE, 'run', 'done', NULL),
    ('reserve', TRUE, 'run', 'failed', NULL),
    ('paid', FALSE, 'wait', 'failed', 't40.paid'),
    ('label', FALSE, 'run', 'done', NULL)
) AS s (name, compensation, kind, status, event);

SELECT is(x_jobs.retry(tap_helpers.jid('failed')), TRUE, 'retry should answer true for a failed row');

SELECT results_eq(
    $$SELECT s.name, s.compensation, s.status::text FROM x_jobs.step AS s
      WHERE s.job_id = tap_helpers.jid('failed') ORDER BY s.name, s.compensation$$,
    $$VALUES ('label', FALSE, 'done'), ('reserve', FALSE, 'done')$$,
    'A retried saga should keep the steps still in effect, and run again the undone, failed and timed-out ones'
);

SELECT is(x_jobs.retry(tap_helpers.jid('cancelled')), TRUE, 'retry should answer true for a cancelled row');

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.attempt, k.run_at, k.finished_at
      FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag IN ('failed', 'cancelled') ORDER BY j.tag$$,
    $$VALUES ('cancelled', 'ready', 0, '2030-01-01 10:00:10+00'::timestamptz, NULL::timestamptz),
             ('failed', 'ready', 0, '2030-01-01 10:00:10+00'::timestamptz, NULL::timestamptz)$$,
    'Retried failed and cancelled rows should be ready now at attempt 0 and unfinished'
);

CREATE TEMP TABLE snap_retry AS
SELECT * FROM x_jobs.job
WHERE id IN (
    SELECT j.id FROM j
    WHERE j.tag IN ('r_ready', 'r_delayed', 'r_running', 'r_done', 'k_dead')
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.retry(%s)', tap_helpers.jid('r_ready')),
    'XJ015',
    pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is ready', tap_helpers.jid('r_ready')),
    'retry should refuse a ready row'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.retry(%s)', tap_helpers.jid('r_delayed')),
    'XJ015',
    pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is delayed', tap_helpers.jid('r_delayed')),
    'retry should refuse a delayed row'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.retry(%s)', tap_helpers.jid('r_running')),
    'XJ015',
    pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is running', tap_helpers.jid('r_running')),
    'retry should refuse a running row'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.retry(%s)', tap_helpers.jid('r_done')),
    'XJ015',
    pg_catalog.format('X_JOB_NOT_RETRYABLE: job %s is done', tap_helpers.jid('r_done')),
    'retry should refuse a done row'
);

SELECT throws_ok(
    'SELECT x_jobs.retry(-1)',
    'XJ014',
    'X_JOB_NOT_FOUND: no job has id -1',
    'retry should refuse an id no job has'
);

-- The key of k_dead was freed when it died; a new live row takes it.
INSERT INTO j (tag, id)
SELECT
    'k_live' AS tag,
    e.id
FROM x_jobs.enqueue('t40_k_live', queue => 't40-k_live', idempotency_key => 't40-key') AS e;

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.retry(%s)', tap_helpers.jid('k_dead')),
    'XJ017',
    'X_IDEMPOTENCY_CONFLICT: a live job already holds key ''t40-key''',
    'retry should refuse a dead row whose idempotency key another live row now holds'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job
      WHERE id IN (SELECT j.id FROM j WHERE j.tag IN ('r_ready', 'r_delayed', 'r_running', 'r_done', 'k_dead'))$$,
    'SELECT * FROM snap_retry',
    'A refused retry should change nothing'
);

SELECT results_eq(
    $$SELECT state::text, attempt FROM x_jobs.job WHERE id = tap_helpers.jid('k_live')$$,
    $$VALUES ('ready', 0)$$,
    'The live row holding the key should be untouched by the refused retry'
);

------------------------------------------------------------------------------------------------
-- pause_queue / resume_queue
------------------------------------------------------------------------------------------------

SELECT is(x_jobs.pause_queue('t40-p'), TRUE, 'pause_queue should answer true when it paused the queue');

SELECT is(x_jobs.pause_queue('t40-p'), FALSE, 'pause_queue should answer false when the queue was paused already');

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.queue_pause
        WHERE queue = 't40-p'
    ),
    1,
    'A queue paused twice should have one pause row'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['t40-p'], 'w1')$$,
    'A claim should not take a row of a paused queue'
);

SELECT set_eq(
    $$SELECT id FROM x_jobs.claim(ARRAY['t40-p', 't40-p2'], 'w1', qty => 10)$$,
    ARRAY[tap_helpers.jid('p2')],
    'A claim over a paused and an open queue should take only the open queue''s row'
);

SELECT is(
    (
        SELECT state::text FROM x_jobs.job
        WHERE id = tap_helpers.jid('p')
    ),
    'ready',
    'The row of a paused queue should stay ready'
);

SELECT is(x_jobs.resume_queue('t40-p'), TRUE, 'resume_queue should answer true when the queue was paused');

SELECT is(x_jobs.resume_queue('t40-p'), FALSE, 'resume_queue should answer false when the queue was not paused');

SELECT set_eq(
    $$SELECT id FROM x_jobs.claim(ARRAY['t40-p'], 'w1')$$,
    ARRAY[tap_helpers.jid('p')],
    'A claim should take the row of a resumed queue'
);

SELECT is(
    x_jobs.pause_queue('t40-p'),
    TRUE,
    'pause_queue should answer true again once the queue was resumed'
);

SELECT throws_ok(
    $$SELECT x_jobs.pause_queue('')$$,
    'XJ002',
    'X_QUEUE_INVALID: queue '''' is not a queue name',
    'pause_queue should refuse an empty queue name'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.pause_queue(%L)', pg_catalog.repeat('q', 201)),
    'XJ002',
    pg_catalog.format('X_QUEUE_INVALID: queue %L is not a queue name', pg_catalog.repeat('q', 201)),
    'pause_queue should refuse a queue name enqueue refuses (201 characters)'
);

SELECT throws_ok(
    pg_catalog.format('SELECT x_jobs.resume_queue(%L)', pg_catalog.repeat('q', 201)),
    'XJ002',
    pg_catalog.format('X_QUEUE_INVALID: queue %L is not a queue name', pg_catalog.repeat('q', 201)),
    'resume_queue should refuse a queue name of 201 characters'
);

SELECT throws_ok(
    'SELECT x_jobs.pause_queue(NULL)',
    'XJ002',
    'X_QUEUE_INVALID: queue NULL is not a queue name',
    'pause_queue should refuse a NULL queue name'
);

SELECT throws_ok(
    $$SELECT x_jobs.resume_queue('')$$,
    'XJ002',
    'X_QUEUE_INVALID: queue '''' is not a queue name',
    'resume_queue should refuse an empty queue name'
);

SELECT throws_ok(
    'SELECT x_jobs.resume_queue(NULL)',
    'XJ002',
    'X_QUEUE_INVALID: queue NULL is not a queue name',
    'resume_queue should refuse a NULL queue name'
);

SELECT * FROM finish();
ROLLBACK;
