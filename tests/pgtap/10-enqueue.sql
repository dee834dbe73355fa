-- x_jobs.enqueue: what a new row holds (defaults and every argument), when it is delayed, how a
-- live idempotency key dedupes and when it is free again, and every refusal with its SQLSTATE,
-- message, detail and hint.
BEGIN;
SELECT plan(81);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- What each enqueue of this file answered, by tag.
CREATE TEMP TABLE answer (tag text PRIMARY KEY, id bigint, run_id uuid, deduped boolean);

-- Defaults -------------------------------------------------------------------------------------

INSERT INTO answer
SELECT
    'defaults' AS tag,
    e.*
FROM x_jobs.enqueue('defaults_job') AS e;

SELECT results_eq(
    $$
    SELECT j.queue, j.state::text, j.attempt, j.max_attempts, j.priority::integer, j.tenant_id, j.input,
           j.backoff_base, j.backoff_max, j.dead_letter, j.claims
    FROM x_jobs.job AS j WHERE j.name = 'defaults_job'
    $$,
    $$
    VALUES ('default', 'ready', 0, 25, 0, 'none', '{}'::jsonb, interval '1 second', interval '1 hour', TRUE, 0)
    $$,
    'A job enqueued with only a name should get the default queue, state, attempts, priority, tenant, input, '
    'backoff and dead letter'
);

SELECT results_eq(
    $$
    SELECT j.run_at, j.created_at, j.updated_at, j.visible_at, j.started_at, j.finished_at
    FROM x_jobs.job AS j WHERE j.name = 'defaults_job'
    $$,
    $$
    VALUES (
        timestamptz '2030-01-01 12:00:00+00', timestamptz '2030-01-01 12:00:00+00',
        timestamptz '2030-01-01 12:00:00+00', NULL::timestamptz, NULL::timestamptz, NULL::timestamptz
    )
    $$,
    'A job enqueued without run_at should be due, created and updated at x_jobs.now(), and not yet leased, '
    'started or finished'
);

SELECT results_eq(
    $$
    SELECT j.idempotency_key, j.concurrency_key, j.concurrency_limit, j.traceparent, j.enqueued_by,
           j.claimed_by, j.output, j.progress, j.last_error, j.last_error_stack
    FROM x_jobs.job AS j WHERE j.name = 'defaults_job'
    $$,
    $$
    VALUES (
        NULL::text, NULL::text, NULL::integer, NULL::text, NULL::text, NULL::text, NULL::jsonb,
        NULL::jsonb, NULL::text, NULL::text
    )
    $$,
    'A job enqueued with only a name should have no key, concurrency key or limit, trace, enqueuer, holder, '
    'output or error'
);

SELECT results_eq(
    $$ SELECT a.id, a.run_id, a.deduped FROM answer AS a WHERE a.tag = 'defaults' $$,
    $$ SELECT j.id, j.run_id, FALSE FROM x_jobs.job AS j WHERE j.name = 'defaults_job' $$,
    'enqueue should answer the new row''s id and run_id, with deduped false'
);

INSERT INTO answer
SELECT
    'nulls' AS tag,
    e.*
FROM x_jobs.enqueue(
    name => 'nulls_job', input => NULL, queue => NULL, max_attempts => NULL, priority => NULL,
    tenant_id => NULL, dead_letter => NULL, backoff_base => NULL, backoff_max => NULL
) AS e;

SELECT results_eq(
    $$
    SELECT j.queue, j.state::text, j.max_attempts, j.priority::integer, j.tenant_id, j.input,
           j.backoff_base, j.backoff_max, j.dead_letter
    FROM x_jobs.job AS j WHERE j.name = 'nulls_job'
    $$,
    $$ VALUES ('default', 'ready', 25, 0, 'none', '{}'::jsonb, interval '1 second', interval '1 hour', TRUE) $$,
    'An explicit NULL for an optional argument should mean its default'
);

SELECT isnt(
    (
        SELECT a.run_id FROM answer AS a
        WHERE a.tag = 'nulls'
    ),
    (
        SELECT a.run_id FROM answer AS a
        WHERE a.tag = 'defaults'
    ),
    'Every new job should get a run_id of its own'
);

