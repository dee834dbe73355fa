-- x_jobs.claim: which rows it hands out and in what order, what a claimed row holds, paused
-- queues, lapsed leases (reclaimed, or buried on the final attempt), concurrency keys, and every
-- refusal. Each scenario uses queues (and concurrency keys) of its own, so that no scenario sees
-- another's rows; time is moved with x_jobs.fake_now.

-- The isolation check needs a transaction whose isolation is set before its first query, which
-- the test transaction below cannot be (it must be READ COMMITTED for every other claim). So it
-- runs first, in two short transactions of its own that change no shared row (claim refuses
-- before it reads anything, and pg_temp.caught rolls its call back): what they caught is kept
-- in a temporary table, private to this session, and asserted inside the test transaction.
-- default_transaction_isolation sets their level (sqlfluff cannot parse BEGIN ISOLATION LEVEL).

SET default_transaction_isolation = 'repeatable read';
BEGIN;

CREATE TEMP TABLE isolation_refusal AS
SELECT
    'repeatable read' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.claim(ARRAY['isolation'], 'isolation-worker') $$) AS c;
COMMIT;

SET default_transaction_isolation = 'serializable';
BEGIN;
INSERT INTO isolation_refusal
SELECT
    'serializable' AS iso_level,
    c.*
FROM tap_helpers.caught($$ SELECT * FROM x_jobs.claim(ARRAY['isolation'], 'isolation-worker') $$) AS c;
COMMIT;

RESET default_transaction_isolation;
BEGIN;
SELECT plan(77);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- Claims one job at a time, `times` times, and answers the names of the rows handed out in
-- order (NULL for a call that handed out nothing).
CREATE FUNCTION pg_temp.claim_one_by_one(p_queues text[], p_worker text, p_times integer)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_names text[] := '{}';
    v_name text;
BEGIN
    FOR i IN 1..p_times LOOP
        SELECT c.name INTO v_name
        FROM x_jobs.claim(p_queues, p_worker, '1 minute', 1) AS c
        WHERE c.state = 'running';
        v_names := v_names || v_name;
    END LOOP;
    RETURN v_names;
END
$$;

-- Enqueues the ordering fixture into a queue at 12:00: ready rows of several priorities and
-- run_ats (enqueued so that id order differs from claim order), a delayed row of the lowest
-- priority due at 12:00:10, and a row not due before 13:00.
CREATE FUNCTION pg_temp.seed_order(p_queue text)
RETURNS void
LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM x_jobs.enqueue('a', queue => p_queue, priority => 0, run_at => '2030-01-01 11:50:00+00');
    PERFORM x_jobs.enqueue('b', queue => p_queue, priority => -1, run_at => '2030-01-01 11:59:00+00');
    PERFORM x_jobs.enqueue('c', queue => p_queue, priority => 0, run_at => '2030-01-01 11:40:00+00');
    PERFORM x_jobs.enqueue('d', queue => p_queue, priority => 0, run_at => '2030-01-01 11:40:00+00');
    PERFORM x_jobs.enqueue('e', queue => p_queue, priority => 5, run_at => '2030-01-01 10:20:00+00');
    PERFORM x_jobs.enqueue('f', queue => p_queue, priority => -5, run_at => '2030-01-01 12:00:10+00');
    PERFORM x_jobs.enqueue('g', queue => p_queue, priority => -9, run_at => '2030-01-01 13:00:00+00');
END
$$;

-- Order: priority, then run_at, then id ------------------------------------------------------

DO $$
BEGIN
    PERFORM pg_temp.seed_order('order-one');
    PERFORM pg_temp.seed_order('order-many');
END
$$;
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:20+00';

SELECT is(
    pg_temp.claim_one_by_one(ARRAY['order-one'], 'order-worker', 7),
    ARRAY['f', 'b', 'c', 'd', 'a', 'e', NULL],
    'One at a time, claims should take lower priority first, then earlier run_at, then lower id, and skip rows not due'
);

