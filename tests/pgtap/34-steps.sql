-- The steps of a run: x_jobs.steps answers what a run recorded (resolving the timers that ran
-- out), step_record keeps a run step's result (the first done result wins, a failed one is
-- replaced), step_sleep and step_wait suspend the run (no worker, the attempt given back, due at
-- the wake time or never) or answer at once when the time came or the event was published, and
-- progress reports on a held run. Every refusal, with its SQLSTATE, message, DETAIL and HINT.
-- Each scenario is a job in a queue of its own; the clock is moved with SET LOCAL
-- "x_jobs.fake_now", which is also the clock of events and first-reached instants.
BEGIN;
SELECT plan(115);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- Claims the job of a tag (its queue is 't34-' || tag) for `p_worker`; answers the attempt it
-- runs, or NULL when nothing was handed out.
CREATE FUNCTION pg_temp.take(p_tag text, p_worker text)
RETURNS integer
LANGUAGE sql
AS $$
    SELECT c.attempt
    FROM x_jobs.claim(ARRAY['t34-' || p_tag], p_worker, '5 minutes', 10) AS c
    WHERE c.state = 'running'
$$;

-- The job row of a tag, the columns a suspension and a claim change.
CREATE FUNCTION pg_temp.job_of(p_tag text)
RETURNS TABLE (state text, claimed_by text, visible_at timestamptz, attempt integer, run_at timestamptz)
LANGUAGE sql
STABLE
AS $$
    SELECT k.state::text, k.claimed_by, k.visible_at, k.attempt, k.run_at
    FROM x_jobs.job AS k
    WHERE k.id = tap_helpers.jid(p_tag)
$$;

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM
    unnest(ARRAY[
        'rec', 'conf', 'nap', 'zero', 'wto', 'wto_nokey', 'wnow', 'winf', 'refuse', 'prog',
        'w_before', 'w_since', 'w_key', 'w_any', 'w_match', 'w_nomatch', 'w_later'
    ]) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t34_' || t.tag, queue => 't34-' || t.tag) AS e;

SELECT is(
    (
        SELECT count(*)::integer FROM j
        WHERE pg_temp.take(j.tag, 'w1') = 1
    ),
    17,
    'Every job of the test should be running its first attempt, held by w1 (setup)'
);

------------------------------------------------------------------------------------------------
-- step_record and replay
------------------------------------------------------------------------------------------------

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w1', 'fetch', '{"n": 1}'),
    'done'::x_jobs.step_status,
    'step_record with an output should answer done'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:05+00';

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w1', 'fetch', '{"n": 2}'),
    'done'::x_jobs.step_status,
    'Recording a done step again should answer done'
);

SELECT results_eq(
    $$SELECT kind, status::text, output, error, attempt, created_at, resolved_by, resolved_at
      FROM x_jobs.step WHERE job_id = tap_helpers.jid('rec') AND name = 'fetch'$$,
    $$VALUES ('run', 'done', '{"n": 1}'::jsonb, NULL::text, 1, '2030-01-01 10:00:00+00'::timestamptz, 'worker',
              '2030-01-01 10:00:00+00'::timestamptz)$$,
    'The first done result should be the one kept: a second record of a done step changes nothing'
);

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w1', 'charge', error => 'card declined'),
    'failed'::x_jobs.step_status,
    'step_record with an error should answer failed'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:06+00';

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w1', 'charge', error => 'gateway timeout'),
    'failed'::x_jobs.step_status,
    'A second error for a failed step should answer failed'
);

SELECT results_eq(
    $$SELECT status::text, output, error, attempt, created_at, resolved_at
      FROM x_jobs.step WHERE job_id = tap_helpers.jid('rec') AND name = 'charge'$$,
    $$VALUES ('failed', NULL::jsonb, 'gateway timeout', 1, '2030-01-01 10:00:05+00'::timestamptz,
              '2030-01-01 10:00:06+00'::timestamptz)$$,
    'A failed step should keep the latest error, and the instant it was first reached'
);

-- The attempt fails; the retry (attempt 2, another worker) replays the recorded steps.
SELECT is(
    x_jobs.fail(tap_helpers.jid('rec'), 'w1', 'charge failed', retry_delay => '0'),
    'ready'::x_jobs.job_state,
    'The job should be ready again after its attempt failed (setup)'
);

SELECT is(pg_temp.take('rec', 'w2'), 2, 'The retry should run attempt 2 on w2 (setup)');

SELECT results_eq(
    $$SELECT name, status::text, output, error, attempt FROM x_jobs.steps(tap_helpers.jid('rec'), 'w2')$$,
    $$VALUES ('fetch', 'done', '{"n": 1}'::jsonb, NULL::text, 1),
             ('charge', 'failed', NULL, 'gateway timeout', 1)$$,
    'steps should answer every recorded step in the order the run reached them (not by name)'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w2', 'charge', '{"charge": "ch_1"}'),
    'done'::x_jobs.step_status,
    'A failed step recorded again with an output should answer done'
);