-- Every argument, in named notation -----------------------------------------------------------

INSERT INTO answer
SELECT
    'all' AS tag,
    e.*
FROM x_jobs.enqueue(
    name => 'all_args_job',
    input => '{"to": "a@example.com", "n": [1, 2]}',
    queue => 'mail',
    run_at => '2030-01-01 11:00:00+00',
    idempotency_key => 'all-args-key',
    max_attempts => 3,
    priority => -7,
    tenant_id => 'acme',
    concurrency_key => 'acme-mail',
    traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
    enqueued_by => 'tests/pgtap/10-enqueue.sql',
    concurrency_limit => 4,
    dead_letter => FALSE,
    backoff_base => '5 seconds',
    backoff_max => '10 minutes'
) AS e;

SELECT results_eq(
    $$
    SELECT j.id, j.run_id, j.input, j.queue, j.run_at, j.state::text, j.idempotency_key, j.max_attempts,
           j.priority::integer, j.tenant_id, j.concurrency_key, j.traceparent, j.enqueued_by,
           j.concurrency_limit, j.dead_letter, j.backoff_base, j.backoff_max, j.attempt
    FROM x_jobs.job AS j WHERE j.name = 'all_args_job'
    $$,
    $$
    SELECT a.id, a.run_id, '{"to": "a@example.com", "n": [1, 2]}'::jsonb, 'mail',
           timestamptz '2030-01-01 11:00:00+00', 'ready', 'all-args-key', 3, -7, 'acme', 'acme-mail',
           '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', 'tests/pgtap/10-enqueue.sql', 4, FALSE,
           interval '5 seconds', interval '10 minutes', 0
    FROM answer AS a WHERE a.tag = 'all'
    $$,
    'Every argument given by name should be stored on the row; a run_at in the past is kept and the row is ready'
);

-- run_at and state ------------------------------------------------------------------------------

INSERT INTO answer
SELECT
    'later' AS tag,
    e.*
FROM x_jobs.enqueue('later_job', run_at => '2030-01-01 13:00:00+00') AS e;
INSERT INTO answer
SELECT
    'now' AS tag,
    e.*
FROM x_jobs.enqueue('now_job', run_at => '2030-01-01 12:00:00+00') AS e;

SELECT results_eq(
    $$
    SELECT j.name, j.state::text, j.run_at
    FROM x_jobs.job AS j WHERE j.name IN ('later_job', 'now_job') ORDER BY j.name
    $$,
    $$
    VALUES ('later_job', 'delayed', timestamptz '2030-01-01 13:00:00+00'),
           ('now_job', 'ready', timestamptz '2030-01-01 12:00:00+00')
    $$,
    'A run_at in the future should make the row delayed until then; a run_at of now should make it ready'
);

-- Concurrency key without a limit ---------------------------------------------------------------

INSERT INTO answer
SELECT
    'keyed' AS tag,
    e.*
FROM x_jobs.enqueue('keyed_job', concurrency_key => 'keyed') AS e;

SELECT results_eq(
    $$ SELECT j.concurrency_key, j.concurrency_limit FROM x_jobs.job AS j WHERE j.name = 'keyed_job' $$,
    $$ VALUES ('keyed', 1) $$,
    'A concurrency_key given without a limit should store a limit of 1'
);

-- Idempotency keys --------------------------------------------------------------------------------

INSERT INTO answer
SELECT
    'dup1' AS tag,
    e.*
FROM x_jobs.enqueue('dup_job', input => '{"v": 1}', queue => 'dedupe', idempotency_key => 'dup') AS e;
INSERT INTO answer
SELECT
    'dup2' AS tag,
    e.*
FROM x_jobs.enqueue('dup_job_again', input => '{"v": 2}', queue => 'elsewhere', idempotency_key => 'dup') AS e;

SELECT results_eq(
    $$ SELECT a.id, a.run_id, a.deduped FROM answer AS a WHERE a.tag = 'dup2' $$,
    $$ SELECT a.id, a.run_id, TRUE FROM answer AS a WHERE a.tag = 'dup1' $$,
    'A second enqueue under a live idempotency key should answer the first row''s id and run_id, deduped'
);