SELECT results_eq(
    $$ SELECT c.name, c.state::text FROM x_jobs.claim(ARRAY['order-many'], 'order-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('f', 'running'), ('b', 'running'), ('c', 'running'), ('d', 'running'), ('a', 'running'),
              ('e', 'running') $$,
    'One claim of many should hand out every due row and answer them in claim order'
);

-- What a claimed row holds ---------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE fields_job AS SELECT e.* FROM x_jobs.enqueue('fields_job', queue => 'fields') AS e;
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:05:00+00';
CREATE TEMP TABLE fields_claim AS SELECT c.* FROM x_jobs.claim(ARRAY['fields'], 'fields-worker', '45 seconds', 5) AS c;

SELECT results_eq(
    $$
    SELECT c.id, c.run_id, c.state::text, c.attempt, c.claims, c.claimed_by, c.visible_at, c.started_at, c.updated_at
    FROM fields_claim AS c
    $$,
    $$
    SELECT f.id, f.run_id, 'running', 1, 1, 'fields-worker', timestamptz '2030-01-01 12:05:45+00',
           timestamptz '2030-01-01 12:05:00+00', timestamptz '2030-01-01 12:05:00+00'
    FROM fields_job AS f
    $$,
    'A claimed row should be running, on attempt 1, held by the worker until now + lease, started now'
);

SELECT results_eq(
    $$
    SELECT j.state::text, j.attempt, j.claims, j.claimed_by, j.visible_at, j.started_at, j.finished_at
    FROM x_jobs.job AS j WHERE j.name = 'fields_job'
    $$,
    $$
    VALUES ('running', 1, 1, 'fields-worker', timestamptz '2030-01-01 12:05:45+00',
            timestamptz '2030-01-01 12:05:00+00', NULL::timestamptz)
    $$,
    'The claim should be stored on the row as it answered it'
);

SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['fields'], 'other-worker', '45 seconds', 5) $$,
    'A row whose lease runs should not be handed to another worker'
);

-- qty ------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
DO $$
BEGIN
    PERFORM x_jobs.enqueue('qty_job', queue => 'qty') FROM generate_series(1, 5);
END
$$;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['qty'], 'qty-worker', '1 minute', 3)),
    3,
    'A claim should hand out no more than qty rows'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['qty'], 'qty-worker', '1 minute', 10)),
    2,
    'A claim of more than is due should hand out what is due'
);
SELECT lives_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['qty'], 'qty-worker', '1 minute', 1000) $$,
    'qty 1000 should be accepted'
);

-- Delayed rows ------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE delayed_job AS
SELECT e.* FROM x_jobs.enqueue('delayed_job', queue => 'delayed', run_at => '2030-01-01 13:00:00+00') AS e;

SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['delayed'], 'delay-worker', '1 minute', 10) $$,
    'A delayed row should not be claimed before its run_at'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:59:59+00';
SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['delayed'], 'delay-worker', '1 minute', 10) $$,
    'A delayed row should not be claimed a second before its run_at'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 13:00:00+00';
SELECT results_eq(
    $$
    SELECT c.id, c.state::text, c.attempt
    FROM x_jobs.claim(ARRAY['delayed'], 'delay-worker', '1 minute', 10) AS c
    $$,
    $$ SELECT d.id, 'running', 1 FROM delayed_job AS d $$,
    'A delayed row should be claimed once its run_at has come'
);

-- Suspended rows ---------------------------------------------------------------------------------
-- Nothing in 0.1.0 suspends a row yet, so the test sets the state itself.

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE suspended_job AS
SELECT
    'due' AS tag,
    e.*
FROM x_jobs.enqueue('suspended_due', queue => 'suspended') AS e
UNION ALL
SELECT
    'later' AS tag,
    e.*
FROM x_jobs.enqueue('suspended_later', queue => 'suspended') AS e;
UPDATE x_jobs.job AS j
SET
    state = 'suspended',
    run_at = CASE
        WHEN j.name = 'suspended_due' THEN timestamptz '2030-01-01 11:59:00+00'
        ELSE timestamptz '2030-01-01 14:00:00+00'
    END
WHERE j.queue = 'suspended';

SELECT results_eq(
    $$ SELECT c.name, c.state::text FROM x_jobs.claim(ARRAY['suspended'], 'suspend-worker', '1 day', 10) AS c $$,
    $$ VALUES ('suspended_due', 'running') $$,
    'A suspended row whose run_at has come should be claimed, and one not yet due should not'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 14:00:00+00';
SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['suspended'], 'suspend-worker', '1 day', 10) AS c $$,
    $$ VALUES ('suspended_later') $$,
    'A suspended row should be claimed once its run_at comes'
);

-- Paused queues -------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE paused_job AS
SELECT e.* FROM x_jobs.enqueue('paused_job', queue => 'paused') AS e;
CREATE TEMP TABLE open_job AS
SELECT e.* FROM x_jobs.enqueue('open_job', queue => 'open') AS e;

SELECT ok(x_jobs.pause_queue('paused'), 'pause_queue should pause the queue (setup)');

SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['paused'], 'pause-worker', '1 minute', 10) $$,
    'A paused queue should not be claimed'
);

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['paused', 'open'], 'pause-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('open_job') $$,
    'A claim over a paused and an open queue should take only the open queue''s rows'
);

