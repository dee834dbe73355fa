-- x_jobs.cancel_jobs and x_jobs.retry_jobs: cancel and retry applied to every row that matches
-- the filters given (queue, name, state, tenant_id, created_before, created_after), each NULL
-- matching any, with dry_run and max_rows, and their refusals. Each is held to the result of
-- its one-row function called row by row, on twin rows. The clock is moved with SET LOCAL
-- "x_jobs.fake_now"; enqueue stamps created_at with it. What two sessions do at once (locks,
-- an enqueue taking a key meanwhile) is in tests/python/test_bulk.py.
BEGIN;
SELECT plan(49);

-- The refusals print times in the session's TimeZone.
SET LOCAL TimeZone = 'UTC';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- The tags of the rows whose state a call changes, the call then rolled back (a block's
-- exception undoes its writes, not the variables it set): one fixture serves every filter.
CREATE FUNCTION pg_temp.changed(p_call text)
RETURNS text[]
LANGUAGE plpgsql
AS $$
DECLARE
    v_before jsonb;
    v_changed text[];
BEGIN
    SELECT jsonb_object_agg(t.tag, k.state) INTO v_before
    FROM pg_temp.j AS t JOIN x_jobs.job AS k ON k.id = t.id;
    BEGIN
        EXECUTE p_call;
        SELECT coalesce(array_agg(t.tag ORDER BY t.tag), '{}') INTO v_changed
        FROM pg_temp.j AS t JOIN x_jobs.job AS k ON k.id = t.id
        WHERE k.state::text IS DISTINCT FROM v_before ->> t.tag;
        RAISE EXCEPTION USING ERRCODE = 'XJ999', MESSAGE = 'roll the call back';
    EXCEPTION
        WHEN SQLSTATE 'XJ999' THEN
            NULL;
    END;
    RETURN v_changed;
END
$$;

-- The live rows of the filter tests. e_* are created at 09:00, n_* at 10:00, and o_y_b_t1 at
-- 08:00 after them (a transaction that began early), so that every filter has rows it must
-- pass over between the first and the last it takes; a tag says its queue, its name and its
-- tenant. The terminal rows of queue x are claimed first (priority -1) and settled, so that a
-- filter on queue x or name a finds them and must leave them.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 09:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('e_x_a_t1', 'x', 'a', 't1', NULL::timestamptz, NULL),
    ('e_y_b_t2', 'y', 'b', 't2', '2030-01-01 12:00:00+00', NULL),
    ('e_z_a_t1', 'z', 'a', 't1', NULL, NULL)
) AS t (tag, queue, name, tenant, run_at, concurrency_key)
CROSS JOIN LATERAL x_jobs.enqueue(
    't42_' || t.name, queue => 't42-' || t.queue, tenant_id => t.tenant, run_at => t.run_at
) AS e;

-- e_z_a_t1 sleeps on a step: suspended.
DO $$
BEGIN
    PERFORM x_jobs.claim(ARRAY['t42-z'], 't42-w1');
    PERFORM x_jobs.step_sleep(tap_helpers.jid('e_z_a_t1'), 't42-w1', 'nap', '1 hour');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('n_done', 'x', 'a', 't1', -1, 25, NULL),
    ('n_dead', 'x', 'a', 't1', -1, 1, NULL),
    ('n_cancelled', 'x', 'a', 't1', 0, 25, NULL),
    ('n_w_b_t1', 'w', 'b', 't1', 0, 25, NULL),
    ('n_x_a_t2', 'x', 'a', 't2', 0, 25, NULL)
) AS t (tag, queue, name, tenant, priority, max_attempts, concurrency_key)
CROSS JOIN LATERAL x_jobs.enqueue(
    't42_' || t.name, queue => 't42-' || t.queue, tenant_id => t.tenant, priority => t.priority,
    max_attempts => t.max_attempts, concurrency_key => t.concurrency_key
) AS e;

SET LOCAL "x_jobs.fake_now" = '2030-01-01 08:00:00+00';
INSERT INTO j (tag, id) VALUES ('o_y_b_t1', (x_jobs.enqueue('t42_b', queue => 't42-y', tenant_id => 't1')).id);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';
INSERT INTO j (tag, id)
VALUES ('n_y_a_t1', (x_jobs.enqueue('t42_a', queue => 't42-y', tenant_id => 't1', concurrency_key => 'k42')).id);