SELECT results_eq(
    $$SELECT status::text, output, error, attempt, created_at, resolved_at
      FROM x_jobs.step WHERE job_id = tap_helpers.jid('rec') AND name = 'charge'$$,
    $$VALUES ('done', '{"charge": "ch_1"}'::jsonb, NULL::text, 2, '2030-01-01 10:00:05+00'::timestamptz,
              '2030-01-01 10:01:00+00'::timestamptz)$$,
    'The later result should replace the failed one, with the attempt that recorded it and no error'
);

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w2', 'charge', error => 'too late'),
    'done'::x_jobs.step_status,
    'An error recorded for a done step should answer done'
);

SELECT results_eq(
    $$SELECT status::text, output, error FROM x_jobs.step WHERE job_id = tap_helpers.jid('rec') AND name = 'charge'$$,
    $$VALUES ('done', '{"charge": "ch_1"}'::jsonb, NULL::text)$$,
    'An error recorded for a done step should change nothing'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:02:00+00';

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w2', 'charge', '{"refund": "re_1"}', compensation => TRUE),
    'done'::x_jobs.step_status,
    'The compensation of a done step should be recorded under the same name'
);

SELECT results_eq(
    $$SELECT name, compensation, status::text, output FROM x_jobs.steps(tap_helpers.jid('rec'), 'w2')$$,
    $$VALUES ('fetch', FALSE, 'done', '{"n": 1}'::jsonb),
             ('charge', FALSE, 'done', '{"charge": "ch_1"}'),
             ('charge', TRUE, 'done', '{"refund": "re_1"}')$$,
    'steps should answer the compensation beside its step, which keeps its own output'
);

SELECT is(
    x_jobs.step_record(tap_helpers.jid('rec'), 'w2', 'verify'),
    'done'::x_jobs.step_status,
    'A step with neither output nor error should answer done'
);

SELECT results_eq(
    $$SELECT status::text, output, error FROM x_jobs.step WHERE job_id = tap_helpers.jid('rec') AND name = 'verify'$$,
    $$VALUES ('done', NULL::jsonb, NULL::text)$$,
    'A step with neither output nor error should be recorded done, with no output'
);

------------------------------------------------------------------------------------------------
-- A name is one kind of step
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT is(
    x_jobs.step_record(tap_helpers.jid('conf'), 'w1', 'a', '{"a": 1}'),
    'done'::x_jobs.step_status,
    'A run step should be recorded (setup)'
);

SELECT results_eq(
    $$SELECT status::text FROM x_jobs.step_sleep(tap_helpers.jid('conf'), 'w1', 'nap', '0')$$,
    $$VALUES ('done')$$,
    'A sleep of zero should be done at once (setup)'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_sleep(tap_helpers.jid('conf'), 'w1', 'a', '1 hour')$$,
    'XJ027',
    pg_catalog.format('X_STEP_CONFLICT: step ''a'' of job %s is a run step, not a sleep', tap_helpers.jid('conf')),
    'step_sleep should refuse a name that a run step of the run has'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('conf'), 'w1', 'a', 't34.never')$$,
    'XJ027',
    pg_catalog.format('X_STEP_CONFLICT: step ''a'' of job %s is a run step, not a wait', tap_helpers.jid('conf')),
    'step_wait should refuse a name that a run step of the run has'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('conf'), 'w1', 'nap', 't34.never')$$,
    'XJ027',
    pg_catalog.format('X_STEP_CONFLICT: step ''nap'' of job %s is a sleep step, not a wait', tap_helpers.jid('conf')),
    'step_wait should refuse a name that a sleep of the run has'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_record(tap_helpers.jid('conf'), 'w1', 'nap', '{}') $q$)$$,
    $$VALUES ('XJ027',
              pg_catalog.format('X_STEP_CONFLICT: step ''nap'' of job %s is a sleep step, not a run step',
                  tap_helpers.jid('conf')),
              '', 'Give every step of a run its own name.')$$,
    'step_record should refuse a name that a sleep of the run has, with a HINT'
);

SELECT results_eq(
    $$SELECT name, kind, status::text, output FROM x_jobs.steps(tap_helpers.jid('conf'), 'w1') ORDER BY name$$,
    $$VALUES ('a', 'run', 'done', '{"a": 1}'::jsonb), ('nap', 'sleep', 'done', NULL)$$,
    'The refused calls should have left the recorded steps as they were'
);

------------------------------------------------------------------------------------------------
-- step_sleep: suspend, wake, replay
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE nap_1 AS
SELECT s.* FROM x_jobs.step_sleep(tap_helpers.jid('nap'), 'w1', 'rest', '1 hour') AS s;

SELECT results_eq(
    $$SELECT job_id, name, compensation, kind, status::text, created_at, timeout_at, attempt, resolved_by FROM nap_1$$,
    $$VALUES (tap_helpers.jid('nap'), 'rest', FALSE, 'sleep', 'waiting', '2030-01-01 10:00:00+00'::timestamptz,
              '2030-01-01 11:00:00+00'::timestamptz, 1, NULL::text)$$,
    'step_sleep should answer the step waiting until now + duration'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('nap')$$,
    $$VALUES ('suspended', NULL::text, NULL::timestamptz, 0, '2030-01-01 11:00:00+00'::timestamptz)$$,
    'A sleep should suspend the run: held by no worker, no lease, the attempt given back, due at the wake time'
);