SELECT ok(x_jobs.resume_queue('paused'), 'resume_queue should resume the queue (setup)');

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['paused'], 'pause-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('paused_job') $$,
    'A resumed queue should be claimed again'
);

-- Several queues, and a queue named twice ---------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE multi_job AS
SELECT e.* FROM x_jobs.enqueue('multi_a', queue => 'multi-a', priority => 1) AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('multi_b', queue => 'multi-b', priority => 0) AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('multi_c', queue => 'multi-c', priority => -1) AS e;

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['multi-a', 'multi-b'], 'multi-worker', '1 minute', 1) AS c $$,
    $$ VALUES ('multi_b') $$,
    'A claim over several queues should take the best row of all of them by priority'
);

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['multi-a', 'multi-b'], 'multi-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('multi_a') $$,
    'A claim over several queues should take from each of them, and from no other queue'
);

-- It locks what it takes, not up to qty rows in every queue (the outer LIMIT keeping qty of
-- them): a ready row it locked and left would stay locked, passed over by every other claimer,
-- until its transaction ends, and each lock is written to the WAL.
CREATE TEMP TABLE locks_job AS
SELECT e.* FROM x_jobs.enqueue_many((
    SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object('name', 'locks', 'queue', 'locks-' || g % 5))
    FROM generate_series(1, 100) AS g
)) AS e;

SELECT results_eq(
    $$
    SELECT count(*)::integer
    FROM x_jobs.claim(ARRAY['locks-0', 'locks-1', 'locks-2', 'locks-3', 'locks-4'], 'locks-worker', '1 minute', 10)
    $$,
    $$ VALUES (10) $$,
    'A claim over five queues of 20 rows each should take 10'
);

SELECT results_eq(
    $$
    SELECT count(*)::integer FROM x_jobs.job AS j
    WHERE j.name = 'locks' AND j.state = 'ready' AND j.xmax = pg_current_xact_id()::xid
    $$,
    $$ VALUES (0) $$,
    'A claim over several queues should lock no ready row it did not take (it locked qty in each queue)'
);

CREATE TEMP TABLE twice_job AS
SELECT e.* FROM x_jobs.enqueue('twice_1', queue => 'twice') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('twice_2', queue => 'twice') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('twice_3', queue => 'twice') AS e;

SELECT results_eq(
    $$
    SELECT c.name, c.attempt, c.claims
    FROM x_jobs.claim(ARRAY['twice', 'twice'], 'twice-worker', '1 minute', 3) AS c ORDER BY c.name
    $$,
    $$ VALUES ('twice_1', 1, 1), ('twice_2', 1, 1), ('twice_3', 1, 1) $$,
    'A queue named twice should not spend slots twice on a row: qty 3 should claim its three rows once each'
);

-- Settled rows are never claimed -------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE settled_job AS
SELECT
    'cancelled' AS tag,
    e.*
FROM x_jobs.enqueue('settled_cancelled', queue => 'settled') AS e
UNION ALL
SELECT
    'done' AS tag,
    e.*
FROM x_jobs.enqueue('settled_done', queue => 'settled', priority => -3) AS e
UNION ALL
SELECT
    'dead' AS tag,
    e.*
FROM x_jobs.enqueue('settled_dead', queue => 'settled', priority => -2) AS e
UNION ALL
SELECT
    'failed' AS tag,
    e.*
FROM x_jobs.enqueue('settled_failed', queue => 'settled', priority => -1, dead_letter => FALSE) AS e;

-- Claims take them by priority: done first, then dead, then failed.
DO $$
DECLARE
    v_id bigint;
BEGIN
    PERFORM x_jobs.cancel(s.id) FROM settled_job AS s WHERE s.tag = 'cancelled';
    SELECT c.id INTO v_id FROM x_jobs.claim(ARRAY['settled'], 'settle-worker', '1 minute', 1) AS c;
    PERFORM x_jobs.complete(v_id, 'settle-worker');
    SELECT c.id INTO v_id FROM x_jobs.claim(ARRAY['settled'], 'settle-worker', '1 minute', 1) AS c;
    PERFORM x_jobs.fail(v_id, 'settle-worker', 'boom', retryable => FALSE);
    SELECT c.id INTO v_id FROM x_jobs.claim(ARRAY['settled'], 'settle-worker', '1 minute', 1) AS c;
    PERFORM x_jobs.fail(v_id, 'settle-worker', 'boom', retryable => FALSE);
END
$$;

