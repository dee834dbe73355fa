-- x_jobs.error_codes() is the catalogue of refusals that clients branch on: it must be complete
-- (every SQLSTATE and X_ code an x_jobs body raises is in it, paired as raised) and true (every
-- entry is raised somewhere), with unique codes and SQLSTATEs. The bodies are read from pg_proc.
BEGIN;
SELECT plan(20);

-- Every RAISE EXCEPTION of every x_jobs function, one row each: the text from that RAISE to the
-- next one (or the end of the body), the ERRCODE it names and the X_ code its MESSAGE starts with
-- (the message is either a literal or the format string of pg_catalog.format).
CREATE TEMP VIEW raised AS
SELECT
    r.fn,
    r.n,
    substring(r.chunk FROM $re$^\s+USING\s+ERRCODE\s*=\s*'([^']*)'$re$) AS sqlstate,
    substring(
        r.chunk
        FROM $re$^\s+USING\s+ERRCODE\s*=\s*'[^']*'\s*,\s*MESSAGE\s*=\s*$re$
        || $re$(?:pg_catalog\.format\(\s*)?'(X_[A-Z_]+):$re$
    ) AS code
FROM (
    SELECT
        p.oid::regprocedure::text AS fn,
        s.n,
        s.chunk
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL regexp_split_to_table(p.prosrc, 'RAISE\s+EXCEPTION') WITH ORDINALITY AS s (chunk, n)
    WHERE p.pronamespace = 'x_jobs'::regnamespace
) AS r
WHERE r.n > 1;

SELECT cmp_ok(
    (SELECT count(*)::integer FROM raised),
    '>=',
    30,
    'The bodies of the x_jobs functions should hold the RAISE statements this test reads'
);

SELECT is_empty(
    $$SELECT fn, n FROM raised WHERE sqlstate IS NULL OR code IS NULL$$,
    'Every RAISE EXCEPTION should be USING ERRCODE, then a MESSAGE that starts with an X_ code'
);

-- XJ999 (X_TRIAL_UNDONE) is the one SQLSTATE raised but not catalogued: set_schedule raises it
-- right after its trial enqueue, to roll that back, and catches it in the same block, so that no
-- caller can meet it. The test after these holds it there.
SELECT is_empty(
    $$SELECT m[1] AS sqlstate
      FROM pg_catalog.pg_proc AS p
      CROSS JOIN LATERAL regexp_matches(p.prosrc, $re$ERRCODE\s*=\s*'([^']*)'$re$, 'g') AS m
      WHERE p.pronamespace = 'x_jobs'::regnamespace
      EXCEPT
      SELECT sqlstate FROM x_jobs.error_codes()
      EXCEPT
      SELECT 'XJ999'$$,
    'Every SQLSTATE in an ERRCODE of an x_jobs body should be in error_codes(), but set_schedule''s XJ999'
);

