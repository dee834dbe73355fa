-- Tenants: roles bound to tenants act only for them. Binding (bind_tenant, unbind_tenant,
-- tenant_bindings), the stamp on what a scoped caller writes, the narrowing by x_jobs.tenant,
-- and every function and granted table tried by a bound role against another tenant's rows:
-- each refuses as for a missing id, or sees nothing. Roles are reached by SET ROLE from the
-- superuser session (unbound); tests/python/test_tenants.py logs in as them.
BEGIN;
SELECT plan(53);

SET LOCAL "x_jobs.fake_now" = '2030-01-01 12:00:00+00';
SET LOCAL "x_jobs.notify" = 'off';

CREATE ROLE t46_acme NOLOGIN IN ROLE x_jobs_admin;
CREATE ROLE t46_multi NOLOGIN IN ROLE x_jobs_admin;
CREATE ROLE t46_free NOLOGIN IN ROLE x_jobs_admin;
CREATE ROLE t46_worker NOLOGIN IN ROLE x_jobs_worker;

-- Binding -----------------------------------------------------------------------------------

SELECT lives_ok(
    $$SELECT x_jobs.bind_tenant(role => 't46_acme', tenant => 'acme'),
             x_jobs.bind_tenant(role => 't46_acme', tenant => 'acme'),
             x_jobs.bind_tenant(role => 't46_multi', tenant => 'acme'),
             x_jobs.bind_tenant(role => 't46_multi', tenant => 'globex'),
             x_jobs.bind_tenant(role => 't46_worker', tenant => 'acme')$$,
    'An admin should be able to bind roles to tenants, and binding twice should change nothing'
);

SELECT results_eq(
    $$SELECT role::text COLLATE "default", tenant FROM x_jobs.tenant_bindings() WHERE role::text LIKE 't46%'$$,
    $$VALUES ('t46_acme', 'acme'), ('t46_multi', 'acme'), ('t46_multi', 'globex'), ('t46_worker', 'acme')$$,
    'tenant_bindings should list each binding once, by role and tenant'
);

SELECT throws_ok(
    $$SELECT x_jobs.bind_tenant(role => 't46_nobody', tenant => 'acme')$$,
    'XJ058', 'X_ROLE_UNKNOWN: no role is named t46_nobody',
    'Binding a role that does not exist should be refused'
);

SELECT throws_ok(
    $$SELECT x_jobs.bind_tenant(role => 't46_acme', tenant => '')$$,
    'XJ006', NULL,
    'Binding an empty tenant should be refused as an empty tenant_id is'
);

SELECT lives_ok(
    $$SELECT x_jobs.bind_tenant(role => 't46_free', tenant => 'tmp')$$,
    'The fixture: t46_free bound for a moment'
);
SELECT is(
    x_jobs.unbind_tenant(role => 't46_free', tenant => 'tmp'), TRUE,
    'unbind_tenant should answer true for a binding it removed'
);
SELECT is(
    x_jobs.unbind_tenant(role => 't46_free', tenant => 'tmp'), FALSE,
    'unbind_tenant should answer false for a binding that is not there'
);

-- The other tenant's rows, made by the superuser (unbound) --------------------------------------

CREATE TEMP TABLE u (tag text PRIMARY KEY, id bigint);
GRANT SELECT ON u TO public;

INSERT INTO u (tag, id)
VALUES
('ready', (x_jobs.enqueue('t46_job', queue => 't46-q', tenant_id => 'globex', idempotency_key => 'k1')).id),
('dead', (x_jobs.enqueue('t46_job', queue => 't46-dead', tenant_id => 'globex', max_attempts => 1)).id),
('outbox', x_jobs.outbox_put('t46-topic', '{"who": "globex"}'));
UPDATE x_jobs.outbox SET tenant_id = 'globex'
WHERE id = (
    SELECT id FROM u
    WHERE tag = 'outbox'
);

SELECT ok(
    (SELECT count(*) = 1 FROM x_jobs.claim(ARRAY['t46-dead'], 't46-w'))
    AND x_jobs.fail((
        SELECT id FROM u
        WHERE tag = 'dead'
    ), 't46-w', 'boom') = 'dead',
    'The fixture: globex''s second job is dead, with an error row'
);

-- A bound admin -------------------------------------------------------------------------------

SET ROLE t46_acme;

