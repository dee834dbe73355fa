-- Cron: x_jobs._cron_parse reads five fields (lists, ranges, steps, 'a/n', month and weekday
-- names in any case, 7 for Sunday) or a macro, and refuses anything else with XJ043 naming the
-- field; x_jobs.cron_next answers the instants an expression fires at in an IANA zone (XJ046
-- for anything else, POSIX strings included), with Vixie cron's rules: day-of-month and
-- day-of-week are OR'ed when both are restricted; a fixed schedule fires a time the clock skips
-- once, at the first valid instant after it, and a time it repeats at its first occurrence
-- only, while any other fires as the clock reads. The DST edges are those of 2030 in
-- Europe/Berlin (31 March, 27 October, at 01:00 UTC), America/New_York (10 March at 07:00 UTC,
-- 3 November at 06:00 UTC) and Australia/Adelaide, half an hour off the hour (6 April and
-- 5 October, at 16:30 UTC). Instants are written in UTC; the session's TimeZone plays no part.
BEGIN;
SELECT plan(89);

SET LOCAL "TimeZone" = 'Asia/Tokyo';

-- The instants cron_next answers, as text in UTC ('2030-03-31 01:00'), in order.
CREATE FUNCTION pg_temp.fires(p_cron text, p_tz text, p_after timestamptz, p_count integer)
RETURNS text[]
LANGUAGE sql
STABLE
AS $$
    SELECT pg_catalog.array_agg(pg_catalog.to_char(f.fire_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') ORDER BY f.fire_at)
    FROM x_jobs.cron_next(p_cron, p_tz, p_after, p_count) AS f
$$;

------------------------------------------------------------------------------------------------
-- The syntax: what each field allows
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$SELECT (f).minutes, (f).hours, (f).days, (f).months, (f).weekdays
      FROM (SELECT x_jobs._cron_parse(c) AS f FROM unnest(ARRAY[
          '0,15,30,45 9-17 1 * *',
          '*/15 */6 */10 */3 */2',
          '10-40/10 8-20/4 5/10 feb/5 1/2',
          '1,10-12,*/20 0 1-3,28 jan,Mar,DEC sun,Sat',
          '5-5/2 23 31 JAN-mar MON-fri',
          '05 7 * * 7',
          '0 0 * * 5-7'
      ]) WITH ORDINALITY AS t (c, n) ORDER BY t.n) AS p$$,
    $$VALUES
        ('{0,15,30,45}'::integer[], '{9,10,11,12,13,14,15,16,17}'::integer[], '{1}'::integer[],
         '{1,2,3,4,5,6,7,8,9,10,11,12}'::integer[], '{0,1,2,3,4,5,6}'::integer[]),
        ('{0,15,30,45}', '{0,6,12,18}', '{1,11,21,31}', '{1,4,7,10}', '{0,2,4,6}'),
        ('{10,20,30,40}', '{8,12,16,20}', '{5,15,25}', '{2,7,12}', '{0,1,3,5}'),
        ('{0,1,10,11,12,20,40}', '{0}', '{1,2,3,28}', '{1,3,12}', '{0,6}'),
        ('{5}', '{23}', '{31}', '{1,2,3}', '{1,2,3,4,5}'),
        ('{5}', '{7}', '{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31}',
         '{1,2,3,4,5,6,7,8,9,10,11,12}', '{0}'),
        ('{0}', '{0}', '{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31}',
         '{1,2,3,4,5,6,7,8,9,10,11,12}', '{0,5,6}')$$,
    'Lists, ranges, steps of * and of ranges, a/n to the field''s end (day-of-week''s is 7), names in any '
    'case, a stepped range of one value, leading zeros and 7 for Sunday should read as Vixie cron reads them'
);

SELECT results_eq(
    $$SELECT m, x_jobs._cron_parse(m) = x_jobs._cron_parse(e)
      FROM (VALUES ('@hourly', '0 * * * *'), ('@daily', '0 0 * * *'), ('@midnight', '0 0 * * *'),
                   ('@weekly', '0 0 * * 0'), ('@monthly', '0 0 1 * *'), ('@yearly', '0 0 1 1 *'),
                   ('@annually', '0 0 1 1 *'), ('@Daily', '0 0 * * *'), ('  @HOURLY ', '0 * * * *')) AS t (m, e)$$,
    $$VALUES ('@hourly', TRUE), ('@daily', TRUE), ('@midnight', TRUE), ('@weekly', TRUE), ('@monthly', TRUE),
             ('@yearly', TRUE), ('@annually', TRUE), ('@Daily', TRUE), ('  @HOURLY ', TRUE)$$,
    'Every macro, in any case and with spaces around it, should read as its five fields'
);

SELECT is(
    x_jobs._cron_parse(E' 0\t 0  *\n* *  '),
    x_jobs._cron_parse('0 0 * * *'),
    'Any run of spaces, tabs and newlines should separate the fields, and surrounding ones be ignored'
);

-- Vixie cron: the day fields are AND'ed when either starts with '*', OR'ed when both are
-- restricted; a schedule is fixed (keeps to the wall clock at offset changes) when neither the
-- minute nor the hour field starts with '*'.
SELECT results_eq(
    $$SELECT c, (x_jobs._cron_parse(c)).day_and, (x_jobs._cron_parse(c)).fixed
      FROM unnest(ARRAY['0 0 * * MON', '0 0 13 * *', '0 0 13 * FRI', '0 0 */10 * FRI', '0 0 13 * */2',
                        '30 2 * * *', '*/5 2 * * *', '0 */2 * * *', '0 5-9,* * * *', '@hourly', '@daily']) AS c$$,
    $$VALUES ('0 0 * * MON', TRUE, TRUE), ('0 0 13 * *', TRUE, TRUE), ('0 0 13 * FRI', FALSE, TRUE),
             ('0 0 */10 * FRI', TRUE, TRUE), ('0 0 13 * */2', TRUE, TRUE), ('30 2 * * *', TRUE, TRUE),
             ('*/5 2 * * *', TRUE, FALSE), ('0 */2 * * *', TRUE, FALSE), ('0 5-9,* * * *', TRUE, TRUE),
             ('@hourly', TRUE, FALSE), ('@daily', TRUE, TRUE)$$,
    'The day fields should be AND''ed when either starts with *, and a schedule fixed when neither its minute '
    'nor its hour field does'
);

------------------------------------------------------------------------------------------------
-- cron_next: the instants
------------------------------------------------------------------------------------------------

-- 2030-01-01 is a Tuesday; the 4th and 11th are Fridays, the 13th a Sunday.
SELECT is(
    pg_temp.fires('*/15 9-17 * * MON-FRI', 'UTC', '2030-01-04 17:50+00', 3),
    ARRAY['2030-01-07 09:00', '2030-01-07 09:15', '2030-01-07 09:30'],
    'A working-hours schedule should go from Friday evening to Monday 09:00'
);

SELECT is(
    pg_temp.fires('*/15 * * * *', 'UTC', '2030-01-01 10:15+00', 2),
    ARRAY['2030-01-01 10:30', '2030-01-01 10:45'],
    'The instants should come strictly after `after`, not at it'
);

SELECT is(
    pg_temp.fires('*/15 * * * *', 'UTC', '2030-01-01 10:14:59.999+00', 1),
    ARRAY['2030-01-01 10:15'],
    'An `after` with seconds should be followed by the next whole minute that matches'
);

SELECT is(
    pg_temp.fires('0 0 13 * FRI', 'UTC', '2030-01-01 00:00+00', 4),
    ARRAY['2030-01-04 00:00', '2030-01-11 00:00', '2030-01-13 00:00', '2030-01-18 00:00'],
    'With both day fields restricted, either should do: every Friday and the 13th (Vixie''s OR)'
);

SELECT is(
    pg_temp.fires('0 0 */10 * FRI', 'UTC', '2030-01-01 00:00+00', 3),
    ARRAY['2030-01-11 00:00', '2030-02-01 00:00', '2030-03-01 00:00'],
    'With the day-of-month field starting with *, both should have to match: the 1st, 11th, 21st or 31st '
    'that is a Friday'
);

SELECT is(
    pg_temp.fires('0 0 13 * *', 'UTC', '2030-01-01 00:00+00', 2),
    ARRAY['2030-01-13 00:00', '2030-02-13 00:00'],
    'With the day-of-week field *, the 13th alone should fire'
);

SELECT is(
    pg_temp.fires('0 12 * * 7', 'UTC', '2030-01-01 00:00+00', 2),
    pg_temp.fires('0 12 * * sun', 'UTC', '2030-01-01 00:00+00', 2),
    'Day-of-week 7 should fire on Sundays, as 0 and SUN do'
);

SELECT is(
    pg_temp.fires('0 12 * * 7', 'UTC', '2030-01-01 00:00+00', 2),
    ARRAY['2030-01-06 12:00', '2030-01-13 12:00'],
    'Day-of-week 7 should fire on the Sundays of January 2030, the 6th and the 13th'
);

SELECT is(
    pg_temp.fires('0 0 29 2 *', 'UTC', '2030-01-01 00:00+00', 2),
    ARRAY['2032-02-29 00:00', '2036-02-29 00:00'],
    'The 29th of February should fire in leap years only'
);

SELECT is(
    pg_temp.fires('0 0 31 * *', 'UTC', '2030-01-01 00:00+00', 3),
    ARRAY['2030-01-31 00:00', '2030-03-31 00:00', '2030-05-31 00:00'],
    'The 31st should skip the months that have none'
);

SELECT is(
    pg_temp.fires('0 0 31 2 MON', 'UTC', '2030-01-01 00:00+00', 2),
    ARRAY['2030-02-04 00:00', '2030-02-11 00:00'],
    'A day February lacks with a weekday beside it should still fire on that weekday (OR)'
);

SELECT is(
    pg_temp.fires('59 23 31 12 *', 'UTC', '2030-06-01 00:00+00', 2),
    ARRAY['2030-12-31 23:59', '2031-12-31 23:59'],
    'The last minute of the year should fire once a year'
);

SELECT is(
    pg_temp.fires('@hourly', 'UTC', '2030-01-01 10:30+00', 2),
    ARRAY['2030-01-01 11:00', '2030-01-01 12:00'],
    'A macro should fire as its fields'
);

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.cron_next('* * * * *', 'UTC', '2030-01-01 00:00+00', 1000)),
    1000,
    'count 1000 should answer 1000 instants'
);