-- X_STEP_TIMEOUT is the one code that starts a text but is not raised: it is the error recorded
-- on a wait whose timeout came (steps, step_wait), which the client raises when it replays the
-- step. It has no SQLSTATE, so it is not in error_codes(); the next test keeps it unraised.
SELECT is_empty(
    $$SELECT m[1] AS code
      FROM pg_catalog.pg_proc AS p
      CROSS JOIN LATERAL regexp_matches(p.prosrc, $re$'(X_[A-Z_]+):$re$, 'g') AS m
      WHERE p.pronamespace = 'x_jobs'::regnamespace
      EXCEPT
      SELECT code FROM x_jobs.error_codes()
      EXCEPT
      VALUES ('X_STEP_TIMEOUT'), ('X_TRIAL_UNDONE')$$,
    'Every X_ code that starts a message in an x_jobs body should be in error_codes(), but the recorded '
    'X_STEP_TIMEOUT and set_schedule''s X_TRIAL_UNDONE'
);

SELECT results_eq(
    $$SELECT DISTINCT p.proname::text COLLATE "default"
      FROM pg_catalog.pg_proc AS p
      WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.prosrc LIKE '%''X\_STEP\_TIMEOUT:%'
      ORDER BY 1$$,
    $$VALUES ('step_wait'), ('steps')$$,
    'X_STEP_TIMEOUT should start only the error that steps and step_wait record on a timed-out wait'
);

SELECT is_empty(
    $$SELECT fn, n FROM raised WHERE code = 'X_STEP_TIMEOUT'$$,
    'X_STEP_TIMEOUT should never be raised: it is recorded on the step, not a SQLSTATE'
);

SELECT results_eq(
    $$SELECT r.fn COLLATE "default", r.sqlstate COLLATE "default", r.code COLLATE "default",
             (SELECT count(*)::integer
              FROM pg_catalog.pg_proc AS p
              CROSS JOIN LATERAL regexp_matches(p.prosrc, $re$EXCEPTION\s+WHEN\s+SQLSTATE\s+'XJ999'\s+THEN$re$, 'g') AS m
              WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.proname = 'set_schedule')
      FROM raised AS r
      WHERE r.sqlstate = 'XJ999' OR r.code = 'X_TRIAL_UNDONE'$$,
    $$VALUES (
        'x_jobs.set_schedule(text,text,text,text,jsonb,text,text,integer,text,interval,integer,integer,text,text,'
        'integer,boolean,interval,interval,boolean,boolean,text,text)', 'XJ999', 'X_TRIAL_UNDONE', 1
    )$$,
    'XJ999 should be raised once, by set_schedule, which catches it (its trial enqueue''s undo)'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM raised WHERE sqlstate <> 'XJ999'
      EXCEPT
      SELECT sqlstate, code FROM x_jobs.error_codes()$$,
    'Every RAISE should pair its SQLSTATE and X_ code as error_codes() does'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      EXCEPT
      SELECT sqlstate, code FROM raised$$,
    'Every entry of error_codes() should be raised, with its X_ code, by some x_jobs function'
);

SELECT is_empty(
    $$SELECT sqlstate FROM x_jobs.error_codes() GROUP BY sqlstate HAVING count(*) > 1$$,
    'No SQLSTATE should appear twice in error_codes()'
);

SELECT is_empty(
    $$SELECT code FROM x_jobs.error_codes() GROUP BY code HAVING count(*) > 1$$,
    'No X_ code should appear twice in error_codes()'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      WHERE sqlstate !~ '^[0-9A-Z]{5}$' OR code !~ '^X_[A-Z_]+$' OR coalesce(meaning, '') = ''$$,
    'Every entry of error_codes() should have a five-character SQLSTATE, an X_ code and a meaning'
);

SELECT is_empty(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()
      WHERE sqlstate LIKE 'XJ%' AND sqlstate !~ '^XJ[0-9]{3}$'$$,
    'The SQLSTATEs of our own class should be XJ followed by three digits'
);

-- The catalogue itself: clients and the README branch on these pairs, so a renumbered or
-- renamed code is an API change. 0.2.0 added XJ024..XJ033 (steps and events) and XJ034..XJ037
-- (the outbox and the webhook ledger), 0.3.3 XJ038 (the test clock), 0.3.5 XJ039 (times clients cannot read),
-- 0.3.8 XJ040 (a malformed x_jobs.max_payload_bytes), 0.4.0 XJ041 and XJ042 (the roles an install
-- finds), XJ044 and XJ045 (the bulk operations' filters), XJ047 and XJ048 (declarations), XJ051
-- (queue_gauges' max_age), 0.4.2 XJ043, XJ046, XJ049 and XJ050 (schedules), XJ052 and XJ053 (the
-- fence: a worker id another login's, attempts that do not pair with their ids), XJ058..XJ062
-- (tenants), XJ063..XJ065 (rate limits), XJ066 (queue policies), XJ067..XJ069 (the stream and the consumers' cursors).
SELECT set_eq(
    $$SELECT sqlstate, code FROM x_jobs.error_codes()$$,
    $$VALUES
        ('XJ001', 'X_NAME_INVALID'), ('XJ002', 'X_QUEUE_INVALID'), ('XJ003', 'X_PAYLOAD_TOO_LARGE'),
        ('XJ004', 'X_MAX_ATTEMPTS_INVALID'), ('XJ005', 'X_PRIORITY_INVALID'), ('XJ006', 'X_TENANT_INVALID'),
        ('XJ007', 'X_CONCURRENCY_INVALID'), ('XJ008', 'X_BACKOFF_INVALID'), ('XJ009', 'X_JOBS_INVALID'),
        ('XJ010', 'X_QUEUES_INVALID'), ('XJ011', 'X_WORKER_INVALID'), ('XJ012', 'X_LEASE_INVALID'),
        ('XJ013', 'X_QTY_INVALID'), ('XJ014', 'X_JOB_NOT_FOUND'), ('XJ015', 'X_JOB_NOT_RETRYABLE'),
        ('XJ016', 'X_STATE_UNKNOWN'), ('XJ017', 'X_IDEMPOTENCY_CONFLICT'), ('XJ018', 'X_DELAY_INVALID'),
        ('XJ019', 'X_TTL_INVALID'), ('XJ020', 'X_RETENTION_INVALID'), ('XJ021', 'X_OUTPUTS_INVALID'),
        ('XJ022', 'X_ISOLATION_UNSUPPORTED'), ('XJ023', 'X_ERROR_MISSING'), ('XJ024', 'X_STEP_INVALID'),
        ('XJ025', 'X_TIMEOUT_INVALID'), ('XJ026', 'X_JOB_NOT_HELD'), ('XJ027', 'X_STEP_CONFLICT'),
        ('XJ028', 'X_EVENT_INVALID'), ('XJ029', 'X_MATCH_INVALID'), ('XJ030', 'X_JOB_HELD'),
        ('XJ031', 'X_STEP_NOT_FOUND'), ('XJ032', 'X_STEP_NOT_WAITING'), ('XJ033', 'X_PROGRESS_INVALID'),
        ('XJ034', 'X_TOPIC_INVALID'), ('XJ035', 'X_MESSAGE_INVALID'), ('XJ036', 'X_RELAY_INVALID'),
        ('XJ037', 'X_WEBHOOK_INVALID'), ('XJ038', 'X_CLOCK_REFUSED'), ('XJ039', 'X_TIME_INVALID'),
        ('XJ040', 'X_SETTING_INVALID'), ('XJ041', 'X_ROLE_UNSAFE'), ('XJ042', 'X_ROLES_MISSING'),
        ('XJ043', 'X_CRON_INVALID'), ('XJ044', 'X_STATE_NOT_ALLOWED'), ('XJ045', 'X_RANGE_EMPTY'),
        ('XJ046', 'X_TIME_ZONE_INVALID'), ('XJ047', 'X_DECLARATIONS_INVALID'), ('XJ048', 'X_JOB_TIMEOUT_INVALID'),
        ('XJ049', 'X_SCHEDULE_INVALID'), ('XJ050', 'X_SCHEDULE_NOT_FOUND'), ('XJ051', 'X_MAX_AGE_INVALID'),
        ('XJ052', 'X_WORKER_NOT_YOURS'), ('XJ053', 'X_ATTEMPTS_INVALID'),
        ('XJ058', 'X_ROLE_UNKNOWN'), ('XJ059', 'X_TENANT_NOT_BOUND'), ('XJ060', 'X_TENANT_OUT_OF_SCOPE'),
        ('XJ061', 'X_TENANT_AMBIGUOUS'), ('XJ062', 'X_CROSS_TENANT'),
        ('XJ063', 'X_RATE_LIMIT_INVALID'), ('XJ064', 'X_RATE_LIMIT_UNKNOWN'), ('XJ065', 'X_RATE_LIMIT_CONFLICT'),
        ('XJ066', 'X_QUEUE_POLICY_INVALID'),
        ('XJ067', 'X_STREAM_INVALID'), ('XJ068', 'X_POSITION_INVALID'), ('XJ069', 'X_CURSOR_INVALID'),
        ('40001', 'X_ENQUEUE_RACE')$$,
    'error_codes() should list exactly the documented SQLSTATE and X_ code pairs'
);

-- The outbox's own codes come from the outbox functions only: the put checks (a topic, a
-- message, and outbox_put's key), the relay's id on claim and settle, and the webhook's source
-- and id.
SELECT set_eq(
    $$SELECT DISTINCT r.sqlstate, regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g')
      FROM raised AS r
      WHERE r.sqlstate IN ('XJ034', 'XJ035', 'XJ036', 'XJ037')$$,
    $$VALUES
        ('XJ034', '_require_message'),
        ('XJ035', '_require_message'), ('XJ035', 'outbox_put'), ('XJ035', 'outbox_put_many'),
        ('XJ036', 'relay_outbox'), ('XJ036', 'outbox_ack'), ('XJ036', 'outbox_nack'),
        ('XJ036', 'outbox_extend_lease'),
        ('XJ037', 'receive_webhook')$$,
    'XJ034..XJ037 should be raised only by the outbox and webhook functions they are documented for'
);

-- The malformed setting is refused in one place, which every limit read goes through.
SELECT set_eq(
    $$SELECT DISTINCT regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g') FROM raised AS r WHERE r.sqlstate = 'XJ040'$$,
    $$VALUES ('_max_payload_setting')$$,
    'XJ040 should be raised only by _max_payload_setting, which _max_payload_bytes calls'
);

-- The roles are refused by the helper each install and update script runs first, and only there.
SELECT set_eq(
    $$SELECT DISTINCT r.sqlstate, regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g')
      FROM raised AS r WHERE r.sqlstate IN ('XJ041', 'XJ042')$$,
    $$VALUES ('XJ041', '_setup_roles'), ('XJ042', '_setup_roles')$$,
    'XJ041 and XJ042 should be raised only by _setup_roles, which the install and update scripts run'
);

-- The declarations' own codes come from the declaring functions only.
SELECT set_eq(
    $$SELECT DISTINCT r.sqlstate, regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g')
      FROM raised AS r
      WHERE r.sqlstate IN ('XJ047', 'XJ048')$$,
    $$VALUES ('XJ047', '_declare'), ('XJ047', 'declare_jobs'), ('XJ048', '_declare')$$,
    'XJ047 and XJ048 should be raised only by the declaring functions'
);

-- The rate limits' own codes come from the key check, the limit functions, enqueue's and the
-- declarations' checks.
SELECT set_eq(
    $$SELECT DISTINCT r.sqlstate, regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g')
      FROM raised AS r
      WHERE r.sqlstate IN ('XJ063', 'XJ064', 'XJ065')$$,
    $$VALUES ('XJ063', '_require_rate_limit_key'), ('XJ063', 'set_rate_limit'), ('XJ063', '_enqueue'),
             ('XJ063', '_declare'), ('XJ064', 'drop_rate_limit'), ('XJ064', '_enqueue'),
             ('XJ064', '_declare'), ('XJ065', '_enqueue'), ('XJ065', '_declare')$$,
    'XJ063..XJ065 should be raised only by the rate limit functions and the checks of enqueue and declarations'
);

-- The schedules' own codes come from the cron reader, the zone check and the schedule functions.
SELECT set_eq(
    $$SELECT DISTINCT r.sqlstate, regexp_replace(r.fn, '^x_jobs\.|\(.*$', '', 'g')
      FROM raised AS r
      WHERE r.sqlstate IN ('XJ043', 'XJ046', 'XJ049', 'XJ050')$$,
    $$VALUES ('XJ043', '_cron_field'), ('XJ043', '_cron_parse'), ('XJ046', '_require_time_zone'),
             ('XJ049', 'set_schedule'), ('XJ050', '_schedule_not_found')$$,
    'XJ043, XJ046, XJ049 and XJ050 should be raised only by the cron reader, the zone check and set_schedule, '
    'and the helper that refuses an unknown schedule'
);

SELECT * FROM finish();
ROLLBACK;