DO $$
BEGIN
    PERFORM x_jobs.claim(ARRAY['t42-x'], 't42-w1', qty => 2);
    PERFORM x_jobs.complete(tap_helpers.jid('n_done'), 't42-w1');
    PERFORM x_jobs.fail(tap_helpers.jid('n_dead'), 't42-w1', 'boom');
    PERFORM x_jobs.cancel(tap_helpers.jid('n_cancelled'));
    PERFORM x_jobs.claim(ARRAY['t42-w'], 't42-w2', lease => '1 hour');
END
$$;

SELECT results_eq(
    $$SELECT j.tag, k.state::text FROM j JOIN x_jobs.job AS k ON k.id = j.id ORDER BY j.tag$$,
    $$VALUES ('e_x_a_t1', 'ready'), ('e_y_b_t2', 'delayed'), ('e_z_a_t1', 'suspended'),
             ('n_cancelled', 'cancelled'), ('n_dead', 'dead'), ('n_done', 'done'),
             ('n_w_b_t1', 'running'), ('n_x_a_t2', 'ready'), ('n_y_a_t1', 'ready'), ('o_y_b_t1', 'ready')$$,
    'The fixture should hold a row of each live state (one ready row keyed) and terminal rows'
);

------------------------------------------------------------------------------------------------
-- cancel_jobs: the filters, by dry run
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE snap AS SELECT k.* FROM x_jobs.job AS k;

SELECT results_eq(
    $$
    SELECT
        f.what,
        x_jobs.cancel_jobs(
            queue => f.queue, name => f.name, state => f.state, tenant_id => f.tenant_id,
            created_before => f.created_before, created_after => f.created_after, max_rows => f.max_rows,
            dry_run => TRUE
        ),
        pg_temp.changed(pg_catalog.format(
            'SELECT x_jobs.cancel_jobs(queue => %L, name => %L, state => %L, tenant_id => %L, '
            'created_before => %L, created_after => %L, max_rows => %L)',
            f.queue, f.name, f.state, f.tenant_id, f.created_before, f.created_after, f.max_rows
        ))
    FROM (
        VALUES
        (1, 'no filter', NULL, NULL, NULL, NULL, NULL::timestamptz, NULL::timestamptz, NULL::integer),
        (2, 'queue', 't42-x', NULL, NULL, NULL, NULL, NULL, NULL),
        (3, 'name', NULL, 't42_a', NULL, NULL, NULL, NULL, NULL),
        (4, 'state ready', NULL, NULL, 'ready', NULL, NULL, NULL, NULL),
        (5, 'state delayed', NULL, NULL, 'delayed', NULL, NULL, NULL, NULL),
        (6, 'state suspended', NULL, NULL, 'suspended', NULL, NULL, NULL, NULL),
        (7, 'state running', NULL, NULL, 'running', NULL, NULL, NULL, NULL),
        (8, 'tenant', NULL, NULL, NULL, 't1', NULL, NULL, NULL),
        (9, 'created before', NULL, NULL, NULL, NULL, '2030-01-01 09:30:00+00', NULL, NULL),
        (10, 'created after', NULL, NULL, NULL, NULL, NULL, '2030-01-01 09:30:00+00', NULL),
        (11, 'before is exclusive', NULL, NULL, NULL, NULL, '2030-01-01 10:00:00+00', NULL, NULL),
        (12, 'after is exclusive', NULL, NULL, NULL, NULL, NULL, '2030-01-01 09:00:00+00', NULL),
        (
            13, 'all of them', 't42-x', 't42_a', 'ready', 't2', '2030-01-01 11:00:00+00',
            '2030-01-01 09:30:00+00', NULL
        ),
        (14, 'nothing matches', 't42-x', 't42_b', NULL, NULL, NULL, NULL, NULL),
        (15, 'max_rows: the oldest ids', NULL, NULL, NULL, NULL, NULL, NULL, 4)
    ) AS f (n, what, queue, name, state, tenant_id, created_before, created_after, max_rows)
    ORDER BY f.n
    $$,
    $$
    VALUES
    ('no filter', 7::bigint, '{e_x_a_t1,e_y_b_t2,e_z_a_t1,n_w_b_t1,n_x_a_t2,n_y_a_t1,o_y_b_t1}'::text []),
    ('queue', 2, '{e_x_a_t1,n_x_a_t2}'),
    ('name', 4, '{e_x_a_t1,e_z_a_t1,n_x_a_t2,n_y_a_t1}'),
    ('state ready', 4, '{e_x_a_t1,n_x_a_t2,n_y_a_t1,o_y_b_t1}'),
    ('state delayed', 1, '{e_y_b_t2}'),
    ('state suspended', 1, '{e_z_a_t1}'),
    ('state running', 1, '{n_w_b_t1}'),
    ('tenant', 5, '{e_x_a_t1,e_z_a_t1,n_w_b_t1,n_y_a_t1,o_y_b_t1}'),
    ('created before', 4, '{e_x_a_t1,e_y_b_t2,e_z_a_t1,o_y_b_t1}'),
    ('created after', 3, '{n_w_b_t1,n_x_a_t2,n_y_a_t1}'),
    ('before is exclusive', 4, '{e_x_a_t1,e_y_b_t2,e_z_a_t1,o_y_b_t1}'),
    ('after is exclusive', 3, '{n_w_b_t1,n_x_a_t2,n_y_a_t1}'),
    ('all of them', 1, '{n_x_a_t2}'),
    ('nothing matches', 0, '{}'),
    ('max_rows: the oldest ids', 4, '{e_x_a_t1,e_y_b_t2,e_z_a_t1,n_w_b_t1}')
    $$,
    'cancel_jobs should cancel the live rows that match every filter given, never a finished row, and its '
    'dry run count them'
);