SELECT results_eq(
    $$ SELECT s.tag, j.state::text FROM settled_job AS s JOIN x_jobs.job AS j ON s.id = j.id ORDER BY j.id $$,
    $$ VALUES ('cancelled', 'cancelled'), ('done', 'done'), ('dead', 'dead'), ('failed', 'failed') $$,
    'Setup: one row cancelled, one done, one dead and one failed'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-02 12:00:00+00';
SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['settled'], 'settle-worker', '1 minute', 10) $$,
    'Cancelled, done, dead and failed rows should never be claimed, however late'
);

-- A lapsed lease is reclaimed ---------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE lapse_job AS SELECT e.* FROM x_jobs.enqueue('lapse_job', queue => 'lapse', max_attempts => 3) AS e;
SELECT is(
    (SELECT c.id FROM x_jobs.claim(ARRAY['lapse'], 'lapse-worker-1', '30 seconds', 1) AS c),
    (SELECT l.id FROM lapse_job AS l),
    'The first worker should claim the row (setup)'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:29+00';
SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['lapse'], 'lapse-worker-2', '30 seconds', 1) $$,
    'A row whose lease has not run out should not be reclaimed'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:31+00';
CREATE TEMP TABLE lapse_claim AS SELECT c.* FROM x_jobs.claim(ARRAY['lapse'], 'lapse-worker-2', '30 seconds', 1) AS c;

SELECT results_eq(
    $$
    SELECT c.id, c.state::text, c.attempt, c.claims, c.claimed_by, c.visible_at, c.started_at
    FROM lapse_claim AS c
    $$,
    $$
    SELECT l.id, 'running', 2, 2, 'lapse-worker-2', timestamptz '2030-01-01 12:01:01+00',
           timestamptz '2030-01-01 12:00:31+00'
    FROM lapse_job AS l
    $$,
    'A lapsed lease should be reclaimed by another worker, as the next attempt'
);

SELECT results_eq(
    $$
    SELECT e.attempt, e.failed_at, e.worker, e.error
    FROM x_jobs.job_error AS e JOIN lapse_job AS l ON e.job_id = l.id
    $$,
    $$
    VALUES (1, timestamptz '2030-01-01 12:00:31+00', 'lapse-worker-1',
            'lease lapsed: the worker stopped heartbeating before it settled the job')
    $$,
    'The lapsed attempt should be recorded in job_error with the worker that lost it'
);

SELECT is(
    x_jobs.complete((SELECT l.id FROM lapse_job AS l), 'lapse-worker-1'),
    FALSE,
    'The worker that lost the lease should no longer be able to complete the row'
);
SELECT is(
    x_jobs.complete((SELECT l.id FROM lapse_job AS l), 'lapse-worker-2'),
    TRUE,
    'The worker that reclaimed the row should be able to complete it'
);

-- A lapsed lease on the final attempt is buried ----------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE bury_job AS
SELECT
    'dead' AS tag,
    e.*
FROM x_jobs.enqueue('bury_dead_job', queue => 'bury-dead', max_attempts => 1) AS e
UNION ALL
SELECT
    'failed' AS tag,
    e.*
FROM x_jobs.enqueue('bury_failed_job', queue => 'bury-failed', max_attempts => 1, dead_letter => FALSE) AS e;

SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['bury-dead', 'bury-failed'], 'bury-worker-1', '30 seconds', 2)),
    2,
    'Both final-attempt rows should be claimed (setup)'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
CREATE TEMP TABLE bury_claim AS
SELECT c.* FROM x_jobs.claim(ARRAY['bury-dead', 'bury-failed'], 'bury-worker-2', '30 seconds', 1) AS c;

SELECT results_eq(
    $$
    SELECT c.name, c.state::text, c.attempt, c.claims, c.claimed_by, c.visible_at, c.finished_at, c.last_error
    FROM bury_claim AS c ORDER BY c.name
    $$,
    $$
    VALUES ('bury_dead_job', 'dead', 1, 1, NULL::text, NULL::timestamptz, timestamptz '2030-01-01 12:01:00+00',
            'lease lapsed on the final attempt'),
           ('bury_failed_job', 'failed', 1, 1, NULL::text, NULL::timestamptz, timestamptz '2030-01-01 12:01:00+00',
            'lease lapsed on the final attempt')
    $$,
    'A lapsed row on its final attempt should be buried, dead or failed by its dead_letter, held by no one, '
    'and answered'
);

SELECT results_eq(
    $$
    SELECT j.name, j.state::text, j.claimed_by
    FROM x_jobs.job AS j WHERE j.queue IN ('bury-dead', 'bury-failed')
    ORDER BY j.name
    $$,
    $$ VALUES ('bury_dead_job', 'dead', NULL::text), ('bury_failed_job', 'failed', NULL::text) $$,
    'The buried rows should be stored as answered'
);