SELECT is(
    (
        SELECT k.claims FROM x_jobs.job AS k
        WHERE k.id = tap_helpers.jid('nap')
    ),
    1,
    'A suspension should not count as a claim'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.steps(tap_helpers.jid('nap'), 'w1') $q$)$$,
    $$VALUES ('XJ026',
              pg_catalog.format(
                  'X_JOB_NOT_HELD: job %s is suspended and not held by worker ''w1''', tap_helpers.jid('nap')
              ),
              'It is held by no worker.',
              'The job was cancelled, or its lease lapsed and another worker took it: stop its body.')$$,
    'The worker that suspended a run should no longer hold it: steps should refuse it, saying no worker holds it'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:59:59+00';

SELECT is(pg_temp.take('nap', 'w2'), NULL, 'A sleeping run should not be claimed before its wake time');

-- The operator cancels and retries the run at 10:30: it runs again before the sleep ends, and
-- the replayed sleep keeps its first wake time.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:30:00+00';

SELECT is(x_jobs.cancel(tap_helpers.jid('nap')), TRUE, 'The sleeping run should be cancelled (setup)');

SELECT is(x_jobs.retry(tap_helpers.jid('nap')), TRUE, 'The cancelled run should be retried (setup)');

SELECT is(pg_temp.take('nap', 'w2'), 1, 'The retried run should be claimed at once (setup)');