SELECT is(
    (SELECT pg_catalog.array_agg(f.fire_at) FROM x_jobs.cron_next('*/5 * * * *', after => '2030-01-01 10:01+00') AS f),
    ARRAY['2030-01-01 10:05+00'::timestamptz],
    'cron_next should default to one instant in UTC'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT is(
    (SELECT pg_catalog.array_agg(f.fire_at) FROM x_jobs.cron_next('*/5 * * * *', count => 2) AS f),
    ARRAY['2030-01-01 10:05+00'::timestamptz, '2030-01-01 10:10+00'::timestamptz],
    'cron_next should default `after` to now, as the test clock reads it'
);

RESET "x_jobs.fake_now";

SELECT is(
    pg_temp.fires('0 9 * * *', 'Asia/Kolkata', '2030-01-01 00:00+00', 2),
    ARRAY['2030-01-01 03:30', '2030-01-02 03:30'],
    'A zone half an hour off UTC should fire at its own 09:00'
);

SELECT is(
    pg_temp.fires('0 9 * * *', 'europe/berlin', '2030-01-01 00:00+00', 1),
    pg_temp.fires('0 9 * * *', 'Europe/Berlin', '2030-01-01 00:00+00', 1),
    'A zone name in lower case should be the zone'
);

SELECT is(
    x_jobs._require_time_zone('america/new_york'),
    'America/New_York',
    'A zone name should come back spelled as the zone database spells it'
);

SELECT results_eq(
    $$SELECT x_jobs._require_time_zone(z)
      FROM unnest(ARRAY['UTC', 'utc', 'Etc/GMT-3', 'etc/gmt+12', 'EST5EDT', 'GMT0', 'US/Eastern']) AS z$$,
    $$VALUES ('UTC'), ('UTC'), ('Etc/GMT-3'), ('Etc/GMT+12'), ('EST5EDT'), ('GMT0'), ('US/Eastern')$$,
    'The zones of the database whose names have digits, and its links, should be zones'
);

SELECT is(
    current_setting('TimeZone'),
    'Asia/Tokyo',
    'cron_next should leave the session''s TimeZone as it was'
);

------------------------------------------------------------------------------------------------
-- Offset changes: Europe/Berlin
------------------------------------------------------------------------------------------------

SELECT is(
    pg_temp.fires('30 2 * * *', 'Europe/Berlin', '2030-03-30 12:00+00', 2),
    ARRAY['2030-03-31 01:00', '2030-04-01 00:30'],
    'Berlin, spring: a 02:30 daily job should fire once at 03:00 CEST, the first valid instant, on the day '
    'the clock skips 02:30'
);

SELECT is(
    pg_temp.fires('0 2 * * *', 'Europe/Berlin', '2030-03-30 12:00+00', 2),
    ARRAY['2030-03-31 01:00', '2030-04-01 00:00'],
    'Berlin, spring: a 02:00 daily job should fire at 03:00 CEST, the instant the clock jumps'
);

SELECT is(
    pg_temp.fires('0 1,2,3 * * *', 'Europe/Berlin', '2030-03-30 12:00+00', 4),
    ARRAY['2030-03-31 00:00', '2030-03-31 01:00', '2030-03-31 23:00', '2030-04-01 00:00'],
    'Berlin, spring: 02:00 moved to 03:00 and 03:00 itself should fire once between them'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Europe/Berlin', '2030-10-26 12:00+00', 2),
    ARRAY['2030-10-27 00:30', '2030-10-28 01:30'],
    'Berlin, autumn: a 02:30 daily job should fire once, at the first 02:30 (CEST), on the day the clock '
    'repeats it'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Europe/Berlin', '2030-10-27 00:30+00', 1),
    ARRAY['2030-10-28 01:30'],
    'Berlin, autumn: after the first 02:30, a 02:30 daily job should not fire at the second'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Europe/Berlin', '2030-10-27 01:10+00', 1),
    ARRAY['2030-10-28 01:30'],
    'Berlin, autumn: from inside the repeated hour (02:10 CET) a 02:30 daily job should next fire the day '
    'after, not at the first 02:30, which has passed'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Europe/Berlin', '2030-10-27 00:10+00', 1),
    ARRAY['2030-10-27 00:30'],
    'Berlin, autumn: from the first pass of the repeated hour (02:10 CEST) a 02:30 daily job should fire at '
    'the first 02:30'
);

SELECT is(
    pg_temp.fires('30 * * * *', 'Europe/Berlin', '2030-10-26 23:00+00', 4),
    ARRAY['2030-10-26 23:30', '2030-10-27 00:30', '2030-10-27 01:30', '2030-10-27 02:30'],
    'Berlin, autumn: an hourly :30 job should fire twice at 02:30, as the clock reads it'
);

SELECT is(
    pg_temp.fires('30 * * * *', 'Europe/Berlin', '2030-10-27 00:40+00', 2),
    ARRAY['2030-10-27 01:30', '2030-10-27 02:30'],
    'Berlin, autumn: from the first pass of the repeated hour, an hourly job should fire at its second pass'
);

SELECT is(
    pg_temp.fires('30 * * * *', 'Europe/Berlin', '2030-03-30 23:00+00', 3),
    ARRAY['2030-03-30 23:30', '2030-03-31 00:30', '2030-03-31 01:30'],
    'Berlin, spring: an hourly :30 job should skip the hour the clock skips'
);

SELECT is(
    pg_temp.fires('*/30 2 * * *', 'Europe/Berlin', '2030-10-26 12:00+00', 5),
    ARRAY['2030-10-27 00:00', '2030-10-27 00:30', '2030-10-27 01:00', '2030-10-27 01:30', '2030-10-28 01:00'],
    'Berlin, autumn: a job every 30 minutes of hour 2 (not fixed) should fire in both passes of the hour'
);

SELECT is(
    pg_temp.fires('*/30 2 * * *', 'Europe/Berlin', '2030-03-30 12:00+00', 2),
    ARRAY['2030-04-01 00:00', '2030-04-01 00:30'],
    'Berlin, spring: a job every 30 minutes of hour 2 (not fixed) should not fire on the day that hour is '
    'skipped'
);

------------------------------------------------------------------------------------------------
-- Offset changes: America/New_York
------------------------------------------------------------------------------------------------

SELECT is(
    pg_temp.fires('30 2 * * *', 'America/New_York', '2030-03-09 12:00+00', 2),
    ARRAY['2030-03-10 07:00', '2030-03-11 06:30'],
    'New York, spring: a 02:30 daily job should fire once at 03:00 EDT'
);

SELECT is(
    pg_temp.fires('30 1 * * *', 'America/New_York', '2030-11-02 12:00+00', 2),
    ARRAY['2030-11-03 05:30', '2030-11-04 06:30'],
    'New York, autumn: a 01:30 daily job should fire once, at the first 01:30 (EDT)'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'America/New_York', '2030-11-02 12:00+00', 2),
    ARRAY['2030-11-03 07:30', '2030-11-04 07:30'],
    'New York, autumn: a 02:30 daily job, a time that occurs once, should fire once'
);