SELECT results_eq(
    $$
    SELECT c.job, sum(c.dead)::integer, sum(c.failed)::integer
    FROM x_jobs.counter AS c
    WHERE c.job IN ('bury_dead_job', 'bury_failed_job') AND c.bucket_start = '2030-01-01 12:01:00+00'
    GROUP BY c.job ORDER BY c.job
    $$,
    $$ VALUES ('bury_dead_job', 1, 0), ('bury_failed_job', 0, 1) $$,
    'A buried row should be counted as dead or failed in the minute it was buried'
);

SELECT results_eq(
    $$
    SELECT e.job_id, e.attempt, e.worker FROM x_jobs.job_error AS e JOIN bury_job AS b ON e.job_id = b.id ORDER BY b.tag
    $$,
    $$ SELECT b.id, 1, 'bury-worker-1' FROM bury_job AS b ORDER BY b.tag $$,
    'The lapsed final attempt should be recorded in job_error too'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-02 12:00:00+00';
SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['bury-dead', 'bury-failed'], 'bury-worker-3', '30 seconds', 10) $$,
    'A buried row should never be handed out again'
);

-- The slot of a buried row is spent on the next due row, in the same call.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE refill_job AS
SELECT
    'old' AS tag,
    e.*
FROM x_jobs.enqueue('refill_old', queue => 'refill', max_attempts => 1, run_at => '2030-01-01 11:00:00+00') AS e;
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['refill'], 'refill-worker-1', '10 seconds', 1) AS c),
    'refill_old',
    'The final-attempt row should be claimed (setup)'
);
INSERT INTO refill_job
SELECT
    'next' AS tag,
    e.*
FROM x_jobs.enqueue('refill_next', queue => 'refill') AS e;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
CREATE TEMP TABLE refill_claim AS
SELECT
    pg_catalog.row_number() OVER () AS pos,
    c.*
FROM x_jobs.claim(ARRAY['refill'], 'refill-worker-2', '30 seconds', 1) AS c;

SELECT set_eq(
    $$ SELECT c.name, c.state::text, c.claimed_by FROM refill_claim AS c $$,
    $$ VALUES ('refill_old', 'dead', NULL::text), ('refill_next', 'running', 'refill-worker-2') $$,
    'A slot spent burying a row should be filled by the next due row in the same call'
);

SELECT results_eq(
    $$ SELECT c.name, c.state::text FROM refill_claim AS c ORDER BY c.pos $$,
    $$ VALUES ('refill_next', 'running'), ('refill_old', 'dead') $$,
    'A claim should answer the rows it claimed first and the rows it buried after them'
);

-- Burying a key's lapsed final attempt frees the key: the same call hands out the key's next row,
-- whatever qty asked (a short pick that buried something is not taken for a drained queue).
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE keyed_refill AS
SELECT e.id FROM x_jobs.enqueue('kr_old', queue => 'kr', concurrency_key => 'kr-key', max_attempts => 1) AS e;
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['kr'], 'kr-worker-1', '10 seconds', 1) AS c),
    'kr_old',
    'The final attempt of a keyed row should be claimed (setup)'
);
INSERT INTO keyed_refill
SELECT e.id FROM x_jobs.enqueue('kr_next', queue => 'kr', concurrency_key => 'kr-key') AS e;
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
SELECT set_eq(
    $$ SELECT c.name, c.state::text FROM x_jobs.claim(ARRAY['kr'], 'kr-worker-2', '30 seconds', 10) AS c $$,
    $$ VALUES ('kr_old', 'dead'), ('kr_next', 'running') $$,
    'A claim of qty 10 that buries a key''s lapsed row should hand out the key''s next row too'
);

-- Concurrency keys ------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
CREATE TEMP TABLE conc_job AS
SELECT
    'k1' AS tag,
    e.*
FROM x_jobs.enqueue('conc_1', queue => 'conc', concurrency_key => 'conc-key') AS e
UNION ALL
SELECT
    'k2' AS tag,
    e.*
FROM x_jobs.enqueue('conc_2', queue => 'conc', concurrency_key => 'conc-key') AS e
UNION ALL
SELECT
    'k3' AS tag,
    e.*
FROM x_jobs.enqueue('conc_3', queue => 'conc', concurrency_key => 'conc-key') AS e;

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc'], 'conc-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('conc_1') $$,
    'Of three rows of a key with limit 1, a claim of 10 should take only the first'
);