SELECT results_eq(
    $$ SELECT j.name, j.input, j.queue FROM x_jobs.job AS j WHERE j.idempotency_key = 'dup' $$,
    $$ VALUES ('dup_job', '{"v": 1}'::jsonb, 'dedupe') $$,
    'A deduped enqueue should add no row and leave the live row as the first call made it'
);

SELECT is(
    (
        SELECT a.deduped FROM answer AS a
        WHERE a.tag = 'dup1'
    ),
    FALSE,
    'The first enqueue under a key should answer deduped false'
);

-- The key stays taken while its row runs.
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.claim(ARRAY['dedupe'], 'dedupe-worker', '1 minute', 10)
        WHERE name = 'dup_job'
    ),
    1,
    'The keyed row should be claimable (setup for the next tests)'
);

INSERT INTO answer
SELECT
    'dup3' AS tag,
    e.*
FROM x_jobs.enqueue('dup_job', queue => 'dedupe', idempotency_key => 'dup') AS e;

SELECT results_eq(
    $$ SELECT a.id, a.run_id, a.deduped FROM answer AS a WHERE a.tag = 'dup3' $$,
    $$ SELECT a.id, a.run_id, TRUE FROM answer AS a WHERE a.tag = 'dup1' $$,
    'An enqueue under the key of a running row should still dedupe to it'
);

-- Once the row is done, the key is free again.
SELECT ok(
    x_jobs.complete((
        SELECT a.id FROM answer AS a
        WHERE a.tag = 'dup1'
    ), 'dedupe-worker'),
    'The worker holding the keyed row should complete it (setup for the next tests)'
);

INSERT INTO answer
SELECT
    'dup4' AS tag,
    e.*
FROM x_jobs.enqueue('dup_job', queue => 'dedupe', idempotency_key => 'dup') AS e;

SELECT ok(
    (
        SELECT a.deduped = FALSE AND a.id <> d.id AND a.run_id <> d.run_id
        FROM answer AS a, answer AS d
        WHERE a.tag = 'dup4' AND d.tag = 'dup1'
    ),
    'After the keyed row is done, the same key should make a new row with a new id and run_id'
);

SELECT results_eq(
    $$ SELECT j.state::text FROM x_jobs.job AS j WHERE j.idempotency_key = 'dup' ORDER BY j.id $$,
    $$ VALUES ('done'), ('ready') $$,
    'The key should then be held by the done row and the new ready row'
);

-- A cancelled row frees its key too.
INSERT INTO answer
SELECT
    'cancel1' AS tag,
    e.*
FROM x_jobs.enqueue('cancel_key_job', idempotency_key => 'cancel-key') AS e;
SELECT ok(
    x_jobs.cancel((
        SELECT a.id FROM answer AS a
        WHERE a.tag = 'cancel1'
    )),
    'A live keyed row should be cancellable (setup for the next test)'
);
INSERT INTO answer
SELECT
    'cancel2' AS tag,
    e.*
FROM x_jobs.enqueue('cancel_key_job', idempotency_key => 'cancel-key') AS e;

SELECT ok(
    (
        SELECT a.deduped = FALSE AND a.id <> c.id
        FROM answer AS a, answer AS c
        WHERE a.tag = 'cancel2' AND c.tag = 'cancel1'
    ),
    'After the keyed row is cancelled, the same key should make a new row'
);

-- Refusals: name (XJ001) ---------------------------------------------------------------------------