SELECT is(
    (x_jobs.enqueue('t46_job', queue => 't46-q', idempotency_key => 'k1')).deduped, FALSE,
    'An idempotency key another tenant uses should be free for this one (keys are per tenant)'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.job),
    1,
    'A bound role''s direct SELECT of x_jobs.job should see only its tenant''s rows'
);
SELECT is(
    (SELECT tenant_id FROM x_jobs.job),
    'acme',
    'An enqueue naming no tenant by a role bound to one should be stamped with it'
);
SELECT throws_ok(
    $$SELECT x_jobs.enqueue('t46_job', tenant_id => 'globex')$$,
    'XJ060', 'X_TENANT_OUT_OF_SCOPE: role t46_acme does not act for tenant ''globex''',
    'An enqueue naming another tenant should be refused'
);
SELECT throws_ok(
    $$SELECT * FROM x_jobs.enqueue_many('[{"name": "t46_job"}, {"name": "t46_job", "tenant_id": "globex"}]')$$,
    'XJ060', NULL,
    'enqueue_many naming another tenant in any request should be refused'
);
SELECT lives_ok(
    $$SELECT x_jobs.enqueue('t46_job', queue => 't46-q', tenant_id => 'acme')$$,
    'An enqueue naming the role''s own tenant should be accepted'
);

SELECT is_empty(
    $$SELECT * FROM x_jobs.result((SELECT id FROM u WHERE tag = 'ready'))$$,
    'result should answer no row for another tenant''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_detail((SELECT id FROM u WHERE tag = 'dead'))$$,
    'job_detail should answer no row for another tenant''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_errors((SELECT id FROM u WHERE tag = 'dead'))$$,
    'job_errors should answer no row for another tenant''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_steps((SELECT id FROM u WHERE tag = 'dead'))$$,
    'job_steps should answer no row for another tenant''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_states(ARRAY[(SELECT id FROM u WHERE tag = 'ready')])$$,
    'job_states should answer no row for another tenant''s job'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.list_jobs() WHERE tenant_id <> 'acme'$$,
    'list_jobs should list only the role''s tenant''s jobs'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.list_jobs(state => 'dead')$$,
    'list_jobs of a state only another tenant has should be empty'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_error$$,
    'A bound role''s direct SELECT of x_jobs.job_error should see no other tenant''s error'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.outbox$$,
    'A bound role''s direct SELECT of x_jobs.outbox should see no other tenant''s message'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.list_outbox()$$,
    'list_outbox should list no other tenant''s message'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.outbox_message((SELECT id FROM u WHERE tag = 'outbox'))$$,
    'outbox_message should answer no row for another tenant''s message'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job_counters()$$,
    'job_counters (per job name, over every tenant) should answer nothing to a bound role'
);
SELECT results_eq(
    $$SELECT queue, ready FROM x_jobs.queue_stats() WHERE queue LIKE 't46%'$$,
    $$VALUES ('t46-q'::text, 2::bigint)$$,
    'queue_stats should count only the role''s tenant''s rows'
);
SELECT is(
    x_jobs.cancel_jobs(queue => 't46-q', dry_run => TRUE), 2::bigint,
    'cancel_jobs should count only the role''s tenant''s rows'
);
SELECT is(
    x_jobs.retry_jobs(queue => 't46-dead', dry_run => TRUE), 0::bigint,
    'retry_jobs should find none of another tenant''s dead rows'
);
SELECT throws_ok(
    $$SELECT x_jobs.cancel_jobs(tenant_id => 'globex')$$,
    'XJ062', 'X_CROSS_TENANT: role t46_acme may not cancel the jobs of tenant ''globex''',
    'cancel_jobs filtered by another tenant should be refused as a cross-tenant act'
);
SELECT throws_ok(
    $$SELECT x_jobs.pause_queue('t46-q')$$,
    'XJ062', NULL,
    'A bound role should not pause a queue, which holds every tenant''s jobs'
);
SELECT x_jobs.outbox_put('t46-topic', '{"who": "acme"}') IS NOT NULL AS put;
SELECT results_eq(
    $$SELECT tenant_id FROM x_jobs.outbox$$, $$VALUES ('acme'::text)$$,
    'An outbox put by a bound role should be stamped with its tenant'
);