SELECT results_eq(
    $$SELECT status::text, created_at, timeout_at
      FROM x_jobs.step_sleep(tap_helpers.jid('nap'), 'w2', 'rest', '2 hours')$$,
    $$VALUES ('waiting', '2030-01-01 10:00:00+00'::timestamptz, '2030-01-01 11:00:00+00'::timestamptz)$$,
    'A replayed sleep should keep its first wake time, whatever duration the replay passes'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('nap')$$,
    $$VALUES ('suspended', NULL::text, NULL::timestamptz, 0, '2030-01-01 11:00:00+00'::timestamptz)$$,
    'A replayed sleep not yet due should suspend the run again until the first wake time'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:00:00+00';

SELECT is(
    pg_temp.take('nap', 'w3'),
    1,
    'A sleeping run should be claimed once its wake time has come, on the attempt it slept in'
);

SELECT results_eq(
    $$SELECT name, status::text, timeout_at, resolved_by, resolved_at FROM x_jobs.steps(tap_helpers.jid('nap'), 'w3')$$,
    $$VALUES ('rest', 'done', '2030-01-01 11:00:00+00'::timestamptz, 'timeout',
              '2030-01-01 11:00:00+00'::timestamptz)$$,
    'steps should resolve a sleep whose time has come as done'
);

SELECT results_eq(
    $$SELECT status::text, timeout_at FROM x_jobs.step_sleep(tap_helpers.jid('nap'), 'w3', 'rest', '1 hour')$$,
    $$VALUES ('done', '2030-01-01 11:00:00+00'::timestamptz)$$,
    'The sleep replayed after the wake should answer done, with its first wake time'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('nap')$$,
    $$VALUES ('running', 'w3', '2030-01-01 11:05:00+00'::timestamptz, 1, '2030-01-01 11:00:00+00'::timestamptz)$$,
    'A done sleep should leave the run running on its worker'
);

-- A sleep whose time has come when it is reached: done, no suspension.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT results_eq(
    $$SELECT status::text, timeout_at, resolved_by, resolved_at
      FROM x_jobs.step_sleep(tap_helpers.jid('zero'), 'w1', 'now', '0')$$,
    $$VALUES ('done', '2030-01-01 10:00:00+00'::timestamptz, 'timeout', '2030-01-01 10:00:00+00'::timestamptz)$$,
    'A sleep of zero should answer done at once'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('zero')$$,
    $$VALUES ('running', 'w1', '2030-01-01 10:05:00+00'::timestamptz, 1, '2030-01-01 10:00:00+00'::timestamptz)$$,
    'A sleep that is due should not suspend the run'
);

------------------------------------------------------------------------------------------------
-- step_wait: timeouts and the wait without end
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT results_eq(
    $$SELECT kind, event, event_key, match, since, timeout_at, status::text
      FROM x_jobs.step_wait(tap_helpers.jid('wto'), 'w1', 'approval', 't34.approved', 'o-9', timeout => '30 minutes')$$,
    $$VALUES ('wait', 't34.approved', 'o-9', NULL::jsonb, '2030-01-01 10:00:00+00'::timestamptz,
              '2030-01-01 10:30:00+00'::timestamptz, 'waiting')$$,
    'step_wait with no matching event should answer the step waiting, since the reach, until now + timeout'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('wto')$$,
    $$VALUES ('suspended', NULL::text, NULL::timestamptz, 0, '2030-01-01 10:30:00+00'::timestamptz)$$,
    'A wait with a timeout should suspend the run until the timeout'
);

SELECT results_eq(
    $$SELECT status::text, timeout_at
      FROM x_jobs.step_wait(tap_helpers.jid('wto_nokey'), 'w1', 'approval', 't34.approved', timeout => '10 minutes')$$,
    $$VALUES ('waiting', '2030-01-01 10:10:00+00'::timestamptz)$$,
    'A keyless wait with a timeout should answer the step waiting until now + timeout'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:29:59+00';

SELECT is(pg_temp.take('wto', 'w2'), NULL, 'A waiting run should not be claimed before its timeout');

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:30:00+00';

SELECT is(pg_temp.take('wto', 'w2'), 1, 'A waiting run should be claimed when its timeout comes');

CREATE TEMP TABLE wto_steps AS
SELECT s.* FROM x_jobs.steps(tap_helpers.jid('wto'), 'w2') AS s;

SELECT results_eq(
    $$SELECT name, status::text, output, resolved_by, resolved_at FROM wto_steps$$,
    $$VALUES ('approval', 'failed', NULL::jsonb, 'timeout', '2030-01-01 10:30:00+00'::timestamptz)$$,
    'steps should resolve a wait whose timeout came as failed'
);

SELECT is(
    (SELECT w.error FROM wto_steps AS w),
    pg_catalog.format(
        'X_STEP_TIMEOUT: no event ''t34.approved'' with key ''o-9'' came before %s',
        timestamptz '2030-01-01 10:30:00+00'
    ),
    'The timed-out wait should fail with an X_STEP_TIMEOUT error naming the event, its key and the timeout'
);

SELECT is(pg_temp.take('wto_nokey', 'w2'), 1, 'The keyless waiting run should be claimed after its timeout');

SELECT results_eq(
    $$SELECT status::text, error FROM x_jobs.steps(tap_helpers.jid('wto_nokey'), 'w2')$$,
    $$VALUES ('failed', pg_catalog.format(
        'X_STEP_TIMEOUT: no event ''t34.approved'' came before %s', timestamptz '2030-01-01 10:10:00+00'
    ))$$,
    'steps should fail a timed-out keyless wait with an X_STEP_TIMEOUT error that names no key'
);

SELECT results_eq(
    $$SELECT status::text, error LIKE 'X_STEP_TIMEOUT: %'
      FROM x_jobs.step_wait(tap_helpers.jid('wto'), 'w2', 'approval', 't34.approved', 'o-9', timeout => '30 minutes')$$,
    $$VALUES ('failed', TRUE)$$,
    'The wait replayed after its timeout should answer the failure'
);

SELECT is(
    (SELECT state FROM pg_temp.job_of('wto')),
    'running',
    'A replayed failed wait should leave the run running, for its body to handle the error'
);

-- A timeout of zero with no event: failed at once, no suspension.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT results_eq(
    $$SELECT status::text, error, resolved_by
      FROM x_jobs.step_wait(tap_helpers.jid('wnow'), 'w1', 'poll', 't34.never', timeout => '0')$$,
    $$VALUES ('failed',
              pg_catalog.format(
                  'X_STEP_TIMEOUT: no event ''t34.never'' came before %s', timestamptz '2030-01-01 10:00:00+00'
              ),
              'timeout')$$,
    'A wait with timeout zero and no event should fail at once with X_STEP_TIMEOUT'
);

SELECT is(
    (SELECT state FROM pg_temp.job_of('wnow')),
    'running',
    'A wait that failed at once should not suspend the run'
);

-- No timeout: only a publish or an operator wakes the run, never a claim.
SELECT results_eq(
    $$SELECT status::text, timeout_at FROM x_jobs.step_wait(tap_helpers.jid('winf'), 'w1', 'forever', 't34.never')$$,
    $$VALUES ('waiting', NULL::timestamptz)$$,
    'A wait without a timeout should answer the step waiting, with no timeout'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('winf')$$,
    $$VALUES ('suspended', NULL::text, NULL::timestamptz, 0, 'infinity'::timestamptz)$$,
    'A wait without a timeout should suspend the run with run_at infinity'
);

SET LOCAL "x_jobs.fake_now" = '2999-12-31 23:59:59+00';

SELECT is(pg_temp.take('winf', 'w2'), NULL, 'A run waiting without a timeout should never be claimed');

------------------------------------------------------------------------------------------------
-- step_wait: events published before the wait is reached
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE ev (tag text PRIMARY KEY, id bigint NOT NULL);

-- Publishes an event and keeps its id under a tag.
CREATE FUNCTION pg_temp.publish_as(p_tag text, p_event text, p_payload jsonb, p_key text DEFAULT NULL)
RETURNS void
LANGUAGE sql
AS $$
    INSERT INTO ev (tag, id)
    SELECT p_tag, p.event_id FROM x_jobs.publish(p_event, p_payload, p_key) AS p
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 09:00:00+00';
SELECT pg_temp.publish_as('e0', 't34.paid', '{"order": 1, "amount": 10}', 'o1');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 09:30:00+00';
SELECT pg_temp.publish_as('e1', 't34.paid', '{"order": 2, "amount": 20}', 'o2');
SET LOCAL "x_jobs.fake_now" = '2030-01-01 09:45:00+00';
SELECT pg_temp.publish_as('e2', 't34.paid', '{"order": 3}');
-- Another event name, with a payload every match below would take: never matched by t34.paid.
SELECT pg_temp.publish_as('other', 't34.other', '{"order": 3}');

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

SELECT results_eq(
    $$SELECT status::text, since, event_id
      FROM x_jobs.step_wait(tap_helpers.jid('w_before'), 'w1', 'pay', 't34.paid')$$,
    $$VALUES ('waiting', '2030-01-01 10:00:00+00'::timestamptz, NULL::bigint)$$,
    'A wait should not match the events published before the run first reached it'
);

SELECT is(
    (SELECT state FROM pg_temp.job_of('w_before')),
    'suspended',
    'A wait that matched nothing should suspend the run'
);

SELECT results_eq(
    $$SELECT status::text, output, event_id, resolved_by, resolved_at, since
      FROM x_jobs.step_wait(tap_helpers.jid('w_since'), 'w1', 'pay', 't34.paid', since => '2030-01-01 09:10:00+00')$$,
    $$SELECT 'done', '{"order": 2, "amount": 20}'::jsonb, ev.id, 'event', '2030-01-01 10:00:00+00'::timestamptz,
             '2030-01-01 09:10:00+00'::timestamptz
      FROM ev WHERE ev.tag = 'e1'$$,
    'A wait with an earlier since should match the first event published from then on, and answer its payload'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('w_since')$$,
    $$VALUES ('running', 'w1', '2030-01-01 10:05:00+00'::timestamptz, 1, '2030-01-01 10:00:00+00'::timestamptz)$$,
    'A wait that matched at once should leave the run running on its worker'
);

SELECT results_eq(
    $$SELECT status::text, event_id
      FROM x_jobs.step_wait(tap_helpers.jid('w_key'), 'w1', 'pay', 't34.paid', 'o2', since => '2030-01-01 08:00:00+00')$$,
    $$SELECT 'done', ev.id FROM ev WHERE ev.tag = 'e1'$$,
    'A keyed wait should match only an event published with its key, not an earlier one of another key'
);

SELECT results_eq(
    $$SELECT status::text, event_id
      FROM x_jobs.step_wait(tap_helpers.jid('w_any'), 'w1', 'pay', 't34.paid', since => '2030-01-01 08:00:00+00')$$,
    $$SELECT 'done', ev.id FROM ev WHERE ev.tag = 'e0'$$,
    'A keyless wait should match the first event of its name whatever its key'
);

SELECT results_eq(
    $$SELECT status::text, event_id, output
      FROM x_jobs.step_wait(
          tap_helpers.jid('w_match'), 'w1', 'pay', 't34.paid', match => '{"order": 3}', since => '2030-01-01 08:00:00+00'
      )$$,
    $$SELECT 'done', ev.id, '{"order": 3}'::jsonb FROM ev WHERE ev.tag = 'e2'$$,
    'A wait with match should take the first event whose payload contains it'
);

SELECT results_eq(
    $$SELECT status::text, event_id, timeout_at
      FROM x_jobs.step_wait(
          tap_helpers.jid('w_nomatch'), 'w1', 'pay', 't34.paid', match => '{"order": 1, "amount": 11}',
          timeout => '1 hour', since => '2030-01-01 08:00:00+00'
      )$$,
    $$VALUES ('waiting', NULL::bigint, '2030-01-01 11:00:00+00'::timestamptz)$$,
    'A wait should not match an event whose payload contains only part of its match'
);

SELECT results_eq(
    $$SELECT status::text, since
      FROM x_jobs.step_wait(tap_helpers.jid('w_later'), 'w1', 'pay', 't34.paid', since => '2030-01-01 12:00:00+00')$$,
    $$VALUES ('waiting', '2030-01-01 10:00:00+00'::timestamptz)$$,
    'A since later than the first reach should be taken as the first reach'
);

------------------------------------------------------------------------------------------------
-- Refusals
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

-- X_STEP_INVALID
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_record(tap_helpers.jid('refuse'), 'w1', '') $q$)$$,
    $$VALUES ('XJ024', 'X_STEP_INVALID: step name '''' is empty or longer than 200 characters', '',
              'Name each step of a run with a short text unique within the run, such as ''charge''.')$$,
    'step_record should refuse an empty step name, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_sleep(tap_helpers.jid('refuse'), 'w1', NULL, '1 hour')$$,
    'XJ024',
    'X_STEP_INVALID: step name '''' is empty or longer than 200 characters',
    'step_sleep should refuse a missing step name'
);

SELECT throws_ok(
    pg_catalog.format(
        $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', %L, 't34.e')$$, pg_catalog.repeat('s', 201)
    ),
    'XJ024',
    pg_catalog.format(
        'X_STEP_INVALID: step name %L is empty or longer than 200 characters', pg_catalog.repeat('s', 201)
    ),
    'step_wait should refuse a step name of 201 characters'
);

SELECT is(
    x_jobs.step_record(tap_helpers.jid('refuse'), 'w1', pg_catalog.repeat('s', 200)),
    'done'::x_jobs.step_status,
    'A step name of 200 characters should be accepted'
);

-- X_TIMEOUT_INVALID
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_sleep(tap_helpers.jid('refuse'), 'w1', 's', NULL) $q$)$$,
    $$VALUES ('XJ025', 'X_TIMEOUT_INVALID: sleep of NULL is missing or negative', '',
              'Pass a duration of zero or more, such as ''1 day''.')$$,
    'step_sleep should refuse a missing duration, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_sleep(tap_helpers.jid('refuse'), 'w1', 's', '-1 second')$$,
    'XJ025',
    pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s is missing or negative', interval '-1 second'),
    'step_sleep should refuse a negative duration'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught(
          $q$ SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', 't34.e', timeout => '-1 minute') $q$
      )$$,
    $$VALUES ('XJ025', pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s is negative', interval '-1 minute'),
              '', 'Pass a timeout of zero or more, or NULL to wait for as long as it takes.')$$,
    'step_wait should refuse a negative timeout, with a HINT'
);