SELECT is_empty(
    $$SELECT k.* FROM x_jobs.job AS k EXCEPT SELECT s.* FROM snap AS s$$,
    'A dry run should change nothing'
);

------------------------------------------------------------------------------------------------
-- cancel_jobs: what it changes
------------------------------------------------------------------------------------------------

SELECT is(
    x_jobs.cancel_jobs(name => 't42_a', created_before => '2030-01-01 09:30:00+00'),
    2::bigint,
    'cancel_jobs should answer how many rows it cancelled'
);

SELECT results_eq(
    $$SELECT j.tag FROM j JOIN x_jobs.job AS k ON k.id = j.id
      WHERE k.state = 'cancelled' AND k.updated_at = '2030-01-01 10:00:00+00' AND j.tag LIKE 'e%' ORDER BY j.tag$$,
    $$VALUES ('e_x_a_t1'), ('e_z_a_t1')$$,
    'cancel_jobs should cancel the rows that match, a suspended one included'
);

SELECT is_empty(
    $$SELECT k.* FROM x_jobs.job AS k
      WHERE k.id NOT IN (tap_helpers.jid('e_x_a_t1'), tap_helpers.jid('e_z_a_t1'))
      EXCEPT SELECT s.* FROM snap AS s$$,
    'cancel_jobs should leave every row that does not match as it was'
);

-- max_rows: the oldest live rows first, then the rest.
CREATE TEMP TABLE live_order AS
SELECT
    k.id,
    pg_catalog.row_number() OVER (ORDER BY k.id) AS n
FROM x_jobs.job AS k
WHERE k.state IN ('ready', 'delayed', 'suspended', 'running');

SELECT is(x_jobs.cancel_jobs(max_rows => 2), 2::bigint, 'cancel_jobs with max_rows should cancel at most max_rows');

SELECT results_eq(
    $$SELECT o.n FROM live_order AS o JOIN x_jobs.job AS k ON k.id = o.id WHERE k.state = 'cancelled' ORDER BY o.n$$,
    $$VALUES (1::bigint), (2::bigint)$$,
    'cancel_jobs with max_rows should cancel the oldest matching rows first (lowest id)'
);

SELECT is(
    x_jobs.cancel_jobs(max_rows => 2),
    2::bigint,
    'A second call with max_rows should go on with the next rows'
);

SELECT is(
    x_jobs.cancel_jobs(max_rows => 2),
    1::bigint,
    'The call that cancels the last matching row should answer below max_rows'
);

SELECT is(x_jobs.cancel_jobs(), 0::bigint, 'A call once every live row is cancelled should answer 0');

SELECT results_eq(
    $$SELECT j.tag, k.state::text FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE 'n%' ORDER BY j.tag$$,
    $$VALUES ('n_cancelled', 'cancelled'), ('n_dead', 'dead'), ('n_done', 'done'),
             ('n_w_b_t1', 'cancelled'), ('n_x_a_t2', 'cancelled'), ('n_y_a_t1', 'cancelled')$$,
    'cancel_jobs should cancel every live row, a running and a keyed one included, and leave finished ones'
);