SELECT is(
    pg_temp.fires('0 * * * *', 'America/New_York', '2030-11-03 04:30+00', 4),
    ARRAY['2030-11-03 05:00', '2030-11-03 06:00', '2030-11-03 07:00', '2030-11-03 08:00'],
    'New York, autumn: an hourly job should fire at 01:00 EDT and again at 01:00 EST'
);

------------------------------------------------------------------------------------------------
-- Offset changes: Australia/Adelaide (+09:30, +10:30 in summer)
------------------------------------------------------------------------------------------------

SELECT is(
    pg_temp.fires('30 2 * * *', 'Australia/Adelaide', '2030-10-04 12:00+00', 2),
    ARRAY['2030-10-04 17:00', '2030-10-05 16:30'],
    'Adelaide, spring (October): a 02:30 daily job should fire once at 03:00 ACDT'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Australia/Adelaide', '2030-04-05 12:00+00', 2),
    ARRAY['2030-04-05 16:00', '2030-04-06 16:00'],
    'Adelaide, autumn (April): a 02:30 daily job should fire once, at the first 02:30 (ACDT)'
);

SELECT is(
    pg_temp.fires('30 2 * * *', 'Australia/Adelaide', '2030-04-06 16:40+00', 1),
    ARRAY['2030-04-07 17:00'],
    'Adelaide, autumn: from inside the repeated hour a 02:30 daily job should next fire the day after'
);

