-- Who may receive webhooks, and what a webhook id is unique within. receive_webhook is the
-- receiver's role's alone (x_jobs_webhook): a producer, or an admin, that could record an id
-- ahead of the sender would have the real, signed delivery of it answered as a duplicate and
-- dropped. Ids are unique per source and tenant (x_jobs._webhook_tenant: the request's
-- tenant_id, else 'none'): two tenants may receive one id from one source, each its own job,
-- and each redelivery is a duplicate of its own tenant's receipt only. Logins are made here and
-- rolled back with the test; each block runs under SET ROLE and ends with RESET ROLE. On 0.4.1
-- the producer's call succeeds and the second tenant's receipt is answered as the first's
-- duplicate.
BEGIN;
SELECT plan(13);

CREATE ROLE t39_receiver LOGIN;
CREATE ROLE t39_producer LOGIN;
CREATE ROLE t39_admin LOGIN;
GRANT x_jobs_webhook TO t39_receiver;
GRANT x_jobs_producer TO t39_producer;
GRANT x_jobs_admin TO t39_admin;

-- The grants ---------------------------------------------------------------------------------

SET ROLE t39_producer;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook('t39-shop', 'msg_early', 't39_paid', '{"n": 0}')$$,
    '42501',
    'permission denied for function receive_webhook',
    'A producer login should be refused receive_webhook, so that it cannot record an id ahead of its delivery'
);

RESET ROLE;
SET ROLE t39_admin;

SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook('t39-shop', 'msg_early', 't39_paid', '{"n": 0}')$$,
    '42501',
    'permission denied for function receive_webhook',
    'An admin login should be refused receive_webhook too: x_jobs_admin is no member of x_jobs_webhook'
);

RESET ROLE;

SELECT is_empty(
    $$SELECT * FROM x_jobs.webhook_ledger WHERE source = 't39-shop'$$,
    'The refused calls should have recorded no webhook id'
);

SELECT ok(
    pg_catalog.has_function_privilege(
        'x_jobs_webhook', 'x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb)', 'EXECUTE'
    )
    AND NOT pg_catalog.has_function_privilege(
        'x_jobs_producer', 'x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb)', 'EXECUTE'
    ),
    'x_jobs_webhook should be the role that may run receive_webhook, and x_jobs_producer not'
);

-- The tenant helper --------------------------------------------------------------------------

SELECT results_eq(
    $$VALUES
        (x_jobs._webhook_tenant(NULL)),
        (x_jobs._webhook_tenant('{}')),
        (x_jobs._webhook_tenant('{"priority": 3}')),
        (x_jobs._webhook_tenant('{"tenant_id": "acme"}'))$$,
    $$VALUES ('none'), ('none'), ('none'), ('acme')$$,
    '_webhook_tenant should answer the request''s tenant_id, else ''none'''
);

-- One id, two tenants ------------------------------------------------------------------------

SET ROLE t39_receiver;

CREATE TEMP TABLE t39_got (tenant text, job_id bigint, duplicate boolean);

INSERT INTO t39_got
SELECT
    'acme' AS tenant,
    w.job_id,
    w.duplicate
FROM x_jobs.receive_webhook('t39-shop', 'msg_1', 't39_paid', '{"n": 1}', request => '{"tenant_id": "acme"}') AS w;

INSERT INTO t39_got
SELECT
    'globex' AS tenant,
    w.job_id,
    w.duplicate
FROM x_jobs.receive_webhook('t39-shop', 'msg_1', 't39_paid', '{"n": 2}', request => '{"tenant_id": "globex"}') AS w;

INSERT INTO t39_got
SELECT
    'none' AS tenant,
    w.job_id,
    w.duplicate
FROM x_jobs.receive_webhook('t39-shop', 'msg_1', 't39_paid', '{"n": 3}') AS w;

SELECT results_eq(
    $$SELECT g.tenant, g.duplicate FROM t39_got AS g ORDER BY g.tenant$$,
    $$VALUES ('acme', FALSE), ('globex', FALSE), ('none', FALSE)$$,
    'Two tenants (and the tenant none) should each receive the same webhook id from one source as new'
);

SELECT is(
    (SELECT count(DISTINCT g.job_id)::integer FROM t39_got AS g),
    3,
    'Each tenant''s receipt of the id should have become a job of its own'
);

SELECT results_eq(
    $$SELECT w.job_id, w.duplicate
      FROM x_jobs.receive_webhook('t39-shop', 'msg_1', 't39_paid', '{"n": 9}', request => '{"tenant_id": "globex"}') AS w$$,
    $$SELECT g.job_id, TRUE FROM t39_got AS g WHERE g.tenant = 'globex'$$,
    'A redelivery for one tenant should be a duplicate of that tenant''s receipt, not of another''s'
);

SELECT results_eq(
    $$SELECT w.job_id, w.duplicate FROM x_jobs.receive_webhook('t39-shop', 'msg_1', 't39_paid', '{"n": 9}') AS w$$,
    $$SELECT g.job_id, TRUE FROM t39_got AS g WHERE g.tenant = 'none'$$,
    'A redelivery that names no tenant should be a duplicate of the tenant none''s receipt'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.webhook_ledger$$,
    '42501',
    'permission denied for table webhook_ledger',
    'The receiver''s login should not read the ledger (other tenants'' ids)'
);

RESET ROLE;

SELECT results_eq(
    $$SELECT l.tenant_id, k.tenant_id, k.input ->> 'n'
      FROM x_jobs.webhook_ledger AS l
      INNER JOIN x_jobs.job AS k ON l.job_id = k.id
      WHERE l.source = 't39-shop' AND l.webhook_id = 'msg_1'
      ORDER BY l.tenant_id$$,
    $$VALUES ('acme', 'acme', '1'), ('globex', 'globex', '2'), ('none', 'none', '3')$$,
    'Each ledger row should name its tenant, the same as the job it became, with the first receipt''s input'
);

SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job AS k
        WHERE k.name = 't39_paid'
    ),
    3,
    'The redeliveries should have enqueued nothing'
);

-- Another source's id is its own, within one tenant too.
SET ROLE t39_receiver;

SELECT is(
    (
        SELECT w.duplicate
        FROM x_jobs.receive_webhook('t39-bank', 'msg_1', 't39_paid', '{"n": 4}', request => '{"tenant_id": "acme"}')
            AS w
    ),
    FALSE,
    'The same id from another source for the same tenant should be new'
);

RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