-- The running row lost its worker, as a cancel(id) leaves it.
SELECT results_eq(
    $$SELECT k.claimed_by, k.visible_at, k.finished_at FROM x_jobs.job AS k WHERE k.id = tap_helpers.jid('n_w_b_t1')$$,
    $$VALUES (NULL::text, NULL::timestamptz, '2030-01-01 10:00:00+00'::timestamptz)$$,
    'A running row cancelled by filter should have no worker, no lease, and be finished now'
);

SELECT is(
    x_jobs.complete(tap_helpers.jid('n_w_b_t1'), 't42-w2'),
    FALSE,
    'The worker of a running row cancelled by filter should not be able to complete it'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('n_w_b_t1')], 't42-w2')$$,
    'The heartbeat of that worker should not list the row (the signal to stop its body)'
);

SELECT results_eq(
    $$SELECT c.job, sum(c.cancelled)::bigint FROM x_jobs.counter AS c
      WHERE c.job LIKE 't42%' AND c.bucket_seconds = 60 AND c.bucket_start = '2030-01-01 10:00:00+00'
      GROUP BY c.job ORDER BY c.job$$,
    $$VALUES ('t42_a', 5::bigint), ('t42_b', 3::bigint)$$,
    'Each cancelled row should count in its job name''s minute, as cancel(id) counts (n_cancelled''s included)'
);

------------------------------------------------------------------------------------------------
-- cancel_jobs against cancel(id), row by row, on twins
------------------------------------------------------------------------------------------------

-- Twin rows in queues tw-a and tw-b: ready, delayed, keyed, running and suspended.
SET LOCAL "x_jobs.fake_now" = '2030-01-02 08:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag || '_' || q.side AS tag,
    e.id
FROM (
    VALUES
    ('ready', NULL::timestamptz, NULL),
    ('delayed', '2030-01-02 12:00:00+00', NULL),
    ('keyed', NULL, 'k42-tw'),
    ('running', NULL, NULL),
    ('suspended', NULL, NULL)
) AS t (tag, run_at, concurrency_key)
CROSS JOIN (VALUES ('a'), ('b')) AS q (side)
CROSS JOIN LATERAL x_jobs.enqueue(
    't42_tw_' || t.tag,
    queue => 't42-tw-' || q.side || CASE WHEN t.tag IN ('running', 'suspended') THEN '-run' ELSE '' END,
    run_at => t.run_at, concurrency_key => t.concurrency_key,
    priority => CASE t.tag WHEN 'running' THEN 0 ELSE 1 END
) AS e;

DO $$
BEGIN
    PERFORM x_jobs.claim(ARRAY['t42-tw-a-run', 't42-tw-b-run'], 't42-w3', lease => '1 hour', qty => 4);
    PERFORM x_jobs.step_sleep(tap_helpers.jid('suspended_a'), 't42-w3', 'nap', '1 hour');
    PERFORM x_jobs.step_sleep(tap_helpers.jid('suspended_b'), 't42-w3', 'nap', '1 hour');
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-02 08:05:00+00';

SELECT is(
    x_jobs.cancel_jobs(queue => 't42-tw-a') + x_jobs.cancel_jobs(queue => 't42-tw-a-run'),
    5::bigint,
    'cancel_jobs should cancel the five twins of side a'
);

SELECT is(
    (
        SELECT count(*)::integer FROM j
        WHERE j.tag LIKE '%\_b' AND x_jobs.cancel(j.id)
    ),
    5,
    'cancel(id) should cancel the five twins of side b'
);

SELECT is_empty(
    $$
    SELECT
        split_part(j.tag, '_', 1) AS twin, k.state, k.attempt, k.claims, k.run_at, k.visible_at,
        k.started_at, k.finished_at, k.updated_at, k.claimed_by, k.output, k.last_error
    FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE '%\_a'
    EXCEPT
    SELECT
        split_part(j.tag, '_', 1), k.state, k.attempt, k.claims, k.run_at, k.visible_at,
        k.started_at, k.finished_at, k.updated_at, k.claimed_by, k.output, k.last_error
    FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE '%\_b'
    $$,
    'Each row cancelled by filter should end exactly as its twin cancelled by id'
);

