-- Schedules: x_jobs.set_schedule creates and updates one (an update keeps the fire to come while
-- the expression and zone mean the same instants; an operator's pause outlives it), drop,
-- pause, resume, list and run_schedule_now, every refusal (XJ049 for each parameter, enqueue's
-- own codes for the options it takes, XJ043, XJ046, XJ050), and x_jobs.tick_schedules on the
-- test clock: each due instant fires once, by the schedule's catchup and overlap, as an ordinary
-- job that knows its instant and whether it ran late; a schedule whose job is refused records
-- the error and does not stop the others. Every tick fires every due schedule of the database,
-- so each section deletes its schedules before the next. The clock is moved with SET LOCAL
-- "x_jobs.fake_now"; 2030-01-01 is a Tuesday. Instants are written in UTC.

-- The isolation check needs a transaction whose isolation is set before its first query, which
-- the test transaction cannot be: as in 20-claim.sql, two short transactions of their own catch
-- the refusal (tick_schedules refuses before it reads anything), kept in a temporary table.
SET default_transaction_isolation = 'repeatable read';
BEGIN;
CREATE TEMP TABLE isolation_refusal AS
SELECT
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.tick_schedules() $$) AS c;
COMMIT;

SET default_transaction_isolation = 'serializable';
BEGIN;
INSERT INTO isolation_refusal
SELECT
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.tick_schedules() $$) AS c;
COMMIT;

RESET default_transaction_isolation;
BEGIN;
SELECT plan(126);

-- The session's zone plays no part: instants are absolute, and a job's _schedule.at is in UTC.
SET LOCAL "TimeZone" = 'America/Los_Angeles';

-- The jobs schedule p_name enqueued, oldest instant first: the instant (run_at, in UTC), and
-- whether the job says it ran late.
CREATE FUNCTION pg_temp.fired(p_name text)
RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT coalesce(pg_catalog.array_agg(
        pg_catalog.to_char(j.run_at AT TIME ZONE 'UTC', 'HH24:MI')
        || CASE WHEN (j.input -> '_schedule' ->> 'late')::boolean THEN ' late' ELSE '' END
        ORDER BY j.run_at, j.id), '{}')
    FROM x_jobs.job AS j
    WHERE j.enqueued_by = 'schedule:' || p_name
$$;