SELECT is(
    pg_temp.fires('15 * * * *', 'Australia/Adelaide', '2030-04-06 14:00+00', 4),
    ARRAY['2030-04-06 14:45', '2030-04-06 15:45', '2030-04-06 16:45', '2030-04-06 17:45'],
    'Adelaide, autumn: an hourly :15 job should fire twice at 02:15'
);

SELECT is(
    pg_temp.fires('15 * * * *', 'Australia/Adelaide', '2030-10-05 14:00+00', 3),
    ARRAY['2030-10-05 14:45', '2030-10-05 15:45', '2030-10-05 16:45'],
    'Adelaide, spring: an hourly :15 job should skip 02:15, which the clock skips'
);

------------------------------------------------------------------------------------------------
-- Refusals: each with its SQLSTATE, a message naming the field or value, and a hint
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE refusal (
    n integer GENERATED ALWAYS AS IDENTITY,
    stmt text NOT NULL,
    sqlstate text NOT NULL,
    message text NOT NULL,
    hint text NOT NULL
);

INSERT INTO refusal (stmt, sqlstate, message, hint)
SELECT
    pg_catalog.format('SELECT * FROM x_jobs.cron_next(%L)', r.cron) AS stmt,
    'XJ043' AS sqlstate,
    pg_catalog.format('X_CRON_INVALID: cron %L: the %s field %L %s', r.cron, r.field, r.text, r.problem) AS message,
    r.hint