SELECT results_eq(
    $$SELECT c.job, sum(c.cancelled)::bigint FROM x_jobs.counter AS c
      WHERE c.job LIKE 't42\_tw%' AND c.bucket_start = '2030-01-02 08:05:00+00'
      GROUP BY c.job ORDER BY c.job$$,
    $$VALUES ('t42_tw_delayed', 2::bigint), ('t42_tw_keyed', 2::bigint), ('t42_tw_ready', 2::bigint),
             ('t42_tw_running', 2::bigint), ('t42_tw_suspended', 2::bigint)$$,
    'Cancelling by filter and by id should count alike'
);

------------------------------------------------------------------------------------------------
-- retry_jobs
------------------------------------------------------------------------------------------------

-- Finished rows to retry, in queues r1 and r2: dead, failed (no dead letters) and cancelled.
SET LOCAL "x_jobs.fake_now" = '2030-01-03 08:00:00+00';

INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM (
    VALUES
    ('r_dead_1', 'r1', 'a', 't1', TRUE),
    ('r_dead_2', 'r2', 'b', 't2', TRUE),
    ('r_failed_1', 'r1', 'b', 't1', FALSE),
    ('r_cancelled_1', 'r1', 'a', 't1', TRUE)
) AS t (tag, queue, name, tenant, dead_letter)
CROSS JOIN LATERAL x_jobs.enqueue(
    't42_r' || t.name, queue => 't42-' || t.queue, tenant_id => t.tenant, max_attempts => 1,
    dead_letter => t.dead_letter
) AS e;

DO $$
BEGIN
    PERFORM x_jobs.claim(ARRAY['t42-r1', 't42-r2'], 't42-w4', qty => 10);
    PERFORM x_jobs.fail(tap_helpers.jid('r_dead_1'), 't42-w4', 'boom');
    PERFORM x_jobs.fail(tap_helpers.jid('r_dead_2'), 't42-w4', 'boom');
    PERFORM x_jobs.fail(tap_helpers.jid('r_failed_1'), 't42-w4', 'boom');
    PERFORM x_jobs.cancel(tap_helpers.jid('r_cancelled_1'));
END
$$;

SET LOCAL "x_jobs.fake_now" = '2030-01-03 08:05:00+00';

SELECT results_eq(
    $$
    SELECT
        f.what,
        x_jobs.retry_jobs(
            queue => f.queue, name => f.name, state => f.state, tenant_id => f.tenant_id,
            created_before => f.created_before, created_after => f.created_after, max_rows => f.max_rows,
            dry_run => TRUE
        ),
        pg_temp.changed(pg_catalog.format(
            'SELECT x_jobs.retry_jobs(queue => %L, name => %L, state => %L, tenant_id => %L, '
            'created_before => %L, created_after => %L, max_rows => %L)',
            f.queue, f.name, f.state, f.tenant_id, f.created_before, f.created_after, f.max_rows
        ))
    FROM (
        VALUES
        (1, 'no filter: dead and failed', NULL, NULL, NULL, NULL, NULL::timestamptz, NULL::timestamptz, NULL::integer),
        (2, 'queue', 't42-r1', NULL, NULL, NULL, NULL, NULL, NULL),
        (3, 'name', NULL, 't42_rb', NULL, NULL, NULL, NULL, NULL),
        (4, 'state dead', NULL, NULL, 'dead', NULL, NULL, NULL, NULL),
        (5, 'state failed', NULL, NULL, 'failed', NULL, NULL, NULL, NULL),
        (6, 'state cancelled', 't42-r1', NULL, 'cancelled', NULL, NULL, NULL, NULL),
        (7, 'tenant', NULL, NULL, NULL, 't2', NULL, NULL, NULL),
        (8, 'created before', NULL, NULL, NULL, NULL, '2030-01-03 08:00:00+00', NULL, NULL),
        (9, 'created after', NULL, NULL, NULL, NULL, NULL, '2030-01-03 07:00:00+00', NULL),
        (10, 'max_rows: the oldest ids', NULL, NULL, NULL, NULL, NULL, NULL, 2)
    ) AS f (n, what, queue, name, state, tenant_id, created_before, created_after, max_rows)
    ORDER BY f.n
    $$,
    $$
    VALUES
    ('no filter: dead and failed', 4::bigint, '{n_dead,r_dead_1,r_dead_2,r_failed_1}'::text []),
    ('queue', 2, '{r_dead_1,r_failed_1}'),
    ('name', 2, '{r_dead_2,r_failed_1}'),
    ('state dead', 3, '{n_dead,r_dead_1,r_dead_2}'),
    ('state failed', 1, '{r_failed_1}'),
    ('state cancelled', 1, '{r_cancelled_1}'),
    ('tenant', 1, '{r_dead_2}'),
    ('created before', 1, '{n_dead}'),
    ('created after', 3, '{r_dead_1,r_dead_2,r_failed_1}'),
    ('max_rows: the oldest ids', 2, '{n_dead,r_dead_1}')
    $$,
    'retry_jobs should re-queue the dead and failed rows that match every filter given (cancelled ones only '
    'when named), never a live one, and its dry run count them'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't42-r1'),
    2::bigint,
    'retry_jobs should re-queue the dead and failed rows that match'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.attempt, k.run_at, k.finished_at
      FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE 'r\_%' ORDER BY j.tag$$,
    $$VALUES ('r_cancelled_1', 'cancelled', 1, '2030-01-03 08:00:00+00'::timestamptz,
              '2030-01-03 08:00:00+00'::timestamptz),
             ('r_dead_1', 'ready', 0, '2030-01-03 08:05:00+00', NULL),
             ('r_dead_2', 'dead', 1, '2030-01-03 08:00:00+00', '2030-01-03 08:00:00+00'),
             ('r_failed_1', 'ready', 0, '2030-01-03 08:05:00+00', NULL)$$,
    'Without state, retry_jobs should leave a cancelled row of the queue, and rows of other queues, as they were'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't42-r1', state => 'cancelled'),
    1::bigint,
    'retry_jobs with state cancelled should re-queue the cancelled rows that match'
);