SELECT is_empty(
    $$ SELECT * FROM x_jobs.claim(ARRAY['conc'], 'conc-worker', '1 minute', 10) $$,
    'While a key''s only slot is taken, its other rows should not be claimed'
);

SELECT ok(
    x_jobs.complete((
        SELECT k.id FROM conc_job AS k
        WHERE k.tag = 'k1'
    ), 'conc-worker'),
    'The running row of the key should complete (setup)'
);

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc'], 'conc-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('conc_2') $$,
    'Once the running row of a key completes, the next row of the key should be claimed'
);

CREATE TEMP TABLE conc2_job AS
SELECT e.* FROM x_jobs.enqueue('conc2_1', queue => 'conc2', concurrency_key => 'conc2-key', concurrency_limit => 2) AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc2_2', queue => 'conc2', concurrency_key => 'conc2-key', concurrency_limit => 2) AS e
UNION ALL
SELECT e.*
FROM x_jobs.enqueue('conc2_3', queue => 'conc2', concurrency_key => 'conc2-key', concurrency_limit => 2) AS e;

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc2'], 'conc-worker', '1 minute', 10) AS c $$,
    $$ VALUES ('conc2_1'), ('conc2_2') $$,
    'With limit 2, two rows of the key should run at once'
);

-- A full key does not block the unkeyed rows behind it.
CREATE TEMP TABLE conc3_job AS
SELECT e.* FROM x_jobs.enqueue('conc3_keyed_1', queue => 'conc3', priority => -1, concurrency_key => 'conc3-key') AS e;
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['conc3'], 'conc-worker', '1 minute', 1) AS c),
    'conc3_keyed_1',
    'The first row of the key should be claimed (setup)'
);
INSERT INTO conc3_job
SELECT e.* FROM x_jobs.enqueue('conc3_keyed_2', queue => 'conc3', priority => -1, concurrency_key => 'conc3-key') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc3_keyed_3', queue => 'conc3', priority => -1, concurrency_key => 'conc3-key') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc3_plain', queue => 'conc3', priority => 0) AS e;

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc3'], 'conc-worker', '1 minute', 1) AS c $$,
    $$ VALUES ('conc3_plain') $$,
    'Rows of a full key ahead in order should not block an unkeyed row behind them, even at qty 1'
);

-- The same when the key fills up inside the claim itself.
CREATE TEMP TABLE conc4_job AS
SELECT e.* FROM x_jobs.enqueue('conc4_keyed_1', queue => 'conc4', priority => -1, concurrency_key => 'conc4-key') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc4_keyed_2', queue => 'conc4', priority => -1, concurrency_key => 'conc4-key') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc4_plain', queue => 'conc4', priority => 0) AS e;

SELECT set_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc4'], 'conc-worker', '1 minute', 2) AS c $$,
    ARRAY['conc4_keyed_1', 'conc4_plain'],
    'A slot a key denies inside a claim should go to the next row: qty 2 should take one keyed and the unkeyed row'
);

-- A key backed up past the claim's window: a claim of 3 reads the oldest 10 x 3 + 100 keyed rows
-- of the queue, all of one key at its limit here, and must visit the keys to find the row of
-- another key behind them (and only one of it: its limit is 1), besides the unkeyed row.
CREATE TEMP TABLE conc5_job AS
SELECT e.* FROM x_jobs.enqueue('conc5_head', queue => 'conc5', concurrency_key => 'conc5-full') AS e;
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['conc5'], 'conc-worker', '1 minute', 1) AS c),
    'conc5_head',
    'The first row of the full key should be claimed (setup)'
);
SELECT count(*) FROM x_jobs.enqueue_many((
    SELECT jsonb_agg(jsonb_build_object('name', 'conc5_backlog', 'queue', 'conc5', 'concurrency_key', 'conc5-full'))
    FROM generate_series(1, 150)
));
INSERT INTO conc5_job
SELECT e.* FROM x_jobs.enqueue('conc5_other_1', queue => 'conc5', concurrency_key => 'conc5-free') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc5_other_2', queue => 'conc5', concurrency_key => 'conc5-free') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc5_plain', queue => 'conc5') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc5_away', queue => 'conc5-away', concurrency_key => 'conc5-away') AS e;

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc5'], 'conc-worker', '1 minute', 3) AS c ORDER BY c.name $$,
    $$ VALUES ('conc5_other_1'), ('conc5_plain') $$,
    'Behind a window full of a key at its limit, a claim should find the first row of a key with room '
    '(one, as its limit says) and the unkeyed row, and no row of another queue'
);

