-- x_jobs.extend_lease, the heartbeat: it moves the lease of the running rows the worker holds to
-- now + lease and answers their ids; a row held by another worker, settled, or cancelled is left
-- out of the answer and left as it is. The clock is moved with SET LOCAL "x_jobs.fake_now".
BEGIN;
SELECT plan(20);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:00+00';

CREATE TEMP TABLE j (tag text PRIMARY KEY, id bigint NOT NULL);

-- Each job has a queue of its own, so a claim picks exactly the jobs it names.
INSERT INTO j (tag, id)
SELECT
    t.tag,
    e.id
FROM unnest(ARRAY['a', 'b', 'other', 'done', 'cancelled', 'dflt', 'lapsed']) AS t (tag)
CROSS JOIN LATERAL x_jobs.enqueue('t32_' || t.tag, queue => 't32-' || t.tag) AS e;

CREATE TEMP TABLE claims AS
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(
    ARRAY['t32-a', 't32-b', 't32-done', 't32-cancelled', 't32-dflt', 't32-lapsed'], 'w1',
    lease => '30 seconds', qty => 10
) AS c;

INSERT INTO claims (id, claimed_by)
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(ARRAY['t32-other'], 'w2', lease => '30 seconds') AS c;

SELECT set_eq(
    'SELECT id, claimed_by FROM claims',
    'SELECT id, CASE WHEN tag = ''other'' THEN ''w2'' ELSE ''w1'' END FROM j',
    'Every job of the test should be running, held by its worker, before the heartbeats'
);

DO $$
BEGIN
    PERFORM x_jobs.complete(tap_helpers.jid('done'), 'w1');
    PERFORM x_jobs.cancel(tap_helpers.jid('cancelled'));
END
$$;

CREATE TEMP TABLE snap AS
SELECT * FROM x_jobs.job
WHERE id IN (SELECT j.id FROM j);

------------------------------------------------------------------------------------------------
-- The held rows are extended and answered; the others are neither
------------------------------------------------------------------------------------------------

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:00:10+00';

SELECT set_eq(
    $$SELECT * FROM x_jobs.extend_lease(
        ARRAY[tap_helpers.jid('a'), tap_helpers.jid('b'), tap_helpers.jid('other'), tap_helpers.jid('done'),
              tap_helpers.jid('cancelled'), -1],
        'w1', '2 minutes')$$,
    ARRAY[tap_helpers.jid('a'), tap_helpers.jid('b')],
    'extend_lease should answer only the ids of the running rows the worker holds'
);

SELECT results_eq(
    $$SELECT j.tag, k.state::text, k.claimed_by, k.visible_at, k.updated_at
      FROM j JOIN x_jobs.job AS k ON k.id = j.id WHERE j.tag IN ('a', 'b') ORDER BY j.tag$$,
    $$VALUES ('a', 'running', 'w1', '2030-01-01 10:02:10+00'::timestamptz, '2030-01-01 10:00:10+00'::timestamptz),
             ('b', 'running', 'w1', '2030-01-01 10:02:10+00'::timestamptz, '2030-01-01 10:00:10+00'::timestamptz)$$,
    'extend_lease should move visible_at of the held rows to now + lease, and keep them running'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job
      WHERE id IN (tap_helpers.jid('other'), tap_helpers.jid('done'), tap_helpers.jid('cancelled'))$$,
    $$SELECT * FROM snap
      WHERE id IN (tap_helpers.jid('other'), tap_helpers.jid('done'), tap_helpers.jid('cancelled'))$$,
    'extend_lease should leave unchanged the rows of another worker, done rows and cancelled rows'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('other')], 'w2', '1 minute')$$,
    ARRAY[tap_helpers.jid('other')],
    'The worker that holds a row should be able to extend it'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('dflt')], 'w1')$$,
    ARRAY[tap_helpers.jid('dflt')],
    'extend_lease without a lease should extend the held row'
);

SELECT is(
    (
        SELECT visible_at FROM x_jobs.job
        WHERE id = tap_helpers.jid('dflt')
    ),
    '2030-01-01 10:00:40+00'::timestamptz,
    'extend_lease without a lease should move visible_at to now + 30 seconds'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[]::bigint[], 'w1', '1 minute')$$,
    'extend_lease of no ids should answer nothing'
);

------------------------------------------------------------------------------------------------
-- The extended lease is what a claim honours
------------------------------------------------------------------------------------------------

-- 10:01:00: the first leases (to 10:00:30) would have lapsed; a's and b's run to 10:02:10.
SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:01:00+00';

SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['t32-a', 't32-b'], 'w3', qty => 10)$$,
    'A claim should not take a row whose extended lease has not run out'
);

-- The lapsed row was not extended: w2 takes it over.
INSERT INTO claims (id, claimed_by)
SELECT
    c.id,
    c.claimed_by
FROM x_jobs.claim(ARRAY['t32-lapsed'], 'w2', lease => '30 seconds') AS c;

SELECT results_eq(
    $$SELECT claimed_by, visible_at FROM x_jobs.job WHERE id = tap_helpers.jid('lapsed')$$,
    $$VALUES ('w2', '2030-01-01 10:01:30+00'::timestamptz)$$,
    'A row whose lease lapsed should be re-claimed by another worker'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('lapsed')], 'w1', '10 minutes')$$,
    'extend_lease should not answer the id of a row another worker re-claimed'
);

SELECT results_eq(
    $$SELECT claimed_by, visible_at FROM x_jobs.job WHERE id = tap_helpers.jid('lapsed')$$,
    $$VALUES ('w2', '2030-01-01 10:01:30+00'::timestamptz)$$,
    'The heartbeat of the old worker should leave the new holder''s lease as it was'
);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 10:02:11+00';

SELECT set_eq(
    $$SELECT id FROM x_jobs.claim(ARRAY['t32-a'], 'w3')$$,
    ARRAY[tap_helpers.jid('a')],
    'Once the extended lease has run out, a claim should take the row'
);

------------------------------------------------------------------------------------------------
-- Refusals
------------------------------------------------------------------------------------------------

CREATE TEMP TABLE snap_b AS
SELECT * FROM x_jobs.job
WHERE id = tap_helpers.jid('b');

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], '', '1 minute')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id '''' is empty',
    'extend_lease should refuse an empty worker id'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], NULL, '1 minute')$$,
    'XJ011',
    'X_WORKER_INVALID: worker id NULL is empty',
    'extend_lease should refuse a NULL worker id'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], 'w1', '0')$$,
    'XJ012',
    pg_catalog.format('X_LEASE_INVALID: lease %s is not positive', interval '0'),
    'extend_lease should refuse a zero lease'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], 'w1', '-5 seconds')$$,
    'XJ012',
    pg_catalog.format('X_LEASE_INVALID: lease %s is not positive', interval '-5 seconds'),
    'extend_lease should refuse a negative lease'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], 'w1', NULL)$$,
    'XJ012',
    'X_LEASE_INVALID: lease NULL is not positive',
    'extend_lease should refuse a NULL lease'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.extend_lease(ARRAY[tap_helpers.jid('b')], 'w1', '300000 years')$$,
    'XJ012',
    'X_LEASE_INVALID: lease 300000 years is longer than 1000 years',
    'extend_lease should refuse a lease of millennia'
);

SELECT set_eq(
    $$SELECT * FROM x_jobs.job WHERE id = tap_helpers.jid('b')$$,
    'SELECT * FROM snap_b',
    'A refused heartbeat should leave the lease as it was'
);

SELECT * FROM finish();
ROLLBACK;