SELECT is(
    (
        SELECT k.state::text FROM x_jobs.job AS k
        WHERE k.id = tap_helpers.jid('r_cancelled_1')
    ),
    'ready',
    'A cancelled row retried by filter should be ready'
);

SELECT
    is(
        x_jobs.retry_jobs(),
        2::bigint,
        'A bare retry_jobs should re-queue every dead and failed row (r_dead_2 and n_dead)'
    );

SELECT is(x_jobs.retry_jobs(), 0::bigint, 'A second bare retry_jobs should find nothing left');

-- retry_jobs against retry(id), row by row, on twins with steps: a done step, a failed one, one
-- its compensation undid, and a compensation that failed.
SET LOCAL "x_jobs.fake_now" = '2030-01-04 08:00:00+00';

INSERT INTO j (tag, id)
SELECT
    'rt_' || t.kind || '_' || q.side AS tag,
    e.id
FROM (VALUES ('dead', TRUE), ('failed', FALSE)) AS t (kind, dead_letter)
CROSS JOIN (VALUES ('a'), ('b')) AS q (side)
CROSS JOIN LATERAL x_jobs.enqueue(
    't42_rt_' || t.kind, queue => 't42-rt-' || q.side, max_attempts => 2, dead_letter => t.dead_letter
) AS e;

DO $$
BEGIN
    PERFORM x_jobs.claim(ARRAY['t42-rt-a', 't42-rt-b'], 't42-w5', qty => 10);
    PERFORM x_jobs.fail(j.id, 't42-w5', 'first', retry_delay => '0') FROM j WHERE j.tag LIKE 'rt\_%';
    PERFORM x_jobs.claim(ARRAY['t42-rt-a', 't42-rt-b'], 't42-w5', qty => 10);
    PERFORM x_jobs.fail(j.id, 't42-w5', 'second') FROM j WHERE j.tag LIKE 'rt\_%';
END
$$;

INSERT INTO x_jobs.step (job_id, name, compensation, kind, created_at, status, attempt, output)
SELECT
    j.id,
    s.name,
    s.compensation,
    'run' AS kind,
    '2030-01-04 08:00:00+00' AS created_at,
    s.status::x_jobs.step_status,
    1 AS attempt,
    '{}' AS output
FROM j
CROSS JOIN (
    VALUES
    ('kept', FALSE, 'done'),
    ('broke', FALSE, 'failed'),
    ('charged', FALSE, 'done'),
    ('charged', TRUE, 'done'),
    ('shipped', FALSE, 'done'),
    ('shipped', TRUE, 'failed')
) AS s (name, compensation, status)
WHERE j.tag LIKE 'rt\_%';

SET LOCAL "x_jobs.fake_now" = '2030-01-04 08:05:00+00';

SELECT is(x_jobs.retry_jobs(queue => 't42-rt-a'), 2::bigint, 'retry_jobs should re-queue the two twins of side a');