-- The run is due when a sleep or a timeout ends: past the year 9999 it was "timestamp out of
-- range" (or a time clients cannot read), now a refusal that says so.
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught(
          $q$ SELECT x_jobs.step_sleep(tap_helpers.jid('refuse'), 'w1', 's', '100000000 years') $q$
      )$$,
    $$VALUES ('XJ025',
              pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s ends past the year 9999', interval '100000000 years'),
              '', 'Pass a duration that ends before the year 10000, such as ''1 day''.')$$,
    'step_sleep should refuse a sleep that ends past the year 9999, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', 't34.e', timeout => '8000 years')$$,
    'XJ025',
    pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s ends past the year 9999', interval '8000 years'),
    'step_wait should refuse a timeout that ends past the year 9999'
);

-- X_JOB_NOT_HELD, X_JOB_NOT_FOUND, X_WORKER_INVALID
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_record(tap_helpers.jid('refuse'), 'w2', 's') $q$)$$,
    $$VALUES ('XJ026',
              pg_catalog.format(
                  'X_JOB_NOT_HELD: job %s is running and not held by worker ''w2''', tap_helpers.jid('refuse')
              ),
              'It is held by ''w1''.',
              'The job was cancelled, or its lease lapsed and another worker took it: stop its body.')$$,
    'step_record by a worker that does not hold the job should be refused, the DETAIL naming the holder'
);