-- The oracle: the refusal of another tenant's id is the refusal of a missing id, byte for byte.
CREATE TEMP TABLE said (stmt text, tenant text, missing text);
GRANT ALL ON said TO public;
-- What a call answers when it fails: its SQLSTATE, message, detail and hint.
CREATE FUNCTION pg_temp.err(p_sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    v_detail text;
    v_hint text;
BEGIN
    EXECUTE p_sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_detail = PG_EXCEPTION_DETAIL, v_hint = PG_EXCEPTION_HINT;
    RETURN concat_ws(' | ', SQLSTATE, SQLERRM, v_detail, v_hint);
END
$$;
INSERT INTO said (stmt, tenant)
SELECT
    c AS stmt,
    pg_temp.err(format(c, (
        SELECT id FROM u
        WHERE tag = 'ready'
    ))) AS tenant
FROM unnest(ARRAY[
    'SELECT x_jobs.cancel(%s)', 'SELECT x_jobs.retry(%s)',
    'SELECT x_jobs.resolve_step(%s, ''s'')', 'SELECT x_jobs.steps(%s, ''t46-w'')',
    'SELECT x_jobs.step_record(%s, ''t46-w'', ''s'', ''{}'')',
    'SELECT x_jobs.outbox_redrive(ARRAY[%s])'
]) AS c;

RESET ROLE;
-- The other tenant's job gone, the same calls again, by the same role.
DELETE FROM x_jobs.job
WHERE id = (
    SELECT id FROM u
    WHERE tag = 'ready'
);
SET ROLE t46_acme;
UPDATE said SET missing = pg_temp.err(format(stmt, (
    SELECT id FROM u
    WHERE tag = 'ready'
)));

SELECT is_empty(
    $$SELECT stmt, tenant, missing FROM said WHERE tenant IS DISTINCT FROM missing$$,
    'Every call should refuse another tenant''s id with the very error it gives for a missing id'
);
SELECT is_empty(
    $$SELECT stmt FROM said WHERE tenant = 'no error' AND stmt NOT LIKE '%outbox_redrive%'$$,
    'Every call on an id should refuse a missing one (outbox_redrive counts what it redrove)'
);

-- x_jobs.tenant narrows ------------------------------------------------------------------------

SET LOCAL "x_jobs.tenant" = 'globex';
SELECT throws_ok(
    $$SELECT count(*) FROM x_jobs.job$$,
    'XJ060', 'X_TENANT_OUT_OF_SCOPE: role t46_acme does not act for tenant ''globex''',
    'x_jobs.tenant naming a tenant the role is not bound to should be refused'
);
SET LOCAL "x_jobs.tenant" = '';

SET ROLE t46_multi;
SELECT throws_ok(
    $$SELECT x_jobs.enqueue('t46_job', queue => 't46-q')$$,
    'XJ061', NULL,
    'An enqueue naming no tenant by a role bound to several should be refused as ambiguous'
);
SELECT throws_ok(
    $$SELECT x_jobs.outbox_put('t46-topic', '{}')$$,
    'XJ061', NULL,
    'An outbox put by a role bound to several tenants, none set, should be refused as ambiguous'
);
SET LOCAL "x_jobs.tenant" = 'globex';
SELECT (x_jobs.enqueue('t46_job', queue => 't46-m')).id IS NOT NULL AS enqueued;
SELECT results_eq(
    $$SELECT tenant_id FROM x_jobs.job WHERE queue = 't46-m'$$, $$VALUES ('globex'::text)$$,
    'SET LOCAL x_jobs.tenant should pick the tenant an ambiguous role stamps'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.job WHERE tenant_id <> 'globex'$$,
    'SET LOCAL x_jobs.tenant should narrow what a role bound to several tenants sees'
);
SET LOCAL "x_jobs.tenant" = '';
SELECT is(
    (SELECT count(DISTINCT tenant_id)::integer FROM x_jobs.job), 2,
    'A role bound to two tenants should see both, and only them'
);

SET ROLE t46_free;
SELECT is(
    (SELECT count(DISTINCT tenant_id)::integer FROM x_jobs.job), 2,
    'An unbound role should see every tenant''s rows'
);
SET LOCAL "x_jobs.tenant" = 'acme';
SELECT is_empty(
    $$SELECT * FROM x_jobs.job WHERE tenant_id <> 'acme'$$,
    'An unbound role''s x_jobs.tenant should narrow it to that tenant'
);
SET LOCAL "x_jobs.tenant" = '';

-- A bound worker claims its tenant's rows only -------------------------------------------------

RESET ROLE;
SELECT x_jobs.enqueue('t46_job', queue => 't46-w', tenant_id => 'globex');
SET ROLE t46_worker;
SELECT is_empty(
    $$SELECT * FROM x_jobs.claim(ARRAY['t46-w'], 't46-bw', qty => 10)$$,
    'A bound worker should claim none of another tenant''s ready rows'
);
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.claim(ARRAY['t46-q'], 't46-bw', qty => 10)),
    2,
    'A bound worker should claim its own tenant''s rows'
);