FROM (
    VALUES
    (
        'a * * * *', 'minute', 'a', 'has ''a'', which is not a value',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '1,,2 * * * *', 'minute', '1,,2', 'is not a value, a range or a step',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '1-2-3 * * * *', 'minute', '1-2-3', 'is not a value, a range or a step',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '1/2/3 * * * *', 'minute', '1/2/3', 'is not a value, a range or a step',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '-1 * * * *', 'minute', '-1', 'is not a value, a range or a step',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '1.5 * * * *', 'minute', '1.5', 'has ''1.5'', which is not a value',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '60 * * * *', 'minute', '60', 'has 60, outside 0-59',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '0 24 * * *', 'hour', '24', 'has 24, outside 0-23',
        'The hour field takes 0-23, such as 9, 9-17, */6 or 8,12,18.'
    ),
    (
        '0 0 0 * *', 'day-of-month', '0', 'has 0, outside 1-31',
        'The day-of-month field takes 1-31, such as 1, 1,15, 10-20 or */2.'
    ),
    (
        '0 0 32 * *', 'day-of-month', '32', 'has 32, outside 1-31',
        'The day-of-month field takes 1-31, such as 1, 1,15, 10-20 or */2.'
    ),
    (
        '0 0 L * *', 'day-of-month', 'L', 'has ''L'', which is not a value',
        'The day-of-month field takes 1-31, such as 1, 1,15, 10-20 or */2.'
    ),
    (
        '0 0 * 13 *', 'month', '13', 'has 13, outside 1-12',
        'The month field takes 1-12 or JAN-DEC, such as 1, JAN-MAR, */3 or JUN,DEC.'
    ),
    (
        '0 0 * January *', 'month', 'January', 'has ''January'', which is not a value',
        'The month field takes 1-12 or JAN-DEC, such as 1, JAN-MAR, */3 or JUN,DEC.'
    ),
    (
        '0 0 * * 8', 'day-of-week', '8', 'has 8, outside 0-7',
        'The day-of-week field takes 0-7 or SUN-SAT, such as MON-FRI, 1-5, SAT,SUN or 0 (Sunday, as 7).'
    ),
    (
        '0 0 * * mon#2', 'day-of-week', 'mon#2', 'has ''mon#2'', which is not a value',
        'The day-of-week field takes 0-7 or SUN-SAT, such as MON-FRI, 1-5, SAT,SUN or 0 (Sunday, as 7).'
    ),
    (
        '5-1 * * * *', 'minute', '5-1', 'has the range 5-1, which runs backwards',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '0 0 * * SAT-MON', 'day-of-week', 'SAT-MON', 'has the range SAT-MON, which runs backwards',
        'The day-of-week field takes 0-7 or SUN-SAT, such as MON-FRI, 1-5, SAT,SUN or 0 (Sunday, as 7).'
    ),
    (
        '*/0 * * * *', 'minute', '*/0', 'has step ''0'', not a whole number from 1 to 60',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '*/61 * * * *', 'minute', '*/61', 'has step ''61'', not a whole number from 1 to 60',
        'The minute field takes 0-59, such as 0, */15, 0,30 or 10-50/20.'
    ),
    (
        '0 */x * * *', 'hour', '*/x', 'has step ''x'', not a whole number from 1 to 24',
        'The hour field takes 0-23, such as 9, 9-17, */6 or 8,12,18.'
    ),
    (
        '0 0 * * */8', 'day-of-week', '*/8', 'has step ''8'', not a whole number from 1 to 7',
        'The day-of-week field takes 0-7 or SUN-SAT, such as MON-FRI, 1-5, SAT,SUN or 0 (Sunday, as 7).'
    )
) AS r (cron, field, text, problem, hint);