-- A settled row keeps the worker that ran it in claimed_by: no worker holds it all the same.
INSERT INTO j (tag, id)
SELECT
    'settled' AS tag,
    e.id
FROM x_jobs.enqueue('settled', queue => 't34-settled') AS e;
SELECT is(pg_temp.take('settled', 'w1'), 1, 'w1 should claim the job (setup)');
SELECT ok(x_jobs.complete(tap_helpers.jid('settled'), 'w1'), 'w1 should complete it (setup)');
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_record(tap_helpers.jid('settled'), 'w1', 's') $q$)$$,
    $$VALUES ('XJ026',
              pg_catalog.format(
                  'X_JOB_NOT_HELD: job %s is done and not held by worker ''w1''', tap_helpers.jid('settled')
              ),
              'It is held by no worker.',
              'The job was cancelled, or its lease lapsed and another worker took it: stop its body.')$$,
    'step_record on a job its worker completed should be refused, the DETAIL saying no worker holds it'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('rec'), 'w1', 's', 't34.e')$$,
    'XJ026',
    pg_catalog.format('X_JOB_NOT_HELD: job %s is running and not held by worker ''w1''', tap_helpers.jid('rec')),
    'step_wait by the worker that held an earlier attempt should be refused'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_sleep(tap_helpers.jid('w_before'), 'w1', 's', '1 hour')$$,
    'XJ026',
    pg_catalog.format('X_JOB_NOT_HELD: job %s is suspended and not held by worker ''w1''', tap_helpers.jid('w_before')),
    'step_sleep on a suspended run should be refused'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_record(-1, 'w1', 's') $q$)$$,
    $$VALUES ('XJ014', 'X_JOB_NOT_FOUND: no job has id -1', '', 'Pass the id of the job the worker claimed.')$$,
    'step_record for a job that does not exist should be refused, with a HINT'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.steps(tap_helpers.jid('refuse'), '') $q$)$$,
    $$VALUES ('XJ011', 'X_WORKER_INVALID: worker id '''' is empty', '', 'Pass the id the worker claimed with.')$$,
    'steps should refuse an empty worker id, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), NULL, 's', 't34.e')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id NULL is empty',
    'step_wait should refuse a missing worker id'
);

SELECT throws_ok(
    $$SELECT x_jobs.progress(tap_helpers.jid('refuse'), '', 1, 2)$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'progress should refuse an empty worker id'
);

-- X_EVENT_INVALID
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', '') $q$)$$,
    $$VALUES ('XJ028', 'X_EVENT_INVALID: event name '''' is missing, empty or longer than 200 characters',
              '', 'Name the event with a short text, such as ''order.paid''.')$$,
    'step_wait should refuse an empty event name, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', NULL)$$,
    'XJ028',
    'X_EVENT_INVALID: event name NULL is missing, empty or longer than 200 characters',
    'step_wait should refuse a missing event name'
);