SELECT throws_ok(
    $$ SELECT x_jobs.enqueue(NULL) $$,
    'XJ001', 'X_NAME_INVALID: job name NULL is not a name',
    'A job without a name should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('') $$,
    'XJ001', 'X_NAME_INVALID: job name '''' is not a name',
    'A job with an empty name should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue(repeat('n', 201)) $$,
    'XJ001', 'X_NAME_INVALID: job name ''' || repeat('n', 201) || ''' is not a name',
    'A job name of 201 characters should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue(repeat('n', 200)), x_jobs.enqueue(repeat('é', 200)) $$,
    'A job name of 200 characters should be accepted, multibyte characters counting as one'
);

-- queue (XJ002)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('q_job', queue => '') $$,
    'XJ002', 'X_QUEUE_INVALID: queue '''' is not a queue name',
    'An empty queue name should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('q_job', queue => repeat('q', 201)) $$,
    'XJ002', 'X_QUEUE_INVALID: queue ''' || repeat('q', 201) || ''' is not a queue name',
    'A queue name of 201 characters should be refused'
);

-- input (XJ003)
SET LOCAL "x_jobs.max_payload_bytes" = 100;
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 200))) $$,
    'XJ003',
    pg_catalog.format(
        'X_PAYLOAD_TOO_LARGE: input of %s bytes exceeds the limit of 100',
        pg_catalog.pg_column_size(jsonb_build_object('x', repeat('a', 200)))
    ),
    'An input larger than x_jobs.max_payload_bytes should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('small_job', jsonb_build_object('x', repeat('a', 50))) $$,
    'An input under x_jobs.max_payload_bytes should be accepted'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';
SELECT throws_like(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 1048576))) $$,
    'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 1048576',
    'Without x_jobs.max_payload_bytes, an input over 1 MiB should be refused'
);

-- A session may lower the limit, not raise it (0.3.6): enqueue runs as its owner, and any role
-- can set a custom setting. ALTER DATABASE and ALTER ROLE raise it (rolled back with the test).
SET LOCAL "x_jobs.max_payload_bytes" = 2147483647;
SELECT throws_like(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 2000000))) $$,
    'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 1048576',
    'A session that sets x_jobs.max_payload_bytes higher should still be held to 1 MiB'
);
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER DATABASE %I SET "x_jobs.max_payload_bytes" = 4194304', pg_catalog.current_database()
    );
END
$$;
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 2000000))) $$,
    'A limit raised by ALTER DATABASE should hold (the session''s higher value capped by it)'
);
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER ROLE %I IN DATABASE %I SET "x_jobs.max_payload_bytes" = 3000000',
        current_user, pg_catalog.current_database()
    );
END
$$;
SELECT throws_like(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 3500000))) $$,
    'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 3000000',
    'A limit set for the role in this database should take precedence over the database''s'
);
SET LOCAL "x_jobs.max_payload_bytes" = 2500000;
SELECT throws_like(
    $$ SELECT x_jobs.enqueue('big_job', jsonb_build_object('x', repeat('a', 2600000))) $$,
    'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 2500000',
    'A session should still be able to lower the limit below the configured one'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';

-- max_attempts (XJ004)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('attempts_job', max_attempts => 0) $$,
    'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts 0 is below 1',
    'max_attempts 0 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('attempts_job', max_attempts => -3) $$,
    'XJ004', 'X_MAX_ATTEMPTS_INVALID: max_attempts -3 is below 1',
    'A negative max_attempts should be refused'
);

-- priority (XJ005)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('prio_job', priority => 40000) $$,
    'XJ005', 'X_PRIORITY_INVALID: priority 40000 is out of range',
    'A priority above 32767 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('prio_job', priority => -32769) $$,
    'XJ005', 'X_PRIORITY_INVALID: priority -32769 is out of range',
    'A priority below -32768 should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('prio_job', priority => 32767), x_jobs.enqueue('prio_job', priority => -32768) $$,
    'The priorities -32768 and 32767 should be accepted'
);

-- tenant_id (XJ006)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('tenant_job', tenant_id => '') $$,
    'XJ006', 'X_TENANT_INVALID: tenant_id '''' is empty',
    'An empty tenant_id should be refused'
);