SELECT is(
    (
        SELECT count(*)::integer FROM j
        WHERE j.tag LIKE 'rt\_%\_b' AND x_jobs.retry(j.id)
    ),
    2,
    'retry(id) should re-queue the two twins of side b'
);

SELECT is_empty(
    $$
    SELECT
        split_part(j.tag, '_', 2) AS twin, k.state, k.attempt, k.claims, k.run_at, k.visible_at,
        k.finished_at, k.updated_at, k.claimed_by, k.output, k.last_error, k.run_id IS NOT NULL
    FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE 'rt\_%\_a'
    EXCEPT
    SELECT
        split_part(j.tag, '_', 2), k.state, k.attempt, k.claims, k.run_at, k.visible_at,
        k.finished_at, k.updated_at, k.claimed_by, k.output, k.last_error, k.run_id IS NOT NULL
    FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE 'rt\_%\_b'
    $$,
    'Each row retried by filter should end exactly as its twin retried by id'
);

SELECT bag_eq(
    $$SELECT split_part(j.tag, '_', 3), s.name, s.compensation, s.status::text
      FROM j JOIN x_jobs.step AS s ON s.job_id = j.id WHERE j.tag LIKE 'rt\_%'$$,
    $$SELECT q.side, s.name, s.compensation, s.status
      FROM (VALUES ('a'), ('b')) AS q (side)
      CROSS JOIN (VALUES ('kept', FALSE, 'done'), ('shipped', FALSE, 'done')) AS s (name, compensation, status)
      CROSS JOIN (VALUES (1), (2)) AS two (n)$$,
    'A workflow retried by filter should resume with the steps still in effect, as retry(id) leaves them'
);

SELECT results_eq(
    $$SELECT count(*)::integer FROM x_jobs.job_error AS e JOIN j ON j.id = e.job_id WHERE j.tag LIKE 'rt\_%\_a'$$,
    $$VALUES (4)$$,
    'A row retried by filter should keep its error history'
);

-- Idempotency keys: a dead row whose key a live row holds is left, and of dead rows sharing a
-- key only the oldest is re-queued (it holds the key then). The walk goes on past them.
SET LOCAL "x_jobs.fake_now" = '2030-01-05 08:00:00+00';

CREATE TEMP TABLE keyed (n integer, tag text, idempotency_key text);
INSERT INTO keyed VALUES
(1, 'k_held_dead', 'K1'), (2, 'k_twin_old', 'K2'), (3, 'k_twin_new', 'K2'), (4, 'k_plain_1', NULL),
(5, 'k_plain_2', NULL);

DO $$
DECLARE
    v record;
    v_id bigint;
BEGIN
    FOR v IN SELECT k.tag, k.idempotency_key FROM keyed AS k ORDER BY k.n LOOP
        v_id := (x_jobs.enqueue('t42_k', queue => 't42-k', idempotency_key => v.idempotency_key, max_attempts => 1)).id;
        INSERT INTO pg_temp.j (tag, id) VALUES (v.tag, v_id);
        PERFORM x_jobs.claim(ARRAY['t42-k'], 't42-w6');
        PERFORM x_jobs.fail(v_id, 't42-w6', 'boom');
    END LOOP;
    -- K1 is taken again by a live job.
    INSERT INTO pg_temp.j (tag, id)
    VALUES ('k_live', (x_jobs.enqueue('t42_k', queue => 't42-k-live', idempotency_key => 'K1')).id);
END
$$;

SELECT ok(
    tap_helpers.jid('k_held_dead') < all(array(
        SELECT j.id FROM j
        WHERE j.tag LIKE 'k\_%' AND j.tag <> 'k_held_dead'
    )),
    'The row whose key a live row holds should be the oldest of the keyed fixture, so a walk meets it first'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't42-k', dry_run => TRUE),
    4::bigint,
    'A dry run should leave out a row whose key a live row holds, and count rows sharing a key each'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't42-k', max_rows => 2),
    2::bigint,
    'retry_jobs with max_rows should walk past the rows it leaves and re-queue max_rows of the others'
);

SELECT is(
    x_jobs.retry_jobs(queue => 't42-k', max_rows => 2),
    1::bigint,
    'The next call should re-queue what is left that it can, and answer below max_rows'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag LIKE 'k\_%' ORDER BY j.tag$$,
    $$VALUES ('k_held_dead', 'dead'), ('k_live', 'ready'), ('k_plain_1', 'ready'), ('k_plain_2', 'ready'),
             ('k_twin_new', 'dead'), ('k_twin_old', 'ready')$$,
    'retry_jobs should leave the row whose key is held, and of two rows sharing a key re-queue the oldest'
);