SELECT throws_ok(
    pg_catalog.format(
        $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', %L)$$, pg_catalog.repeat('e', 201)
    ),
    'XJ028',
    pg_catalog.format(
        'X_EVENT_INVALID: event name %L is missing, empty or longer than 200 characters', pg_catalog.repeat('e', 201)
    ),
    'step_wait should refuse an event name of 201 characters'
);

-- X_MATCH_INVALID
SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught(
          $q$ SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', 't34.e', match => '[1]') $q$
      )$$,
    $$VALUES ('XJ029', 'X_MATCH_INVALID: match [1] is not a JSON object', '',
              'Pass an object that the payload must contain, such as ''{"order": 42}''.')$$,
    'step_wait should refuse a match that is an array, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.step_wait(tap_helpers.jid('refuse'), 'w1', 's', 't34.e', match => '"x"')$$,
    'XJ029',
    'X_MATCH_INVALID: match "x" is not a JSON object',
    'step_wait should refuse a match that is a string'
);

-- X_PAYLOAD_TOO_LARGE
SET LOCAL "x_jobs.max_payload_bytes" = '100';

SELECT results_eq(
    $$SELECT err_state, err_message LIKE 'X_PAYLOAD_TOO_LARGE: output of % bytes exceeds the limit of 100', err_detail,
             err_hint IS NOT NULL
      FROM tap_helpers.caught(
          $q$ SELECT x_jobs.step_record(tap_helpers.jid('refuse'), 'w1', 'big',
                  pg_catalog.jsonb_build_object('x', pg_catalog.repeat('x', 200))) $q$
      )$$,
    $$VALUES ('XJ003', TRUE, pg_catalog.format('For step ''big'' of job %s.', tap_helpers.jid('refuse')), TRUE)$$,
    'step_record should refuse an output larger than x_jobs.max_payload_bytes'
);

RESET "x_jobs.max_payload_bytes";

SELECT results_eq(
    $$SELECT name FROM x_jobs.step WHERE job_id = tap_helpers.jid('refuse')$$,
    $$VALUES (pg_catalog.repeat('s', 200))$$,
    'The refused step calls should have recorded nothing'
);

SELECT results_eq(
    $$SELECT * FROM pg_temp.job_of('refuse')$$,
    $$VALUES ('running', 'w1', '2030-01-01 10:05:00+00'::timestamptz, 1, '2030-01-01 10:00:00+00'::timestamptz)$$,
    'The refused step calls should have left the run held, unsuspended'
);

------------------------------------------------------------------------------------------------
-- progress
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT is(
    x_jobs.progress(tap_helpers.jid('prog'), 'w1', 3, 10, 'copying'),
    TRUE,
    'progress by the worker holding the job should answer true'
);

SELECT results_eq(
    $$SELECT progress - 'at', (progress ->> 'at')::timestamptz FROM x_jobs.job WHERE id = tap_helpers.jid('prog')$$,
    $$VALUES ('{"done": 3, "total": 10, "note": "copying"}'::jsonb, '2030-01-01 10:01:00+00'::timestamptz)$$,
    'progress should store done, total, the note and the instant on the job'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:02:00+00';

SELECT is(x_jobs.progress(tap_helpers.jid('prog'), 'w1', 4), TRUE, 'progress with a done only should answer true');

SELECT results_eq(
    $$SELECT progress - 'at', (progress ->> 'at')::timestamptz FROM x_jobs.job WHERE id = tap_helpers.jid('prog')$$,
    $$VALUES ('{"done": 4}'::jsonb, '2030-01-01 10:02:00+00'::timestamptz)$$,
    'progress should replace the previous report, leaving out what was not given'
);

SELECT is(
    x_jobs.progress(tap_helpers.jid('prog'), 'w2', 5, 10),
    FALSE,
    'progress by a worker that does not hold the job should answer false'
);

SELECT is(x_jobs.progress(-1, 'w1', 5, 10), FALSE, 'progress for a job that does not exist should answer false');

SELECT results_eq(
    $$SELECT progress ->> 'done' FROM x_jobs.job WHERE id = tap_helpers.jid('prog')$$,
    $$VALUES ('4')$$,
    'progress that answered false should have changed nothing'
);

SELECT results_eq(
    $$SELECT * FROM tap_helpers.caught($q$ SELECT x_jobs.progress(tap_helpers.jid('prog'), 'w1', 11, 10) $q$)$$,
    $$VALUES ('XJ033', 'X_PROGRESS_INVALID: progress 11 of 10 is negative, not finite or past the total',
              '',
              'Report done and total as finite numbers of zero or more, with done <= total.')$$,
    'progress should refuse done past the total, with a HINT'
);

SELECT throws_ok(
    $$SELECT x_jobs.progress(tap_helpers.jid('prog'), 'w1', -1)$$,
    'XJ033',
    'X_PROGRESS_INVALID: progress -1 of NULL is negative, not finite or past the total',
    'progress should refuse a negative done'
);

SELECT throws_ok(
    $$SELECT x_jobs.progress(tap_helpers.jid('prog'), 'w1', NULL, -2)$$,
    'XJ033',
    'X_PROGRESS_INVALID: progress NULL of -2 is negative, not finite or past the total',
    'progress should refuse a negative total'
);

-- jsonb writes NaN and the infinities as strings, and NaN sorts above every number.
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message
    FROM (VALUES ('NaN'::float8, NULL::float8), (NULL, 'NaN'), ('Infinity', NULL), (1, 'Infinity')) AS v (done, total)
    CROSS JOIN LATERAL tap_helpers.caught(pg_catalog.format(
        'SELECT x_jobs.progress(tap_helpers.jid(''prog''), ''w1'', %L, %L)', v.done, v.total
    )) AS c
    $$,
    $$VALUES
        ('XJ033', 'X_PROGRESS_INVALID: progress NaN of NULL is negative, not finite or past the total'),
        ('XJ033', 'X_PROGRESS_INVALID: progress NULL of NaN is negative, not finite or past the total'),
        ('XJ033', 'X_PROGRESS_INVALID: progress Infinity of NULL is negative, not finite or past the total'),
        ('XJ033', 'X_PROGRESS_INVALID: progress 1 of Infinity is negative, not finite or past the total')$$,
    'progress should refuse NaN and infinite numbers, which JSON cannot hold'
);

