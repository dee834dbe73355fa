-- Webhooks and tenants together: a receiver login bound to a tenant records its deliveries for
-- that tenant (the ledger row and the job name the same one), may not record one for another
-- tenant, and an admin bound to a tenant sees only its tenant's ledger rows (row-level security,
-- forced). Roles are reached by SET ROLE and rolled back with the test.
BEGIN;
SELECT plan(7);

CREATE ROLE t48_receiver NOLOGIN IN ROLE x_jobs_webhook;
CREATE ROLE t48_admin NOLOGIN IN ROLE x_jobs_admin;
SELECT x_jobs.bind_tenant(role => 't48_receiver', tenant => 'acme');
SELECT x_jobs.bind_tenant(role => 't48_admin', tenant => 'globex');

-- Globex's receipt of msg_1, by an unbound receiver (the request names the tenant).
SELECT is(
    (SELECT r.duplicate FROM x_jobs.receive_webhook(
        source => 't48-shop', webhook_id => 'msg_1', name => 't48_paid', request => '{"tenant_id": "globex"}'
    ) AS r),
    FALSE,
    'An unbound receiver should record a delivery for the tenant its request names'
);

SET ROLE t48_receiver;

CREATE TEMP TABLE t48_acme_receipt ON COMMIT DROP AS
SELECT
    r.job_id,
    r.duplicate
FROM x_jobs.receive_webhook(source => 't48-shop', webhook_id => 'msg_1', name => 't48_paid') AS r;

SELECT is(
    (SELECT duplicate FROM t48_acme_receipt), FALSE,
    'The same id from the same source should be a new receipt for the bound receiver''s own tenant'
);

SELECT throws_ok(
    $$SELECT * FROM x_jobs.receive_webhook(
        source => 't48-shop', webhook_id => 'msg_2', name => 't48_paid', request => '{"tenant_id": "globex"}'
    )$$,
    'XJ060',
    NULL,
    'A receiver bound to acme should be refused a delivery for globex'
);

SELECT is(
    (
        SELECT r.duplicate
        FROM x_jobs.receive_webhook(source => 't48-shop', webhook_id => 'msg_1', name => 't48_paid') AS r
    ),
    TRUE,
    'A redelivery to the bound receiver should be a duplicate of its tenant''s receipt'
);

RESET ROLE;

SELECT is(
    (
        SELECT j.tenant_id
        FROM x_jobs.job AS j
        WHERE j.id = (SELECT a.job_id FROM t48_acme_receipt AS a)
    ),
    'acme',
    'The bound receiver''s job should be stamped with its tenant, as its ledger row is'
);

SELECT results_eq(
    $$SELECT l.tenant_id FROM x_jobs.webhook_ledger AS l WHERE l.source = 't48-shop' ORDER BY l.tenant_id$$,
    $$VALUES ('acme'::text), ('globex'::text)$$,
    'The ledger should hold one receipt of msg_1 per tenant'
);

SET ROLE t48_admin;

SELECT results_eq(
    $$SELECT l.tenant_id FROM x_jobs.webhook_ledger AS l WHERE l.source = 't48-shop'$$,
    $$VALUES ('globex'::text)$$,
    'An admin bound to globex should see only globex''s ledger rows'
);

RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