-- The same for delayed rows come due (the waiting arm), behind as many due rows of a full key.
CREATE TEMP TABLE conc6_job AS
SELECT e.* FROM x_jobs.enqueue('conc6_head', queue => 'conc6', concurrency_key => 'conc6-full') AS e;
SELECT is(
    (SELECT c.name FROM x_jobs.claim(ARRAY['conc6'], 'conc-worker', '1 minute', 1) AS c),
    'conc6_head',
    'The first row of the full key should be claimed (setup)'
);
SELECT count(*) FROM x_jobs.enqueue_many((
    SELECT
        jsonb_agg(
            jsonb_build_object(
                'name', 'conc6_backlog', 'queue', 'conc6', 'concurrency_key', 'conc6-full',
                'run_at', '2030-01-01 12:30:00+00'
            )
        )
    FROM generate_series(1, 150)
));
INSERT INTO conc6_job
SELECT e.* FROM
    x_jobs.enqueue(
        'conc6_other', queue => 'conc6', concurrency_key => 'conc6-free', run_at => '2030-01-01 12:31:00+00'
    ) AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('conc6_plain', queue => 'conc6', run_at => '2030-01-01 12:32:00+00') AS e;
-- Due an hour ago, still delayed: what a claim sees once time has passed and no claim ran.
UPDATE x_jobs.job SET run_at = run_at - interval '1 hour'
WHERE queue = 'conc6' AND state = 'delayed';

SELECT results_eq(
    $$ SELECT c.name FROM x_jobs.claim(ARRAY['conc6'], 'conc-worker', '1 minute', 3) AS c ORDER BY c.name $$,
    $$ VALUES ('conc6_other'), ('conc6_plain') $$,
    'Behind due delayed rows of a key at its limit, a claim should find the due rows of a key with room and '
    'the unkeyed one'
);

-- A saga whose final attempt lost its lease: no attempt is left to run the compensations, so
-- the buried row names the completed steps that none undid (a compensated one is not named).
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.enqueue('saga_lapsed', queue => 'saga', max_attempts => 1)),
    1,
    'The saga should be enqueued (setup)'
);
CREATE TEMP TABLE saga_claim AS
SELECT c.id FROM x_jobs.claim(ARRAY['saga'], 'saga-worker', '30 seconds', 1) AS c;
SELECT results_eq(
    $$
    SELECT x_jobs.step_record(c.id, 'saga-worker', s.step, '{}', compensation => s.undo)::text
    FROM saga_claim AS c
    CROSS JOIN (VALUES (1, 'charge', FALSE), (2, 'reserve', FALSE), (3, 'reserve', TRUE), (4, 'ship', FALSE)) AS s (n, step, undo)
    ORDER BY s.n
    $$,
    $$ VALUES ('done'), ('done'), ('done'), ('done') $$,
    'Three steps and the compensation of one should be recorded (setup)'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:01:00+00';
SELECT results_eq(
    $$ SELECT c.state::text, c.last_error FROM x_jobs.claim(ARRAY['saga'], 'saga-worker-2', '30 seconds', 1) AS c $$,
    $$
    VALUES ('dead', 'lease lapsed on the final attempt: steps ''charge'', ''ship'' completed and their '
                    'compensations, if any, did not run')
    $$,
    'A saga buried after its final lease lapsed should name the completed steps no compensation undid'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- A server restart: leases that ran out while it was down are left to their holders for one
-- lease (the claim's) after it took connections again (x_jobs._ready_since: the end of its
-- recovery, since 0.3.9; test_restart_grace.py crashes a server for it); a lease renewed since
-- the start lapses as usual.
SELECT set_config('x_jobs.fake_now', (pg_postmaster_start_time() - interval '1 minute')::text, TRUE);
CREATE TEMP TABLE restart_job AS
SELECT e.* FROM x_jobs.enqueue('restart_stale', queue => 'restart') AS e
UNION ALL
SELECT e.* FROM x_jobs.enqueue('restart_renewed', queue => 'restart') AS e;
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['restart'], 'restart-holder', '30 seconds', 2)),
    2,
    'Both rows should be claimed before the server started (setup)'
);
SELECT set_config('x_jobs.fake_now', (x_jobs._ready_since() + interval '5 seconds')::text, TRUE);
SELECT results_eq(
    $$
    SELECT x_jobs.extend_lease(ARRAY[j.id], 'restart-holder', '1 second')
    FROM restart_job AS j JOIN x_jobs.job AS r ON r.id = j.id WHERE r.name = 'restart_renewed'
    $$,
    $$ SELECT j.id FROM restart_job AS j JOIN x_jobs.job AS r ON r.id = j.id WHERE r.name = 'restart_renewed' $$,
    'The holder should renew one lease after the start, for a second (setup)'
);
SELECT set_config('x_jobs.fake_now', (x_jobs._ready_since() + interval '10 seconds')::text, TRUE);
SELECT results_eq(
    $$ SELECT c.name, c.claimed_by FROM x_jobs.claim(ARRAY['restart'], 'restart-other', '30 seconds', 2) AS c $$,
    $$ VALUES ('restart_renewed', 'restart-other') $$,
    'Inside a lease after the server took connections, a claim should take a lease renewed since then that lapsed, '
    'and leave one last renewed before the start'
);
SELECT set_config('x_jobs.fake_now', (x_jobs._ready_since() + interval '31 seconds')::text, TRUE);
SELECT results_eq(
    $$ SELECT c.name, c.claimed_by FROM x_jobs.claim(ARRAY['restart'], 'restart-other', '30 seconds', 2) AS c $$,
    $$ VALUES ('restart_stale', 'restart-other') $$,
    'A lease after the server took connections, a claim should take the lease its holder never renewed'
);
SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';