RESET ROLE;
SELECT is(
    (
        SELECT count(*)::integer FROM x_jobs.job
        WHERE queue = 't46-w' AND state = 'ready'
    ),
    1,
    'The other tenant''s row should still be ready'
);

-- A bound relay hands out and settles its tenant's messages only ------------------------------

RESET ROLE;
UPDATE x_jobs.outbox SET state = 'delivered', delivered_at = now()
WHERE state = 'pending';
SELECT x_jobs.outbox_put('t46-relay', '{"n": 1}');
SELECT x_jobs.outbox_put('t46-relay', '{"n": 2}', key => 'k');
UPDATE x_jobs.outbox SET tenant_id = 'globex'
WHERE topic = 't46-relay';
SELECT x_jobs.outbox_put('t46-relay', '{"n": 3}');
SELECT x_jobs.outbox_put('t46-relay', '{"n": 4}', key => 'k2');
UPDATE x_jobs.outbox SET tenant_id = 'acme'
WHERE topic = 't46-relay' AND tenant_id <> 'globex';
SET ROLE t46_worker;
SELECT results_eq(
    $$SELECT payload ->> 'n' FROM x_jobs.relay_outbox('t46-relay-1', 10) ORDER BY 1$$,
    $$VALUES ('3'), ('4')$$,
    'A bound relay should be handed its tenant''s messages only'
);
RESET ROLE;
SELECT is(
    (SELECT count(*)::integer FROM x_jobs.relay_outbox('t46-relay-2', 10)),
    2,
    'An unbound relay should be handed the other tenant''s messages'
);
INSERT INTO u (tag, id)
SELECT
    'globex-msg-' || id AS tag,
    id
FROM x_jobs.outbox
WHERE tenant_id = 'globex' AND topic = 't46-relay';
SET ROLE t46_worker;
SELECT is_empty(
    $$SELECT * FROM x_jobs.outbox_ack(ARRAY(SELECT id FROM u WHERE tag LIKE 'globex-msg-%'), 't46-relay-2')$$,
    'A bound relay should not acknowledge another tenant''s messages, even with their relay''s id'
);
SELECT is_empty(
    $$SELECT * FROM x_jobs.outbox_extend_lease(ARRAY(SELECT id FROM u WHERE tag LIKE 'globex-msg-%'), 't46-relay-2')$$,
    'A bound relay should not extend another tenant''s leases'
);
RESET ROLE;

-- A bound worker's queue counts are its tenants' ---------------------------------------------

SELECT x_jobs.enqueue('t46_job', queue => 't46-count', tenant_id => 'globex') FROM generate_series(1, 3);
SELECT x_jobs.enqueue('t46_job', queue => 't46-count', tenant_id => 'acme');
SELECT is(
    (
        SELECT demand FROM x_jobs.queue_demand()
        WHERE queue = 't46-count'
    ), 4::bigint,
    'An unbound caller''s queue_demand should count every tenant''s rows'
);
SET ROLE t46_worker;
SELECT is(
    (
        SELECT demand FROM x_jobs.queue_demand()
        WHERE queue = 't46-count'
    ), 1::bigint,
    'A bound worker''s queue_demand should count its tenant''s rows only'
);
SELECT results_eq(
    $$SELECT ready, demand FROM x_jobs.queue_gauges(max_age => '1 hour', queues => ARRAY['t46-count'])
      WHERE queue = 't46-count'$$,
    $$VALUES (1::bigint, 1::bigint)$$,
    'A bound worker''s queue_gauges should count its tenant''s rows only'
);
RESET ROLE;
SELECT results_eq(
    $$SELECT ready, demand FROM x_jobs.queue_gauges(max_age => '1 hour', queues => ARRAY['t46-count'])
      WHERE queue = 't46-count'$$,
    $$VALUES (4::bigint, 4::bigint)$$,
    'An unbound caller''s queue_gauges should count every tenant''s rows, the bound one having stored nothing'
);

SELECT * FROM finish();
ROLLBACK;