-- concurrency (XJ007)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('conc_job', concurrency_key => 'k', concurrency_limit => 0) $$,
    'XJ007', 'X_CONCURRENCY_INVALID: concurrency limit 0 with key ''k'' is not a limit',
    'A concurrency limit of 0 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('conc_job', concurrency_limit => 2) $$,
    'XJ007', 'X_CONCURRENCY_INVALID: concurrency limit 2 with key NULL is not a limit',
    'A concurrency limit without a key should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('conc_job', concurrency_key => '') $$,
    'XJ007', 'X_CONCURRENCY_INVALID: concurrency limit NULL with key '''' is not a limit',
    'An empty concurrency key should be refused'
);

-- backoff (XJ008)
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('backoff_job', backoff_base => '10 seconds', backoff_max => '5 seconds') $$,
    'XJ008', 'X_BACKOFF_INVALID: backoff from 00:00:10 to 00:00:05 is not a range',
    'A backoff_base above backoff_max should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('backoff_job', backoff_base => '-1 second') $$,
    'XJ008', 'X_BACKOFF_INVALID: backoff from -00:00:01 to 01:00:00 is not a range',
    'A negative backoff_base should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('backoff_job', backoff_base => '0 seconds', backoff_max => '-1 second') $$,
    'XJ008', 'X_BACKOFF_INVALID: backoff from 00:00:00 to -00:00:01 is not a range',
    'A negative backoff_max should be refused'
);
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('backoff_job', backoff_base => '0 seconds', backoff_max => '0 seconds') $$,
    'A backoff of zero to zero (retry at once) should be accepted'
);
-- NULL means the default (1 second): with a max below it, the row would hold base > max, which
-- XJ008 exists to refuse. Either refusing or keeping base <= max honours the contract.
CREATE TEMP TABLE backoff_default AS
SELECT c.*
FROM tap_helpers.caught($$
    SELECT x_jobs.enqueue('backoff_default_job', backoff_base => NULL, backoff_max => '500 milliseconds')
$$) AS c;
SELECT ok(
    EXISTS (
        SELECT FROM backoff_default AS c
        WHERE c.err_state = 'XJ008'
    )
    OR coalesce(
        (
            SELECT j.backoff_base <= j.backoff_max FROM x_jobs.job AS j
            WHERE j.name = 'backoff_default_job'
        ), FALSE
    ),
    'A backoff_max below the default backoff_base should be refused, not stored as base above max'
);
SELECT diag(pg_catalog.format('    stored: backoff_base %s, backoff_max %s', j.backoff_base, j.backoff_max))
FROM x_jobs.job AS j
WHERE j.name = 'backoff_default_job';

-- run_at (XJ039): the years 1 to 9999 in UTC, what clients' date types can hold; an infinite
-- one would never come due, or sort first forever. The session's zone is UTC in pg_prove.
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('when_job', run_at => 'infinity') $$,
    'XJ039', 'X_TIME_INVALID: run_at infinity is not a time a job can be due',
    'An infinite run_at should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('when_job', run_at => '-infinity') $$,
    'XJ039', 'X_TIME_INVALID: run_at -infinity is not a time a job can be due',
    'A run_at of -infinity should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('when_job', run_at => '10000-01-01 00:00:00+00') $$,
    'XJ039', NULL,
    'A run_at past the year 9999 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('when_job', run_at => '0001-01-01 00:00:00+00'::timestamptz - interval '1 second') $$,
    'XJ039', NULL,
    'A run_at before the year 1 should be refused'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue_many('[{"name": "when_job"}, {"name": "when_job", "run_at": "infinity"}]') $$,
    'XJ039', 'X_TIME_INVALID: run_at infinity is not a time a job can be due',
    'enqueue_many should refuse an infinite run_at too'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE name = 'when_job'
    ),
    0,
    'A refused batch should leave no row, not even of its valid requests'
);
CREATE TEMP TABLE when_edges AS
SELECT e.id FROM x_jobs.enqueue('when_job', run_at => '9999-12-31 23:59:59.999999+00') AS e;
INSERT INTO when_edges SELECT e.id FROM x_jobs.enqueue('when_job', run_at => '0001-01-01 00:00:00+00') AS e;
SELECT results_eq(
    $$
    SELECT j.state::text, j.run_at FROM x_jobs.job AS j
    INNER JOIN when_edges AS w ON j.id = w.id
    ORDER BY j.id
    $$,
    $$ VALUES ('delayed', '9999-12-31 23:59:59.999999+00'::timestamptz), ('ready', '0001-01-01 00:00:00+00') $$,
    'The first and last instants of the years 1 to 9999 should be accepted as they are'
);
SELECT results_eq(
    $$
    SELECT c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$
        SELECT x_jobs.enqueue_many('[{"name": "a"}, {"name": "when_job", "run_at": "infinity"}]')
    $q$) AS c
    $$,
    $$ VALUES ('In request 2 (job ''when_job'').',
               'Pass a time in the years 1 to 9999 (UTC), or leave run_at out to run it now.') $$,
    'The refusal should name the request and the job, and say which times work'
);

-- Texts the payload limit does not count (0.3.8) --------------------------------------------------
-- The keys are in btree indexes: 6,400 incompressible characters failed the insert with a bare
-- 54000 ("index row size ... exceeds btree version 4 maximum 2704"). The other texts were
-- unbounded (5 MB each were stored). The message shows the first 64 characters and the length.

CREATE TEMP TABLE long_text AS
SELECT string_agg(md5(g.i::text), '' ORDER BY g.i) AS v FROM generate_series(1, 200) AS g (i);

SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT x_jobs.enqueue('long_job', idempotency_key => (SELECT v FROM long_text))
    $q$) AS c
    $$,
    $$
    VALUES ('XJ009',
            'X_JOBS_INVALID: idempotency key ''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
            'is 6400 characters, longer than 400',
            'In request 1 (job ''long_job'').',
            'Use a key of up to 400 characters, such as the id of what the job acts on: hash a longer one.')
    $$,
    'An idempotency key of 6,400 characters should be refused with X_JOBS_INVALID, its length and a HINT'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT x_jobs.enqueue_many('[{"name": "blank_key_a"}, {"name": "blank_key_b", "idempotency_key": ""}]')
    $q$) AS c
    $$,
    $$
    VALUES ('XJ009',
            'X_JOBS_INVALID: idempotency key '''' is empty',
            'In request 2 (job ''blank_key_b'').',
            'Pass a key that names what the job acts on, such as an order id, or leave it out (NULL) for no '
            'deduplication.')
    $$,
    'An empty idempotency key should be refused with X_JOBS_INVALID (it made every such job a duplicate of the first)'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE name LIKE 'blank\_key\_%'
    ),
    0,
    'A batch with an empty idempotency key should enqueue none of its jobs'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT x_jobs.enqueue('long_job', concurrency_key => (SELECT v FROM long_text))
    $q$) AS c
    $$,
    $$
    VALUES ('XJ007',
            'X_CONCURRENCY_INVALID: concurrency key '
            '''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
            'is 6400 characters, longer than 400',
            'In request 1 (job ''long_job'').',
            'Key the limit with a short text such as a customer id (up to 400 characters): hash a longer one.')
    $$,
    'A concurrency key of 6,400 characters should be refused with X_CONCURRENCY_INVALID, its length and a HINT'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('long_job', tenant_id => repeat('t', 201)) $q$) AS c
    $$,
    $$
    VALUES ('XJ006',
            'X_TENANT_INVALID: tenant_id ''' || repeat('t', 64) || '''... is 201 characters, longer than 200',
            'In request 1 (job ''long_job'').',
            'Name the tenant in 1 to 200 characters, or leave tenant_id out for ''none''.')
    $$,
    'A tenant_id of 201 characters should be refused with X_TENANT_INVALID, its length and a HINT'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('long_job', traceparent => repeat('0', 513)) $q$) AS c
    $$,
    $$
    VALUES ('XJ009',
            'X_JOBS_INVALID: traceparent ''' || repeat('0', 64) || '''... is 513 characters, longer than 512',
            'In request 1 (job ''long_job'').',
            'Pass the W3C traceparent of the enqueuing span (55 characters), or leave it out.')
    $$,
    'A traceparent of 513 characters should be refused with X_JOBS_INVALID, its length and a HINT'
);
SELECT results_eq(
    $$
    SELECT c.* FROM tap_helpers.caught($q$
        SELECT x_jobs.enqueue('long_job', enqueued_by => repeat('e', 5000000))
    $q$) AS c
    $$,
    $$
    VALUES ('XJ009',
            'X_JOBS_INVALID: enqueued_by ''' || repeat('e', 64) || '''... is 5000000 characters, longer than 200',
            'In request 1 (job ''long_job'').',
            'Name who enqueued the job in up to 200 characters, such as a service or user, or leave it out.')
    $$,
    'An enqueued_by of 5,000,000 characters should be refused with X_JOBS_INVALID, its length and a HINT'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue_many(jsonb_build_array(
        jsonb_build_object('name', 'long_job'),
        jsonb_build_object('name', 'long_job', 'idempotency_key', (SELECT v FROM long_text))
    )) $$,
    'XJ009',
    'X_JOBS_INVALID: idempotency key ''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... '
    'is 6400 characters, longer than 400',
    'enqueue_many should refuse an idempotency key of 6,400 characters too'
);
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue_many(jsonb_build_array(
        jsonb_build_object('name', 'long_job', 'concurrency_key', (SELECT v FROM long_text))
    )) $$,
    'XJ007',
    'X_CONCURRENCY_INVALID: concurrency key '
    '''c4ca4238a0b923820dcc509a6f75849bc81e728d9d4c2f636f067f89cc14862c''... is 6400 characters, longer than 400',
    'enqueue_many should refuse a concurrency key of 6,400 characters too'
);
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE name = 'long_job'
    ),
    0,
    'No refused request should leave a row'
);
-- At the bounds, in characters: four-byte ones take the keys to 1,600 bytes, within an index entry.
SELECT lives_ok(
    $$
    SELECT x_jobs.enqueue('long_job', idempotency_key => repeat('🔑', 400), concurrency_key => repeat('🔑', 400),
        tenant_id => repeat('é', 200), traceparent => repeat('0', 512), enqueued_by => repeat('é', 200))
    $$,
    'Keys of 400 four-byte characters, a traceparent of 512 and a tenant_id and enqueued_by of 200 should be accepted'
);