-- A tick's answer, as one row of text: schedules, enqueued, skipped, next_fire_at in UTC.
CREATE FUNCTION pg_temp.tick(p_max_rows integer DEFAULT 1000)
RETURNS text
LANGUAGE sql
AS $$
    SELECT pg_catalog.format('%s %s %s %s', t.schedules, t.enqueued, t.skipped,
        coalesce(pg_catalog.to_char(t.next_fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI'), '-'))
    FROM x_jobs.tick_schedules(p_max_rows) AS t
$$;

------------------------------------------------------------------------------------------------
-- set_schedule: create
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT results_eq(
    $$SELECT name, job, cron, tz, input, queue, priority, max_attempts, tenant_id, concurrency_key,
             concurrency_limit, dead_letter, backoff_base, backoff_max, keep_done, catchup, catchup_max,
             overlap, grace, paused, next_fire_at, last_fire_at, last_enqueued_at, last_job_id,
             last_job_state::text, fires, skips, last_error, origin, declared_by, created_at, updated_at
      FROM x_jobs.set_schedule('t45_a', 't45_job', E' */5 * * * *\n', 'europe/berlin', '{"k": 1}')$$,
    $$VALUES ('t45_a', 't45_job', '*/5 * * * *', 'Europe/Berlin', '{"k": 1}'::jsonb, NULL::text, NULL::integer,
              NULL::integer, NULL::text, NULL::text, NULL::integer, NULL::boolean, NULL::interval, NULL::interval,
              NULL::boolean, 'latest', 100, 'allow', interval '1 minute', FALSE,
              '2030-01-01 10:05:00+00'::timestamptz, NULL::timestamptz, NULL::timestamptz, NULL::bigint, NULL::text,
              0::bigint, 0::bigint, NULL::text, NULL::text, session_user::text COLLATE "default",
              '2030-01-01 10:01:00+00'::timestamptz, '2030-01-01 10:01:00+00'::timestamptz)$$,
    'set_schedule should create the schedule with the defaults, its cron trimmed, its zone spelled as the '
    'zone database spells it, and answer it with the instant it fires next'
);

SELECT results_eq(
    $$SELECT queue, priority, max_attempts, tenant_id, concurrency_key, concurrency_limit, dead_letter,
             backoff_base, backoff_max, keep_done, catchup, catchup_max, overlap, grace, paused, origin,
             declared_by, next_fire_at
      FROM x_jobs.set_schedule(
          name => 't45_opts', job => 't45_job', cron => '@hourly', tz => 'UTC', input => '{}', queue => 't45-q',
          catchup => 'all', catchup_max => 7, overlap => 'skip', grace => '30 seconds', priority => 5,
          max_attempts => 3, tenant_id => 'acme', concurrency_key => 'k45', concurrency_limit => 2,
          dead_letter => FALSE, backoff_base => '2 seconds', backoff_max => '1 minute', keep_done => FALSE,
          paused => TRUE, origin => 'code', declared_by => 'host:1:a')$$,
    $$VALUES ('t45-q', 5, 3, 'acme', 'k45', 2, FALSE, interval '2 seconds', interval '1 minute', FALSE, 'all', 7,
              'skip', interval '30 seconds', TRUE, 'code', 'host:1:a', '2030-01-01 11:00:00+00'::timestamptz)$$,
    'set_schedule should keep every option it is given, a pause and who declared it'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE name = 't45_job'
    ),
    0,
    'set_schedule''s trial of the enqueue should leave no job behind'
);

-- Set again as it is (a worker's start): no trial, so no job id spent and no dead job row.
SELECT x_jobs.set_schedule(name => 't45-again', job => 't45_job', cron => '0 9 * * *');
CREATE TEMP TABLE t45_ids AS SELECT pg_catalog.pg_sequence_last_value('x_jobs.job_id_seq'::regclass) AS last_id;
SELECT x_jobs.set_schedule(name => 't45-again', job => 't45_job', cron => '0 9 * * *');
SELECT is(
    pg_catalog.pg_sequence_last_value('x_jobs.job_id_seq'::regclass),
    (SELECT t.last_id FROM t45_ids AS t),
    'set_schedule of a schedule as it is should not try the enqueue again'
);
SELECT x_jobs.set_schedule(name => 't45-again', job => 't45_job', cron => '0 10 * * *');
SELECT cmp_ok(
    pg_catalog.pg_sequence_last_value('x_jobs.job_id_seq'::regclass),
    '>',
    (SELECT t.last_id FROM t45_ids AS t),
    'set_schedule of a changed schedule should try the enqueue'
);

------------------------------------------------------------------------------------------------
-- set_schedule: update
------------------------------------------------------------------------------------------------

-- 10:07: t45_a's 10:05 is due and nothing ticked.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:07:00+00';

SELECT results_eq(
    $$SELECT cron, input, next_fire_at, created_at, updated_at
      FROM x_jobs.set_schedule('t45_a', 't45_job', '0-59/5 * * * *', 'Europe/Berlin', '{"k": 2}')$$,
    $$VALUES ('0-59/5 * * * *', '{"k": 2}'::jsonb, '2030-01-01 10:05:00+00'::timestamptz,
              '2030-01-01 10:01:00+00'::timestamptz, '2030-01-01 10:07:00+00'::timestamptz)$$,
    'An update whose cron means the same instants should keep the fire to come, even one that is due, and '
    'take the rest'
);

SELECT is(
    (SELECT next_fire_at FROM x_jobs.set_schedule('t45_a', 't45_job', '*/5 * * * *', 'UTC', '{"k": 2}')),
    '2030-01-01 10:10:00+00'::timestamptz,
    'An update to another zone should fire next after now'
);

SELECT is(
    (SELECT next_fire_at FROM x_jobs.set_schedule('t45_a', 't45_job', '*/3 * * * *', 'UTC', '{"k": 2}')),
    '2030-01-01 10:09:00+00'::timestamptz,
    'An update to another cron should fire next after now'
);

SELECT is(
    (SELECT paused FROM x_jobs.pause_schedule('t45_a')),
    TRUE,
    'pause_schedule should answer the schedule, paused'
);

SELECT results_eq(
    $$SELECT paused, next_fire_at FROM x_jobs.set_schedule('t45_a', 't45_job', '*/3 * * * *', 'UTC', '{"k": 3}')$$,
    $$VALUES (TRUE, '2030-01-01 10:09:00+00'::timestamptz)$$,
    'An update that leaves paused out (NULL) should keep an operator''s pause'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:20:00+00';

SELECT results_eq(
    $$SELECT paused, next_fire_at FROM x_jobs.set_schedule('t45_a', 't45_job', '*/3 * * * *', 'UTC', paused => FALSE)$$,
    $$VALUES (FALSE, '2030-01-01 10:21:00+00'::timestamptz)$$,
    'An update with paused false should resume the schedule from now, not from the instants of the pause'
);

SELECT results_eq(
    $$SELECT paused, next_fire_at FROM x_jobs.set_schedule('t45_a', 't45_job', '*/3 * * * *', 'UTC', paused => TRUE)$$,
    $$VALUES (TRUE, '2030-01-01 10:21:00+00'::timestamptz)$$,
    'An update with paused true should pause the schedule'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.list_schedules()
        WHERE name = 't45_a'
    ),
    1,
    'Setting a schedule again should keep one row of its name'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- set_schedule: refusals
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE refusal (
    n integer GENERATED ALWAYS AS IDENTITY,
    args text NOT NULL,
    sqlstate text NOT NULL,
    message text
);

INSERT INTO refusal (args, sqlstate, message) VALUES
($$NULL, 'j', '* * * * *'$$, 'XJ049', 'X_SCHEDULE_INVALID: name NULL is not a schedule name (1 to 200 characters)'),
($$'', 'j', '* * * * *'$$, 'XJ049', $m$X_SCHEDULE_INVALID: name '' is not a schedule name (1 to 200 characters)$m$),
($$repeat('n', 201), 'j', '* * * * *'$$, 'XJ049', NULL),
($$'t45_r', 'j', '* * * * *', input => NULL$$, 'XJ049', 'X_SCHEDULE_INVALID: input NULL is not a JSON object'),
($$'t45_r', 'j', '* * * * *', input => '[1]'$$, 'XJ049', 'X_SCHEDULE_INVALID: input [1] is not a JSON object'),
($$'t45_r', 'j', '* * * * *', input => '"x"'$$, 'XJ049', 'X_SCHEDULE_INVALID: input "x" is not a JSON object'),
(
    $$'t45_r', 'j', '* * * * *', input => '{"_schedule": 1}'$$, 'XJ049',
    'X_SCHEDULE_INVALID: input has a key _schedule, which each run gets from its schedule'
),
(
    $$'t45_r', 'j', '* * * * *', catchup => 'sometimes'$$, 'XJ049',
    $m$X_SCHEDULE_INVALID: catchup 'sometimes' is not latest, all or none$m$
),
(
    $$'t45_r', 'j', '* * * * *', catchup => NULL$$,
    'XJ049',
    'X_SCHEDULE_INVALID: catchup NULL is not latest, all or none'
),
($$'t45_r', 'j', '* * * * *', catchup_max => 0$$, 'XJ049', 'X_SCHEDULE_INVALID: catchup_max 0 is outside 1..10000'),
(
    $$'t45_r', 'j', '* * * * *', catchup_max => 10001$$, 'XJ049',
    'X_SCHEDULE_INVALID: catchup_max 10001 is outside 1..10000'
),
(
    $$'t45_r', 'j', '* * * * *', catchup_max => NULL$$,
    'XJ049',
    'X_SCHEDULE_INVALID: catchup_max NULL is outside 1..10000'
),
(
    $$'t45_r', 'j', '* * * * *', overlap => 'never'$$,
    'XJ049',
    $m$X_SCHEDULE_INVALID: overlap 'never' is not allow or skip$m$
),
($$'t45_r', 'j', '* * * * *', overlap => NULL$$, 'XJ049', 'X_SCHEDULE_INVALID: overlap NULL is not allow or skip'),
(
    $$'t45_r', 'j', '* * * * *', grace => '-1 second'$$,
    'XJ049',
    'X_SCHEDULE_INVALID: grace -00:00:01 is outside 0 to 1 day'
),
(
    $$'t45_r', 'j', '* * * * *', grace => '1 day 1 second'$$, 'XJ049',
    'X_SCHEDULE_INVALID: grace 1 day 00:00:01 is outside 0 to 1 day'
),
($$'t45_r', 'j', '* * * * *', grace => NULL$$, 'XJ049', 'X_SCHEDULE_INVALID: grace NULL is outside 0 to 1 day'),
(
    $$'t45_r', 'j', '* * * * *', origin => repeat('o', 201)$$, 'XJ049',
    'X_SCHEDULE_INVALID: origin or declared_by is longer than 200 characters'
),
(
    $$'t45_r', 'j', '* * * * *', declared_by => repeat('d', 201)$$, 'XJ049',
    'X_SCHEDULE_INVALID: origin or declared_by is longer than 200 characters'
),
-- The options enqueue takes, refused by enqueue itself (its trial), with enqueue's codes.
($$'t45_r', NULL, '* * * * *'$$, 'XJ001', 'X_NAME_INVALID: job name NULL is not a name'),
($$'t45_r', '', '* * * * *'$$, 'XJ001', $m$X_NAME_INVALID: job name '' is not a name$m$),
($$'t45_r', 'j', '* * * * *', queue => ''$$, 'XJ002', $m$X_QUEUE_INVALID: queue '' is not a queue name$m$),
($$'t45_r', 'j', '* * * * *', max_attempts => 0$$, 'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts 0 is below 1'),
($$'t45_r', 'j', '* * * * *', priority => 40000$$, 'XJ005', 'X_PRIORITY_INVALID: priority 40000 is out of range'),
($$'t45_r', 'j', '* * * * *', tenant_id => ''$$, 'XJ006', $m$X_TENANT_INVALID: tenant_id '' is empty$m$),
(
    $$'t45_r', 'j', '* * * * *', concurrency_limit => 2$$, 'XJ007',
    'X_CONCURRENCY_INVALID: concurrency limit 2 with key NULL is not a limit'
),
(
    $$'t45_r', 'j', '* * * * *', backoff_base => '2 hours'$$, 'XJ008',
    'X_BACKOFF_INVALID: backoff from 02:00:00 to 01:00:00 is not a range'
),
($$'t45_r', 'j', '* * * * *', input => jsonb_build_object('pad', repeat('x', 2000000))$$, 'XJ003', NULL),
(
    $$'t45_r', 'j', '61 * * * *'$$, 'XJ043',
    $m$X_CRON_INVALID: cron '61 * * * *': the minute field '61' has 61, outside 0-59$m$
),
(
    $$'t45_r', 'j', '0 0 30 2 *'$$, 'XJ043',
    $m$X_CRON_INVALID: cron '0 0 30 2 *' never fires: no month of its month field has day 30$m$
),
($$'t45_r', 'j', NULL$$, 'XJ043', 'X_CRON_INVALID: cron NULL has 0 fields, not 5'),
($$'t45_r', 'j', '* * * * *', tz => 'UTC+3'$$, 'XJ046', $m$X_TIME_ZONE_INVALID: 'UTC+3' is not a time zone name$m$),
($$'t45_r', 'j', '* * * * *', tz => NULL$$, 'XJ046', 'X_TIME_ZONE_INVALID: NULL is not a time zone name');

SELECT
    throws_ok(
        pg_catalog.format('SELECT x_jobs.set_schedule(%s)', r.args), r.sqlstate, r.message,
        pg_catalog.format('set_schedule(%s) should be refused with %s', pg_catalog.left(r.args, 80), r.sqlstate)
    )
FROM refusal AS r
ORDER BY r.n;

SELECT is_empty(
    $$SELECT * FROM x_jobs.list_schedules()$$,
    'A refused set_schedule should leave no schedule'
);

SELECT results_eq(
    $$SELECT c.err_detail, c.err_hint
      FROM tap_helpers.caught($q$SELECT x_jobs.set_schedule('t45_r', 'j', '* * * * *', overlap => 'never')$q$) AS c$$,
    $$VALUES ('In schedule ''t45_r''.',
              'A schedule takes a name, an input object (default {}), catchup latest, all or none with catchup_max '
              'from 1 to 10000 (default 100), overlap allow or skip, and a grace from 0 to 1 day (default 1 minute).')$$,
    'An invalid schedule should be refused naming the schedule, with a hint of what each parameter takes'
);

SELECT results_eq(
    $$SELECT c.err_state, c.err_hint
      FROM tap_helpers.caught($q$SELECT x_jobs.set_schedule('t45_r', 'j', '0 0 * 13 *')$q$) AS c$$,
    $$VALUES ('XJ043', 'The month field takes 1-12 or JAN-DEC, such as 1, JAN-MAR, */3 or JUN,DEC.')$$,
    'A refused cron should hint at what its field takes'
);

------------------------------------------------------------------------------------------------
-- tick_schedules: one instant, one job
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_b', 't45_b_job', '*/5 * * * *', input => '{"n": 1}', queue => 't45-b',
          priority => 1, max_attempts => 2, tenant_id => 't1', concurrency_key => 'k45b', concurrency_limit => 3,
          dead_letter => FALSE, backoff_base => '5 seconds', backoff_max => '5 minutes', keep_done => FALSE)$$,
    'A schedule with every enqueue option should be set'
);

SELECT is(pg_temp.tick(), '0 0 0 2030-01-01 11:05', 'A tick before any instant has come should fire nothing');

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:05:20+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-01-01 11:10', 'A tick after the instant should fire it, and answer the next');

SELECT is(pg_temp.tick(), '0 0 0 2030-01-01 11:10', 'A second tick at the same clock should fire nothing');

SELECT results_eq(
    $$SELECT name, input, run_at, enqueued_by, queue, priority::integer, max_attempts, tenant_id, concurrency_key,
             concurrency_limit, dead_letter, backoff_base, backoff_max, keep_done, idempotency_key, state::text
      FROM x_jobs.job WHERE enqueued_by = 'schedule:t45_b'$$,
    $$VALUES ('t45_b_job',
              '{"n": 1, "_schedule": {"at": "2030-01-01T11:05:00+00:00", "late": false, "name": "t45_b"}}'::jsonb,
              '2030-01-01 11:05:00+00'::timestamptz, 'schedule:t45_b', 't45-b', 1, 2, 't1', 'k45b', 3, FALSE,
              interval '5 seconds', interval '5 minutes', FALSE, NULL::text, 'ready')$$,
    'The fired job should be an ordinary job with the schedule''s options, due at the instant, its input the '
    'schedule''s with _schedule (name, instant in UTC, not late), enqueued by the schedule'
);

SELECT results_eq(
    $$SELECT next_fire_at, last_fire_at, last_enqueued_at, last_job_id, last_job_state::text, fires, skips, last_error
      FROM x_jobs.list_schedules('t45_b')$$,
    $$SELECT '2030-01-01 11:10:00+00'::timestamptz, '2030-01-01 11:05:00+00'::timestamptz,
             '2030-01-01 11:05:20+00'::timestamptz, j.id, 'ready', 1::bigint, 0::bigint, NULL::text
      FROM x_jobs.job AS j WHERE j.enqueued_by = 'schedule:t45_b'$$,
    'The schedule should record the fire: its instant, when it was enqueued, the job and its state, the count'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:12:00+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-01-01 11:15', 'A tick two minutes after an instant should still fire it');

SELECT is(
    pg_temp.fired('t45_b'),
    ARRAY['11:05', '11:10 late'],
    'A job enqueued later than the grace (1 minute) after its instant should say it is late'
);

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_b', 't45_b_job', '*/5 * * * *', grace => '5 minutes')$$,
    'The schedule should take a longer grace'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 11:19:00+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-01-01 11:20', 'A tick four minutes after an instant should fire it');

SELECT is(
    (
        SELECT j.input -> '_schedule' -> 'late' FROM x_jobs.job AS j
        WHERE j.run_at = '2030-01-01 11:15:00+00'
    ),
    'false'::jsonb,
    'A job enqueued within the grace should not say it is late'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- tick_schedules: catch-up after a gap (12 instants missed, 12:05 to 13:00)
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule(n, n || '_job', '*/5 * * * *', catchup => c, catchup_max => m, grace => g)
      FROM (VALUES ('t45_latest', 'latest', 100, interval '1 minute'),
                   ('t45_all5', 'all', 5, interval '1 minute'),
                   ('t45_all', 'all', 100, interval '1 minute'),
                   ('t45_none', 'none', 100, interval '1 minute'),
                   ('t45_none10', 'none', 100, interval '10 minutes')) AS t (n, c, m, g)$$,
    'A schedule of each catch-up policy should be set'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:02:00+00';

SELECT is(
    pg_temp.tick(),
    '5 19 4 2030-01-01 13:05',
    'A tick after the gap should fire 1 + 5 + 12 + 0 + 1 jobs and count one skip for each policy that passed '
    'over instants'
);

SELECT is(pg_temp.fired('t45_latest'), ARRAY['13:00 late'], 'catchup latest should fire the last instant, once');

SELECT is(
    pg_temp.fired('t45_all5'),
    ARRAY['12:05 late', '12:10 late', '12:15 late', '12:20 late', '12:25 late'],
    'catchup all should fire the oldest instants first, at most catchup_max of them'
);

SELECT is(
    pg_temp.fired('t45_all'),
    ARRAY[
        '12:05 late', '12:10 late', '12:15 late', '12:20 late', '12:25 late', '12:30 late', '12:35 late',
        '12:40 late', '12:45 late', '12:50 late', '12:55 late', '13:00 late'
    ],
    'catchup all should fire every missed instant, oldest first'
);

SELECT is(pg_temp.fired('t45_none'), '{}'::text[], 'catchup none should fire nothing older than its grace');

SELECT is(
    pg_temp.fired('t45_none10'),
    ARRAY['13:00'],
    'catchup none should fire the last instant when it came within the grace'
);

SELECT results_eq(
    $$SELECT name, next_fire_at, fires, skips FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_all', '2030-01-01 13:05:00+00'::timestamptz, 12::bigint, 0::bigint),
             ('t45_all5', '2030-01-01 13:05:00+00', 5, 1),
             ('t45_latest', '2030-01-01 13:05:00+00', 1, 1),
             ('t45_none', '2030-01-01 13:05:00+00', 0, 1),
             ('t45_none10', '2030-01-01 13:05:00+00', 1, 1)$$,
    'Every policy should go on from the first instant after now, with its fires and skips counted'
);

SELECT is(pg_temp.tick(), '0 0 0 2030-01-01 13:05', 'A second tick after the catch-up should fire nothing');

-- 13:07: one instant, 13:05, two minutes ago.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:07:00+00';

SELECT is(pg_temp.tick(), '5 4 1 2030-01-01 13:10', 'The instant two minutes ago should fire but for catchup none');

SELECT is(
    pg_temp.fired('t45_none'),
    '{}'::text[],
    'catchup none should skip a single instant older than its grace'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- tick_schedules: overlap, and run_schedule_now
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_skip', 't45_skip_job', '*/5 * * * *', queue => 't45-skip', overlap => 'skip'),
             x_jobs.set_schedule('t45_allow', 't45_allow_job', '*/5 * * * *', queue => 't45-allow')$$,
    'A schedule of each overlap policy should be set'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:05:10+00';

SELECT is(pg_temp.tick(), '2 2 0 2030-01-01 14:10', 'The first instant should fire both');

SELECT results_eq(
    $$SELECT enqueued_by, idempotency_key FROM x_jobs.job
      WHERE enqueued_by IN ('schedule:t45_skip', 'schedule:t45_allow')
      ORDER BY enqueued_by$$,
    $$VALUES ('schedule:t45_allow', NULL::text), ('schedule:t45_skip', 'x_jobs.schedule:t45_skip')$$,
    'overlap skip should key its run by the schedule''s name, overlap allow not at all'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:10:10+00';

SELECT is(
    pg_temp.tick(),
    '2 1 1 2030-01-01 14:15',
    'With both runs still live, the next instant should fire overlap allow and skip overlap skip'
);

SELECT results_eq(
    $$SELECT name, fires, skips, last_job_id FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_allow', 2::bigint, 0::bigint,
              (SELECT max(id) FROM x_jobs.job WHERE enqueued_by = 'schedule:t45_allow')),
             ('t45_skip', 1, 1, (SELECT max(id) FROM x_jobs.job WHERE enqueued_by = 'schedule:t45_skip'))$$,
    'The skipped instant should count as a skip and leave the live run as the last job'
);

SELECT is(
    (SELECT x_jobs.complete(c.id, 't45-w') FROM x_jobs.claim(ARRAY['t45-skip'], 't45-w') AS c),
    TRUE,
    'The overlap skip run should be completed'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:15:10+00';

SELECT is(pg_temp.tick(), '2 2 0 2030-01-01 14:20', 'Once its run is done, overlap skip should fire again');

SELECT is(pg_temp.fired('t45_skip'), ARRAY['14:05', '14:15'], 'overlap skip should have fired 14:05 and 14:15');

SELECT results_eq(
    $$SELECT r.deduped, r.id = (SELECT max(id) FROM x_jobs.job WHERE enqueued_by = 'schedule:t45_skip')
      FROM x_jobs.run_schedule_now('t45_skip') AS r$$,
    $$VALUES (TRUE, TRUE)$$,
    'run_schedule_now of an overlap skip schedule with a live run should answer that run, deduped'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:16:30+00';

-- The run is read by a statement after the one that enqueued it (whose snapshot predates it).
CREATE TEMP TABLE manual_run AS SELECT r.* FROM x_jobs.run_schedule_now('t45_allow') AS r;

SELECT results_eq(
    $$SELECT r.deduped, j.input -> '_schedule', j.run_at, j.enqueued_by
      FROM manual_run AS r JOIN x_jobs.job AS j ON j.id = r.id$$,
    $$VALUES (FALSE, '{"at": "2030-01-01T14:16:30+00:00", "late": false, "name": "t45_allow", "manual": true}'::jsonb,
              '2030-01-01 14:16:30+00'::timestamptz, 'schedule:t45_allow')$$,
    'run_schedule_now should enqueue a run now, marked manual'
);

SELECT results_eq(
    $$SELECT name, next_fire_at, last_fire_at, last_enqueued_at, fires, skips FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_allow', '2030-01-01 14:20:00+00'::timestamptz, '2030-01-01 14:16:30+00'::timestamptz,
              '2030-01-01 14:16:30+00'::timestamptz, 4::bigint, 0::bigint),
             ('t45_skip', '2030-01-01 14:20:00+00', '2030-01-01 14:15:00+00', '2030-01-01 14:15:10+00', 2, 2)$$,
    'run_schedule_now should count the run (or the skip) and leave the next instant as it was'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- pause, resume, list, drop
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 15:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_p', 't45_p_job', '*/5 * * * *'),
             x_jobs.set_schedule('t45_born_paused', 't45_p_job', '*/5 * * * *', paused => TRUE)$$,
    'A schedule and a schedule born paused should be set'
);

SELECT results_eq(
    $$SELECT name, paused, updated_at FROM x_jobs.pause_schedule('t45_p')$$,
    $$VALUES ('t45_p', TRUE, '2030-01-01 15:00:00+00'::timestamptz)$$,
    'pause_schedule should answer the schedule, paused'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 15:16:00+00';

SELECT is(pg_temp.tick(), '0 0 0 -', 'A paused schedule should never fire, however long it is due');

SELECT
    is(
        pg_temp.fired('t45_p') || pg_temp.fired('t45_born_paused'), '{}'::text[], 'No paused schedule should have fired'
    );

SELECT results_eq(
    $$SELECT name, paused, next_fire_at, updated_at FROM x_jobs.resume_schedule('t45_p')$$,
    $$VALUES ('t45_p', FALSE, '2030-01-01 15:20:00+00'::timestamptz, '2030-01-01 15:16:00+00'::timestamptz)$$,
    'resume_schedule should fire next after now, not catch up the instants of the pause'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 15:17:00+00';

SELECT results_eq(
    $$SELECT name, paused, next_fire_at, updated_at FROM x_jobs.resume_schedule('t45_p')$$,
    $$VALUES ('t45_p', FALSE, '2030-01-01 15:20:00+00'::timestamptz, '2030-01-01 15:16:00+00'::timestamptz)$$,
    'resume_schedule of a schedule that is not paused should leave it as it is'
);

SELECT results_eq(
    $$SELECT name, paused FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_born_paused', TRUE), ('t45_p', FALSE)$$,
    'list_schedules should answer every schedule, by name'
);

SELECT results_eq(
    $$SELECT name FROM x_jobs.list_schedules('t45_p')$$,
    $$VALUES ('t45_p')$$,
    'list_schedules(name) should answer that schedule only'
);

SELECT
    is_empty(
        $$SELECT * FROM x_jobs.list_schedules('t45_nope')$$, 'list_schedules of an unknown name should answer nothing'
    );

SET LOCAL "x_jobs.fake_now" = '2030-01-01 15:20:30+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-01-01 15:25', 'The resumed schedule should fire its next instant');

SELECT is(x_jobs.drop_schedule('t45_p'), TRUE, 'drop_schedule should answer true for a schedule it dropped');

SELECT is(x_jobs.drop_schedule('t45_p'), FALSE, 'drop_schedule should answer false for a schedule that is not there');

SELECT is(x_jobs.drop_schedule(NULL), FALSE, 'drop_schedule(NULL) should answer false');

SELECT is(pg_temp.fired('t45_p'), ARRAY['15:20'], 'Dropping a schedule should leave the jobs it enqueued');

SELECT throws_ok(
    $$SELECT x_jobs.pause_schedule('t45_nope')$$,
    'XJ050', 'X_SCHEDULE_NOT_FOUND: no schedule is named ''t45_nope''',
    'pause_schedule of an unknown name should be refused with XJ050'
);

SELECT throws_ok(
    $$SELECT x_jobs.resume_schedule('t45_nope')$$,
    'XJ050', 'X_SCHEDULE_NOT_FOUND: no schedule is named ''t45_nope''',
    'resume_schedule of an unknown name should be refused with XJ050'
);

SELECT throws_ok(
    $$SELECT x_jobs.run_schedule_now('t45_p')$$,
    'XJ050', 'X_SCHEDULE_NOT_FOUND: no schedule is named ''t45_p''',
    'run_schedule_now of a dropped schedule should be refused with XJ050'
);

SELECT results_eq(
    $$SELECT c.err_state, c.err_message, c.err_hint
      FROM tap_helpers.caught($q$SELECT x_jobs.run_schedule_now(NULL)$q$) AS c$$,
    $$VALUES ('XJ050', 'X_SCHEDULE_NOT_FOUND: no schedule is named NULL',
              'SELECT name FROM x_jobs.list_schedules() lists them; set_schedule makes one.')$$,
    'An unknown schedule should be refused with a hint of where the schedules are listed'
);

INSERT INTO manual_run SELECT r.* FROM x_jobs.run_schedule_now('t45_born_paused') AS r;

SELECT results_eq(
    $$SELECT r.deduped, j.input -> '_schedule' ->> 'manual'
      FROM manual_run AS r JOIN x_jobs.job AS j ON j.id = r.id WHERE j.enqueued_by = 'schedule:t45_born_paused'$$,
    $$VALUES (FALSE, 'true')$$,
    'run_schedule_now should run a paused schedule''s job'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- tick_schedules: max_rows
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 16:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_m' || i, 't45_m_job', '*/5 * * * *') FROM generate_series(1, 3) AS i$$,
    'Three schedules should be set'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 16:05:30+00';

SELECT is(
    pg_temp.tick(2),
    '2 2 0 2030-01-01 16:05',
    'A tick of max_rows 2 should fire two of three due schedules and answer the third''s instant, which is due'
);

SELECT is(pg_temp.tick(2), '1 1 0 2030-01-01 16:10', 'The next tick should fire the third');

SELECT is(pg_temp.tick(2), '0 0 0 2030-01-01 16:10', 'The one after should fire nothing');

SELECT throws_ok(
    $$SELECT * FROM x_jobs.tick_schedules(0)$$,
    'XJ013', 'X_QTY_INVALID: max_rows 0 is outside 1..100000',
    'tick_schedules(0) should be refused with XJ013'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.tick_schedules(100001)$$,
    'XJ013', 'X_QTY_INVALID: max_rows 100001 is outside 1..100000',
    'tick_schedules(100001) should be refused with XJ013'
);

SELECT results_eq(
    $$SELECT c.err_state, c.err_message, c.err_hint
      FROM tap_helpers.caught($q$SELECT * FROM x_jobs.tick_schedules(NULL)$q$) AS c$$,
    $$VALUES ('XJ013', 'X_QTY_INVALID: max_rows NULL is outside 1..100000',
              'Tick at most 1 to 100000 schedules a call (default 1000), and again while it answers that many.')$$,
    'tick_schedules(NULL) should be refused with XJ013 and a hint'
);

SELECT results_eq(
    $$ SELECT i.iso_level, i.err_state, i.err_message, i.err_hint FROM isolation_refusal AS i ORDER BY i.iso_level $$,
    $$
    VALUES ('repeatable read', 'XJ022',
            'X_ISOLATION_UNSUPPORTED: tick_schedules cannot run at isolation level repeatable read',
            'Call tick_schedules in its own READ COMMITTED transaction (autocommit).'),
           ('serializable', 'XJ022', 'X_ISOLATION_UNSUPPORTED: tick_schedules cannot run at isolation level serializable',
            'Call tick_schedules in its own READ COMMITTED transaction (autocommit).')
    $$,
    'A tick in a REPEATABLE READ or SERIALIZABLE transaction should be refused'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- tick_schedules: a job refused at tick time
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 17:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_big', 't45_big_job', '*/5 * * * *',
                                 input => jsonb_build_object('pad', repeat('x', 300))),
             x_jobs.set_schedule('t45_small', 't45_small_job', '*/5 * * * *')$$,
    'A schedule with a large input and one with none should be set (under the default limit of 1 MiB)'
);

-- The limit is read at each enqueue (a session's own value counts up to 1 MiB): lowered now, it
-- refuses the large input, which the schedule was set with.
SET LOCAL "x_jobs.max_payload_bytes" = 200;
SET LOCAL "x_jobs.fake_now" = '2030-01-01 17:05:30+00';

SELECT is(
    pg_temp.tick(),
    '2 1 1 2030-01-01 17:10',
    'A tick should fire the schedule whose job is accepted, and skip the one whose job is refused'
);

SELECT results_eq(
    $$SELECT name, next_fire_at, fires, skips,
             last_error LIKE 'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 200'
      FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_big', '2030-01-01 17:10:00+00'::timestamptz, 0::bigint, 1::bigint, TRUE),
             ('t45_small', '2030-01-01 17:10:00+00', 1, 0, NULL)$$,
    'The refused schedule should record the refusal, count a skip and move on to its next instant'
);

RESET "x_jobs.max_payload_bytes";
SET LOCAL "x_jobs.fake_now" = '2030-01-01 17:10:30+00';

SELECT is(pg_temp.tick(), '2 2 0 2030-01-01 17:15', 'With the limit back, both should fire');

SELECT is(
    (SELECT last_error FROM x_jobs.list_schedules('t45_big')),
    NULL,
    'A fire that enqueues should clear the schedule''s last error'
);

-- A malformed limit is the deployment's fault, not a schedule's: the tick fires nothing, so that
-- no instant is lost, and the next tick after the fix catches up.
SET LOCAL "x_jobs.max_payload_bytes" = 'abc';
SET LOCAL "x_jobs.fake_now" = '2030-01-01 17:15:30+00';

SELECT throws_ok(
    $$SELECT * FROM x_jobs.tick_schedules()$$,
    'XJ040', NULL,
    'A tick with a malformed x_jobs.max_payload_bytes should be refused with XJ040'
);

RESET "x_jobs.max_payload_bytes";

SELECT results_eq(
    $$SELECT name, next_fire_at, last_error FROM x_jobs.list_schedules()$$,
    $$VALUES ('t45_big', '2030-01-01 17:15:00+00'::timestamptz, NULL::text),
             ('t45_small', '2030-01-01 17:15:00+00', NULL)$$,
    'The refused tick should leave every schedule due, with no error recorded'
);

DELETE FROM x_jobs.schedule;

------------------------------------------------------------------------------------------------
-- tick_schedules: a declared job, and offset changes
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 18:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.declare_job('t45_declared', queue => 't45-declared', max_attempts => 4),
             x_jobs.set_schedule('t45_d', 't45_declared', '*/5 * * * *')$$,
    'A schedule of a declared job should be set'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 18:05:00+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-01-01 18:10', 'A tick at the instant itself should fire it');

SELECT results_eq(
    $$SELECT queue, max_attempts FROM x_jobs.job WHERE enqueued_by = 'schedule:t45_d'$$,
    $$VALUES ('t45-declared', 4)$$,
    'The fired job should take what the schedule leaves out from the job''s declaration'
);

DELETE FROM x_jobs.schedule;

-- Berlin, 31 March 2030: 02:30 does not exist; the daily 02:30 fires at 03:00 CEST (01:00 UTC).
SET LOCAL "x_jobs.fake_now" = '2030-03-30 12:00:00+00';

SELECT is(
    (SELECT next_fire_at FROM x_jobs.set_schedule('t45_dst', 't45_dst_job', '30 2 * * *', 'Europe/Berlin')),
    '2030-03-31 01:00:00+00'::timestamptz,
    'A 02:30 Berlin schedule set the day before the spring change should be due at 03:00 CEST'
);

SET LOCAL "x_jobs.fake_now" = '2030-03-31 01:00:30+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-04-01 00:30', 'The tick at 03:00 CEST should fire it once, the next tomorrow');

SET LOCAL "x_jobs.fake_now" = '2030-03-31 02:00:00+00';

SELECT is(pg_temp.tick(), '0 0 0 2030-04-01 00:30', 'A later tick that day should fire nothing');

-- Berlin, 27 October 2030: 02:30 comes twice (00:30 and 01:30 UTC); it fires at the first.
DELETE FROM x_jobs.schedule;
SET LOCAL "x_jobs.fake_now" = '2030-10-26 12:00:00+00';

SELECT lives_ok(
    $$SELECT x_jobs.set_schedule('t45_dst', 't45_dst_job', '30 2 * * *', 'Europe/Berlin')$$,
    'The schedule should be set again the day before the autumn change'
);

SET LOCAL "x_jobs.fake_now" = '2030-10-27 00:30:30+00';

SELECT is(pg_temp.tick(), '1 1 0 2030-10-28 01:30', 'The first 02:30 (CEST) should fire, and the next be tomorrow''s');

SET LOCAL "x_jobs.fake_now" = '2030-10-27 01:30:30+00';

SELECT is(pg_temp.tick(), '0 0 0 2030-10-28 01:30', 'The second 02:30 (CET) should fire nothing');

SELECT is(
    pg_temp.fired('t45_dst'),
    ARRAY['01:00', '00:30'],
    'The schedule should have fired once on each change day'
);

SELECT * FROM finish();
ROLLBACK;