-- A long note has a message of its own (0.3.8): it was refused as "progress NULL of NULL is
-- negative, not finite or past the total", naming values that were not the problem.
SELECT results_eq(
    $$
    SELECT * FROM tap_helpers.caught($q$
        SELECT x_jobs.progress(id => tap_helpers.jid('prog'), worker => 'w1', note => pg_catalog.repeat('n', 1001))
    $q$)
    $$,
    $$VALUES ('XJ033',
              'X_PROGRESS_INVALID: progress note ''' || pg_catalog.repeat('n', 64) || '''... is 1001 characters, '
              'longer than 1000',
              '',
              'Keep a progress note to 1000 characters; log the rest, or put it in the job''s output.')$$,
    'progress should refuse a note of more than 1000 characters with a message naming the note and its length'
);
SELECT throws_ok(
    pg_catalog.format(
        'SELECT x_jobs.progress(tap_helpers.jid(''prog''), ''w1'', 1, 2, %L)', pg_catalog.repeat('n', 1001)
    ),
    'XJ033',
    'X_PROGRESS_INVALID: progress note ''' || pg_catalog.repeat('n', 64)
    || '''... is 1001 characters, longer than 1000',
    'progress with valid numbers should refuse a note of more than 1000 characters all the same'
);

SELECT is(
    x_jobs.progress(tap_helpers.jid('prog'), 'w1', 10, 10, pg_catalog.repeat('n', 1000)),
    TRUE,
    'progress should accept done equal to total and a note of 1000 characters'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('prog'), 'w1'),
    TRUE,
    'The job should complete (setup)'
);

SELECT is(
    x_jobs.progress(tap_helpers.jid('prog'), 'w1', 1, 10),
    FALSE,
    'progress by the worker that held a job now settled should answer false: its body should stop'
);

SELECT is(
    x_jobs.progress(tap_helpers.jid('w_before'), 'w1', 1, 10),
    FALSE,
    'progress on a run suspended by its worker should answer false'
);

-- An error text is cut, not refused (0.3.8): a step's error was stored whole (5,000,000
-- characters passed), and refusing it would leave the worker unable to record the failure.
INSERT INTO j (tag, id)
SELECT
    'errtext' AS tag,
    e.id
FROM x_jobs.enqueue('t34_errtext', queue => 't34-errtext') AS e;
SELECT is(pg_temp.take('errtext', 'w1'), 1, 'The job of the error texts should run on w1 (setup)');
SELECT is(
    x_jobs.step_record(tap_helpers.jid('errtext'), 'w1', 'huge_error', error => pg_catalog.repeat('x', 5000000)),
    'failed'::x_jobs.step_status,
    'step_record with an error of 5,000,000 characters should still record the step as failed'
);
SELECT results_eq(
    $$SELECT pg_catalog.length(error), pg_catalog.left(error, 65536) = pg_catalog.repeat('x', 65536),
             pg_catalog.substr(error, 65537)
      FROM x_jobs.step WHERE job_id = tap_helpers.jid('errtext') AND name = 'huge_error'$$,
    $$VALUES (65536 + 39, TRUE, E'\n[truncated: 5000000 characters in all]')$$,
    'The error should be kept to its first 65,536 characters and a note of its length'
);
SELECT is(
    x_jobs.step_record(tap_helpers.jid('errtext'), 'w1', 'edge_error', error => pg_catalog.repeat('x', 65536)),
    'failed'::x_jobs.step_status,
    'step_record with an error of 65,536 characters should record it (setup)'
);
SELECT is(
    (
        SELECT error FROM x_jobs.step
        WHERE job_id = tap_helpers.jid('errtext') AND name = 'edge_error'
    ),
    pg_catalog.repeat('x', 65536),
    'An error of 65,536 characters should be kept as it is'
);

SELECT * FROM finish();
ROLLBACK;