-- x_jobs.max_payload_bytes that is no number of bytes (XJ040, 0.3.8): a bare cast error
-- (22P02, 22003) failed every enqueue, and -5 was taken as a limit.
SET LOCAL "x_jobs.max_payload_bytes" = 'abc';
SELECT results_eq(
    $$ SELECT c.* FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('setting_job') $q$) AS c $$,
    $$
    VALUES ('XJ040',
            'X_SETTING_INVALID: x_jobs.max_payload_bytes ''abc'' is not a whole number of bytes from 1 to 2147483647',
            'As this session reads it (SET, ALTER ROLE, ALTER DATABASE or postgresql.conf).',
            'Set it to a number of bytes without a unit, such as 4194304 for 4 MiB, or RESET it for the default of '
            '1 MiB (1048576).')
    $$,
    'An enqueue under a max_payload_bytes of ''abc'' should be refused with X_SETTING_INVALID, a DETAIL and a HINT'
);
SET LOCAL "x_jobs.max_payload_bytes" = '4MB';
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('setting_job') $$,
    'XJ040',
    'X_SETTING_INVALID: x_jobs.max_payload_bytes ''4MB'' is not a whole number of bytes from 1 to 2147483647',
    'A max_payload_bytes with a unit should be refused'
);
SET LOCAL "x_jobs.max_payload_bytes" = '99999999999';
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('setting_job') $$,
    'XJ040',
    'X_SETTING_INVALID: x_jobs.max_payload_bytes ''99999999999'' is not a whole number of bytes from 1 to 2147483647',
    'A max_payload_bytes past the integer range should be refused'
);
SET LOCAL "x_jobs.max_payload_bytes" = '-5';
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('setting_job') $$,
    'XJ040',
    'X_SETTING_INVALID: x_jobs.max_payload_bytes ''-5'' is not a whole number of bytes from 1 to 2147483647',
    'A negative max_payload_bytes should be refused, not taken as a limit'
);
SET LOCAL "x_jobs.max_payload_bytes" = '0';
SELECT throws_ok(
    $$ SELECT x_jobs.enqueue('setting_job') $$,
    'XJ040',
    'X_SETTING_INVALID: x_jobs.max_payload_bytes ''0'' is not a whole number of bytes from 1 to 2147483647',
    'A max_payload_bytes of 0 should be refused'
);
SET LOCAL "x_jobs.max_payload_bytes" = ' 100 ';
SELECT throws_like(
    $$ SELECT x_jobs.enqueue('setting_job', jsonb_build_object('x', repeat('a', 200))) $$,
    'X_PAYLOAD_TOO_LARGE: input of % bytes exceeds the limit of 100',
    'A max_payload_bytes of digits between spaces should still be a limit, as the cast took it'
);
-- A value of the catalog is checked as the session's is: read when the session's is above 1 MiB
-- (the role's in this database, set above, is the one that counts).
SET LOCAL "x_jobs.max_payload_bytes" = 2000000;
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER ROLE %I IN DATABASE %I SET "x_jobs.max_payload_bytes" = ''2 MB''',
        current_user, pg_catalog.current_database()
    );
END
$$;
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message, c.err_detail
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('setting_job') $q$) AS c
    $$,
    $$
    VALUES ('XJ040',
            'X_SETTING_INVALID: x_jobs.max_payload_bytes ''2 MB'' is not a whole number of bytes from 1 to 2147483647',
            'Set by ALTER ROLE, which holds a session''s value above 1 MiB to it.')
    $$,
    'A malformed max_payload_bytes set by ALTER ROLE should be refused, naming it and where it was set'
);
DO $$
BEGIN
    EXECUTE pg_catalog.format(
        'ALTER ROLE %I IN DATABASE %I RESET "x_jobs.max_payload_bytes"', current_user, pg_catalog.current_database()
    );
END
$$;
SET LOCAL "x_jobs.max_payload_bytes" = '';
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE name = 'setting_job'
    ),
    0,
    'No enqueue under a malformed max_payload_bytes should leave a row'
);

-- Details and hints --------------------------------------------------------------------------------
-- Every refusal: a message starting with the X_ code x_jobs.error_codes() lists for its SQLSTATE,
-- a DETAIL naming the request (and job), and a HINT saying what to do.

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('') $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ001', TRUE, 'In request 1.',
            'Give every job a name of 1 to 200 characters, such as ''send_email''.')
    $$,
    'A refused name should carry its X_ code, the request in DETAIL and a HINT'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', queue => '') $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ002', TRUE, 'In request 1.',
            'Use a queue name of 1 to 200 characters, or leave it out for ''default''.')
    $$,
    'A refused queue should carry its X_ code, the request in DETAIL and a HINT'
);

SET LOCAL "x_jobs.max_payload_bytes" = 100;
SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', jsonb_build_object('x', repeat('a', 200))) $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ003', TRUE, 'In request 1 (job ''hint_job'').',
            'Store large data elsewhere and pass a reference, or raise x_jobs.max_payload_bytes.')
    $$,
    'A refused input should carry its X_ code, the request and job in DETAIL and a HINT'
);
SET LOCAL "x_jobs.max_payload_bytes" = '';

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', max_attempts => 0) $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ004', TRUE, 'In request 1 (job ''hint_job'').',
            'Pass max_attempts => 1 for a job that must not be retried, or more to retry it.')
    $$,
    'A refused max_attempts should carry its X_ code, the request and job in DETAIL and a HINT'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', priority => 40000) $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ005', TRUE, 'In request 1 (job ''hint_job'').',
            'Use a priority between -32768 and 32767; lower runs first, 0 is the default.')
    $$,
    'A refused priority should carry its X_ code, the request and job in DETAIL and a HINT'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', tenant_id => '') $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ006', TRUE, 'In request 1 (job ''hint_job'').',
            'Name the tenant the job acts for, or leave tenant_id out for ''none''.')
    $$,
    'A refused tenant_id should carry its X_ code, the request and job in DETAIL and a HINT'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', concurrency_limit => 2) $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ007', TRUE, 'In request 1 (job ''hint_job'').',
            'Pass a non-empty concurrency_key, and a concurrency_limit of 1 or more (default 1).')
    $$,
    'A refused concurrency limit should carry its X_ code, the request and job in DETAIL and a HINT'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_message LIKE e.code || ': %', c.err_detail, c.err_hint
    FROM tap_helpers.caught($q$ SELECT x_jobs.enqueue('hint_job', backoff_base => '-1 second') $q$) AS c
    LEFT JOIN x_jobs.error_codes() AS e ON c.err_state = e.sqlstate
    $$,
    $$
    VALUES ('XJ008', TRUE, 'In request 1 (job ''hint_job'').',
            'Pass backoff_base and backoff_max of zero or more, base not above max (they default to 1 second and 1 hour).')
    $$,
    'A refused backoff should carry its X_ code, the request and job in DETAIL and a HINT'
);

SELECT * FROM finish();
ROLLBACK;