------------------------------------------------------------------------------------------------
-- Refusals
------------------------------------------------------------------------------------------------

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(state => 'done')$$,
    'XJ044',
    'X_STATE_NOT_ALLOWED: cannot cancel jobs that are done',
    'cancel_jobs should refuse a state that is not live'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(queue => 't42-x', state => 'cancelled', dry_run => TRUE)$$,
    'XJ044',
    'X_STATE_NOT_ALLOWED: cannot cancel jobs that are cancelled',
    'cancel_jobs should refuse the cancelled state, dry run or not'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(state => 'running')$$,
    'XJ044',
    'X_STATE_NOT_ALLOWED: cannot retry jobs that are running',
    'retry_jobs should refuse a live state'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(state => 'done')$$,
    'XJ044',
    'X_STATE_NOT_ALLOWED: cannot retry jobs that are done',
    'retry_jobs should refuse the done state'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(state => 'gone')$$,
    'XJ016',
    'X_STATE_UNKNOWN: ''gone'' is not a job state',
    'cancel_jobs should refuse a state that is no job state'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(state => 'Dead')$$,
    'XJ016',
    'X_STATE_UNKNOWN: ''Dead'' is not a job state',
    'retry_jobs should refuse a state that is no job state'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(max_rows => 0)$$,
    'XJ013',
    'X_QTY_INVALID: max_rows 0 is below 1',
    'cancel_jobs should refuse max_rows below 1'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(max_rows => -5, dry_run => TRUE)$$,
    'XJ013',
    'X_QTY_INVALID: max_rows -5 is below 1',
    'retry_jobs should refuse max_rows below 1, dry run or not'
);

SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(
        created_after => '2030-01-01 10:00:00+00', created_before => '2030-01-01 09:00:00+00'
    )$$,
    'XJ045',
    'X_RANGE_EMPTY: created_after 2030-01-01 10:00:00+00 is not before created_before 2030-01-01 09:00:00+00',
    'cancel_jobs should refuse a created range that holds no time (the bounds swapped)'
);

SELECT throws_ok(
    $$SELECT x_jobs.retry_jobs(created_after => '2030-01-01 10:00:00+00', created_before => '2030-01-01 10:00:00+00')$$,
    'XJ045',
    'X_RANGE_EMPTY: created_after 2030-01-01 10:00:00+00 is not before created_before 2030-01-01 10:00:00+00',
    'retry_jobs should refuse a created range of one instant (both bounds are exclusive)'
);

SELECT is_empty(
    $$
    SELECT c.q, e.err_state, e.err_hint
    FROM (VALUES
        ($q$SELECT x_jobs.cancel_jobs(state => 'done')$q$),
        ($q$SELECT x_jobs.retry_jobs(state => 'ready')$q$),
        ($q$SELECT x_jobs.cancel_jobs(state => 'gone')$q$),
        ($q$SELECT x_jobs.retry_jobs(max_rows => 0)$q$),
        ($q$SELECT x_jobs.cancel_jobs(created_after => now(), created_before => now())$q$)
    ) AS c (q)
    CROSS JOIN LATERAL tap_helpers.caught(c.q) AS e
    WHERE e.err_hint IS NULL OR pg_catalog.length(e.err_hint) < 20 OR e.err_hint NOT LIKE '%.'
    $$,
    'Every refusal of cancel_jobs and retry_jobs should carry a HINT, a sentence with the fix'
);

SELECT is(
    (SELECT count(*)::integer FROM (
        VALUES
        ($q$SELECT x_jobs.cancel_jobs(state => 'done')$q$),
        ($q$SELECT x_jobs.retry_jobs(state => 'ready')$q$),
        ($q$SELECT x_jobs.cancel_jobs(state => 'gone')$q$),
        ($q$SELECT x_jobs.retry_jobs(max_rows => 0)$q$),
        ($q$SELECT x_jobs.cancel_jobs(created_after => now(), created_before => now())$q$)
    ) AS c (q) CROSS JOIN LATERAL tap_helpers.caught(c.q)),
    5,
    'Each of those calls should have been refused'
);

SELECT * FROM finish();
ROLLBACK;