-- Refusals -------------------------------------------------------------------------------------------

SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(NULL, 'w') $$,
    'XJ010', 'X_QUEUES_INVALID: queue list NULL names no queue',
    'A claim without a queue list should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim('{}', 'w') $$,
    'XJ010', 'X_QUEUES_INVALID: queue list {} names no queue',
    'A claim with an empty queue list should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY[''], 'w') $$,
    'XJ010', 'X_QUEUES_INVALID: queue list {""} names no queue',
    'A claim naming an empty queue should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default', NULL], 'w') $$,
    'XJ010', 'X_QUEUES_INVALID: queue list {default,NULL} names no queue',
    'A claim naming a NULL queue should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], NULL) $$,
    'XJ011', 'X_WORKER_INVALID: worker id NULL is empty',
    'A claim without a worker id should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], '') $$,
    'XJ011', 'X_WORKER_INVALID: worker id '''' is empty',
    'A claim with an empty worker id should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', NULL) $$,
    'XJ012', 'X_LEASE_INVALID: lease NULL is not positive',
    'A claim without a lease should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '0 seconds') $$,
    'XJ012', 'X_LEASE_INVALID: lease 00:00:00 is not positive',
    'A claim with a lease of zero should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '-5 seconds') $$,
    'XJ012', 'X_LEASE_INVALID: lease -00:00:05 is not positive',
    'A claim with a negative lease should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '300000 years') $$,
    'XJ012', 'X_LEASE_INVALID: lease 300000 years is longer than 1000 years',
    'A claim with a lease of millennia should be refused (its end was past what timestamptz holds)'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '1 minute', 0) $$,
    'XJ013', 'X_QTY_INVALID: qty 0 is outside 1..1000',
    'A claim of qty 0 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '1 minute', -1) $$,
    'XJ013', 'X_QTY_INVALID: qty -1 is outside 1..1000',
    'A claim of negative qty should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '1 minute', 1001) $$,
    'XJ013', 'X_QTY_INVALID: qty 1001 is outside 1..1000',
    'A claim of qty 1001 should be refused'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '1 minute', NULL) $$,
    'XJ013', 'X_QTY_INVALID: qty NULL is outside 1..1000',
    'A claim without a qty should be refused'
);

SELECT results_eq(
    $$
    SELECT c.err_state, c.err_hint
    FROM tap_helpers.caught($q$ SELECT * FROM x_jobs.claim(ARRAY['default'], 'w', '1 minute', 0) $q$) AS c
    $$,
    $$ VALUES ('XJ013', 'Pass how many jobs the worker has free slots for, from 1 to 1000.') $$,
    'A refused qty should hint at the accepted range'
);

SELECT results_eq(
    $$ SELECT i.iso_level, i.err_state, i.err_message, i.err_hint FROM isolation_refusal AS i ORDER BY i.iso_level $$,
    $$
    VALUES ('repeatable read', 'XJ022', 'X_ISOLATION_UNSUPPORTED: claim cannot run at isolation level repeatable read',
            'Call claim in its own READ COMMITTED transaction (autocommit).'),
           ('serializable', 'XJ022', 'X_ISOLATION_UNSUPPORTED: claim cannot run at isolation level serializable',
            'Call claim in its own READ COMMITTED transaction (autocommit).')
    $$,
    'A claim in a REPEATABLE READ or SERIALIZABLE transaction should be refused'
);

SELECT * FROM finish();
ROLLBACK;