-- The hints that the refusals of a whole expression, a zone and a count carry.
CREATE TEMP TABLE refusal_hint (kind text PRIMARY KEY, hint text NOT NULL);

INSERT INTO refusal_hint (kind, hint) VALUES
(
    'five',
    'Write five fields, minute hour day-of-month month day-of-week, such as ''*/15 9-17 * * MON-FRI'' or '
    '''30 2 1 * *'', or one of @hourly, @daily, @weekly, @monthly, @yearly.'
),
(
    'days',
    'Pick days that the months have (February has 29 at most, April, June, September and November 30), '
    'such as ''0 0 28 2 *''.'
),
(
    'zone',
    'Name a zone of the IANA database, such as ''Europe/Berlin'', ''America/New_York'' or ''UTC'' '
    '(SELECT name FROM pg_timezone_names); for a fixed offset, ''Etc/GMT-3'' is UTC+3.'
),
('count', 'Ask for 1 to 1000 instants at a time; pass the last one as after for more.');

INSERT INTO refusal (stmt, sqlstate, message, hint)
SELECT
    pg_catalog.format('SELECT * FROM x_jobs.cron_next(%s)', r.arg) AS stmt,
    r.sqlstate,
    r.message,
    h.hint
FROM (
    VALUES
    ($a$'* * * *'$a$, 'XJ043', $m$X_CRON_INVALID: cron '* * * *' has 4 fields, not 5$m$, 'five'),
    ($a$'0 0 * * * *'$a$, 'XJ043', $m$X_CRON_INVALID: cron '0 0 * * * *' has 6 fields, not 5$m$, 'five'),
    ($a$'0 0 * * * * *'$a$, 'XJ043', $m$X_CRON_INVALID: cron '0 0 * * * * *' has 7 fields, not 5$m$, 'five'),
    ($a$'  '$a$, 'XJ043', $m$X_CRON_INVALID: cron '  ' has 0 fields, not 5$m$, 'five'),
    ('NULL', 'XJ043', 'X_CRON_INVALID: cron NULL has 0 fields, not 5', 'five'),
    ($a$'@reboot'$a$, 'XJ043', $m$X_CRON_INVALID: cron '@reboot' is not a schedule x_jobs knows$m$, 'five'),
    (
        $a$'0 0 30 2 *'$a$, 'XJ043',
        $m$X_CRON_INVALID: cron '0 0 30 2 *' never fires: no month of its month field has day 30$m$, 'days'
    ),
    (
        $a$'0 0 31 4,6,9,11 *'$a$, 'XJ043',
        $m$X_CRON_INVALID: cron '0 0 31 4,6,9,11 *' never fires: no month of its month field has day 31$m$, 'days'
    ),
    (
        $a$'0 0 * * *', 'Mars/Olympus'$a$, 'XJ046',
        $m$X_TIME_ZONE_INVALID: 'Mars/Olympus' is not a time zone name$m$, 'zone'
    ),
    ($a$'0 0 * * *', 'UTC+3'$a$, 'XJ046', $m$X_TIME_ZONE_INVALID: 'UTC+3' is not a time zone name$m$, 'zone'),
    ($a$'0 0 * * *', 'GMT+3'$a$, 'XJ046', $m$X_TIME_ZONE_INVALID: 'GMT+3' is not a time zone name$m$, 'zone'),
    (
        $a$'0 0 * * *', 'Europe/Berlin+1'$a$, 'XJ046',
        $m$X_TIME_ZONE_INVALID: 'Europe/Berlin+1' is not a time zone name$m$, 'zone'
    ),
    ($a$'0 0 * * *', '+03'$a$, 'XJ046', $m$X_TIME_ZONE_INVALID: '+03' is not a time zone name$m$, 'zone'),
    ($a$'0 0 * * *', 'localtime'$a$, 'XJ046', $m$X_TIME_ZONE_INVALID: 'localtime' is not a time zone name$m$, 'zone'),
    ($a$'0 0 * * *', ''$a$, 'XJ046', $m$X_TIME_ZONE_INVALID: '' is not a time zone name$m$, 'zone'),
    ($a$'0 0 * * *', NULL$a$, 'XJ046', 'X_TIME_ZONE_INVALID: NULL is not a time zone name', 'zone'),
    ($a$'0 0 * * *', count => 0$a$, 'XJ013', 'X_QTY_INVALID: count 0 is outside 1..1000', 'count'),
    ($a$'0 0 * * *', count => 1001$a$, 'XJ013', 'X_QTY_INVALID: count 1001 is outside 1..1000', 'count'),
    ($a$'0 0 * * *', count => NULL$a$, 'XJ013', 'X_QTY_INVALID: count NULL is outside 1..1000', 'count')
) AS r (arg, sqlstate, message, hint_kind)
INNER JOIN refusal_hint AS h ON r.hint_kind = h.kind;

SELECT is((SELECT count(*)::integer FROM refusal), 40, 'The refusals below should be the 40 listed');

SELECT
    throws_ok(
        r.stmt, r.sqlstate, r.message,
        pg_catalog.format('%s should be refused with %s, naming what is wrong', r.stmt, r.sqlstate)
    )
FROM refusal AS r
ORDER BY r.n;

SELECT is_empty(
    $$SELECT r.stmt, c.err_hint, r.hint
      FROM refusal AS r CROSS JOIN LATERAL tap_helpers.caught(r.stmt) AS c
      WHERE c.err_hint IS DISTINCT FROM r.hint$$,
    'Every refusal should carry its hint: the field''s values and an example, or what to write instead'
);

SELECT is(
    (SELECT c.err_detail FROM tap_helpers.caught($$SELECT * FROM x_jobs.cron_next('0 0 * * * *')$$) AS c),
    'x_jobs fires at whole minutes: it takes no seconds field.',
    'Six fields should be refused with a detail that says no seconds field is taken'
);

SELECT * FROM finish();
ROLLBACK;
