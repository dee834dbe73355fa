\echo Use "ALTER EXTENSION x_jobs UPDATE TO '0.4.2'" to load this file. \quit

-- 0.4.1 -> 0.4.2: the claim's plans no longer depend on whether x_jobs.job has statistics
-- (no sequential or bitmap scans), so a worker that first claimed on an empty table keeps up;
-- the outbox relay's likewise. Schedules: cron expressions in SQL, ticked by any number of
-- callers with no leader (x_jobs.schedule, set_schedule, tick_schedules, cron_next, ...).
-- Webhooks are received by a role of their own, x_jobs_webhook, and no longer by producers (who
-- could record an id ahead of its signed delivery and have that dropped as a duplicate); their
-- ids are unique per source and tenant.

--@function x_jobs.version
--@function x_jobs.claim
--@function x_jobs.relay_outbox
--@function x_jobs._caller

-- The role x_jobs_webhook: made by _setup_roles, run again here (an update by a role that may
-- not create it is refused with the statements an administrator runs first), and checked by
-- health.
--@function x_jobs._role_problems
--@function x_jobs._setup_roles
SELECT x_jobs._setup_roles();
--@function x_jobs.health

-- Webhook ids are unique per source and tenant. The rows from before belong to the tenant 'none',
-- as their jobs are unless the request named one (their ids stay unique per source: adding a
-- column to the key keeps them distinct). The default fills them in one rewrite-free step and
-- goes again, as the fresh table has none.
ALTER TABLE x_jobs.webhook_ledger ADD COLUMN tenant_id text NOT NULL DEFAULT 'none';
ALTER TABLE x_jobs.webhook_ledger ALTER COLUMN tenant_id DROP DEFAULT;
ALTER TABLE x_jobs.webhook_ledger
DROP CONSTRAINT webhook_ledger_pkey,
ADD CONSTRAINT webhook_ledger_pkey PRIMARY KEY (source, tenant_id, webhook_id);
--@function x_jobs._webhook_tenant
--@function x_jobs.receive_webhook

-- A cron expression as x_jobs._cron_parse reads it: the values each field allows, sorted (the
-- weekdays from 0, Sunday, to 6), and two flags. day_and: the day-of-month and day-of-week
-- fields both have to match (one of them starts with '*'); otherwise either does, as Vixie cron
-- has it. fixed: neither the minute nor the hour field starts with '*', so that the schedule
-- keeps to the wall clock across a change of UTC offset (a time the clock skips fires once at the
-- first valid instant after it, a time it repeats fires at its first occurrence only); a schedule
-- that is not fixed fires as the clock reads, at every instant whose local time matches.
CREATE TYPE x_jobs.cron_fields AS (
    minutes integer[], -- noqa: LT01
    hours integer[], -- noqa: LT01
    days integer[], -- noqa: LT01
    months integer[], -- noqa: LT01
    weekdays integer[], -- noqa: LT01
    day_and boolean,
    fixed boolean
);

-- One row per schedule. next_fire_at is the instant it fires next, stored: whoever ticks
-- (x_jobs.tick_schedules) reads it from here, so no restart, deploy or hand-off forgets a fire,
-- and a schedule paused or down for a while catches up by its policy when it is due again.
-- The enqueue options are those of x_jobs.enqueue, NULL leaving them to the job's declaration.
CREATE TABLE x_jobs.schedule (
    name text NOT NULL, -- noqa: RF04
    job text NOT NULL,
    cron text NOT NULL,
    tz text NOT NULL,
    fields x_jobs.cron_fields NOT NULL, -- noqa: RF04
    input jsonb NOT NULL, -- noqa: RF04
    queue text,
    priority integer,
    max_attempts integer,
    tenant_id text,
    concurrency_key text,
    concurrency_limit integer,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    catchup text NOT NULL,
    catchup_max integer NOT NULL,
    overlap text NOT NULL,
    grace interval NOT NULL,
    paused boolean NOT NULL DEFAULT FALSE,
    next_fire_at timestamptz NOT NULL,
    last_fire_at timestamptz,
    last_enqueued_at timestamptz,
    last_job_id bigint,
    fires bigint NOT NULL DEFAULT 0,
    skips bigint NOT NULL DEFAULT 0,
    last_error text,
    origin text,
    declared_by text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT schedule_pkey PRIMARY KEY (name),
    CONSTRAINT schedule_catchup_known CHECK (catchup IN ('latest', 'all', 'none')),
    CONSTRAINT schedule_overlap_known CHECK (overlap IN ('allow', 'skip')),
    CONSTRAINT schedule_catchup_max_positive CHECK (catchup_max >= 1)
);

COMMENT ON TABLE x_jobs.schedule IS
'Schedules: a cron expression in a time zone, the job it enqueues, and when it fires next.';
COMMENT ON COLUMN x_jobs.schedule.next_fire_at IS
'The next instant to fire; a tick fires every schedule whose instant has come.';
COMMENT ON COLUMN x_jobs.schedule.catchup IS
'After missed instants: latest (one run, the last), all (each, up to catchup_max), none (none past grace).';
COMMENT ON COLUMN x_jobs.schedule.overlap IS
'allow: every instant enqueues; skip: no new run while one of the schedule''s is live.';
COMMENT ON COLUMN x_jobs.schedule.grace IS
'How late a run may be enqueued and not be late (_schedule.late); with catchup none, the latest it still fires.';
COMMENT ON COLUMN x_jobs.schedule.last_fire_at IS
'The instant of the last job the schedule enqueued (that job''s _schedule.at), by a tick or by hand.';
COMMENT ON COLUMN x_jobs.schedule.skips IS
'Instants that enqueued no job: deduped onto a live run, refused by enqueue, passed over by a catch-up (one a tick).';
COMMENT ON COLUMN x_jobs.schedule.origin IS
'Who keeps the schedule: ''code'' for an app''s declarations (sync may prune them), NULL for SQL.';

-- A tick reads the due rows from the first: one probe of an empty range while nothing is due,
-- whatever the number of schedules. Paused rows are in no entry.
CREATE INDEX schedule_due_idx ON x_jobs.schedule (next_fire_at) WHERE NOT paused;

-- What x_jobs.list_schedules and the functions that change a schedule answer: the row without
-- its parsed fields, with the state of the last job it enqueued.
CREATE TYPE x_jobs.schedule_info AS (
    name text, -- noqa: RF04
    job text,
    cron text,
    tz text,
    input jsonb, -- noqa: RF04
    queue text,
    priority integer,
    max_attempts integer,
    tenant_id text,
    concurrency_key text,
    concurrency_limit integer,
    dead_letter boolean,
    backoff_base interval,
    backoff_max interval,
    keep_done boolean,
    catchup text,
    catchup_max integer,
    overlap text,
    grace interval,
    paused boolean,
    next_fire_at timestamptz,
    last_fire_at timestamptz,
    last_enqueued_at timestamptz,
    last_job_id bigint,
    last_job_state x_jobs.job_state,
    fires bigint,
    skips bigint,
    last_error text,
    origin text,
    declared_by text,
    created_at timestamptz,
    updated_at timestamptz
);

SELECT pg_catalog.pg_extension_config_dump('x_jobs.schedule', '');

--@function x_jobs.error_codes
--@function x_jobs._cron_field
--@function x_jobs._cron_parse
--@function x_jobs._cron_match_after
--@function x_jobs._zone_change
--@function x_jobs._cron_next
--@function x_jobs._cron_last
--@function x_jobs._require_time_zone
--@function x_jobs.cron_next
--@function x_jobs._schedule_request
--@function x_jobs._schedule_due
--@function x_jobs._schedule_info
--@function x_jobs._schedule_not_found
--@function x_jobs.set_schedule
--@function x_jobs.drop_schedule
--@function x_jobs.pause_schedule
--@function x_jobs.resume_schedule
--@function x_jobs.list_schedules
--@function x_jobs.run_schedule_now
--@function x_jobs.tick_schedules

-- The fence: a claim is a credential. A worker id is bound to the login that first claims or
-- announces with it (x_jobs.worker_login, x_jobs._fence), and only that login acts on the runs
-- it holds; the settles, heartbeats, releases, steps, progress and hand_back take the attempt
-- the claim answered, as an optional last argument, so a stale attempt settles nothing. The
-- ids claimed before this update are bound at their first use (no login is known for them).
CREATE TABLE x_jobs.worker_login (
    worker text NOT NULL,
    login name NOT NULL, -- noqa: RF04
    bound_at timestamptz NOT NULL,
    CONSTRAINT worker_login_pkey PRIMARY KEY (worker)
);

COMMENT ON TABLE x_jobs.worker_login IS
'The login each worker id is bound to: only it may act on the runs the id holds.';

-- A new trailing parameter is a new signature: the old functions go, and with them their grants.
DROP FUNCTION x_jobs.complete(bigint, text, jsonb);
DROP FUNCTION x_jobs.complete_many(bigint[], text, jsonb[]);
DROP FUNCTION x_jobs.fail(bigint, text, text, text, interval, boolean);
DROP FUNCTION x_jobs.extend_lease(bigint[], text, interval);
DROP FUNCTION x_jobs.release(bigint[], text);
DROP FUNCTION x_jobs.hand_back(bigint[], text, interval);
DROP FUNCTION x_jobs.progress(bigint, text, double precision, double precision, text);
DROP FUNCTION x_jobs.steps(bigint, text);
DROP FUNCTION x_jobs.step_record(bigint, text, text, jsonb, text, boolean);
DROP FUNCTION x_jobs.step_sleep(bigint, text, text, interval);
DROP FUNCTION x_jobs.step_wait(bigint, text, text, text, text, jsonb, interval, timestamptz);
DROP FUNCTION x_jobs._require_held(bigint, text, text);

-- Events: the wait and the publish lock rows of x_jobs.event_lock, not advisory locks, which any
-- login could take and so hold back an event's publishes and waits.
CREATE TABLE x_jobs.event_lock (
    kind smallint NOT NULL,
    slot integer NOT NULL,
    CONSTRAINT event_lock_pkey PRIMARY KEY (kind, slot)
);

INSERT INTO x_jobs.event_lock (kind, slot)
SELECT
    k.kind,
    s.slot
FROM generate_series(1, 2) AS k (kind)
CROSS JOIN generate_series(0, 4095) AS s (slot);

--@function x_jobs._lock_event
--@function x_jobs.publish

--@function x_jobs._fence
--@function x_jobs._require_fence
--@function x_jobs._require_attempts
--@function x_jobs._attempt_map
--@function x_jobs.complete_many
--@function x_jobs.complete
--@function x_jobs.fail
--@function x_jobs.extend_lease
--@function x_jobs.release
--@function x_jobs.hand_back
--@function x_jobs._require_held
--@function x_jobs.steps
--@function x_jobs.step_record
--@function x_jobs.step_sleep
--@function x_jobs.step_wait
--@function x_jobs.progress
--@function x_jobs.announce_worker
-- Tenants (issue 23): roles bound to tenants act only for them; events and outbox messages carry
-- their tenant; idempotency keys and event keys are unique per tenant; row-level security,
-- forced, on the tables roles read.
CREATE TABLE x_jobs.tenant_binding (
    role name NOT NULL, -- noqa: RF04
    tenant text NOT NULL,
    bound_at timestamptz NOT NULL,
    bound_by text NOT NULL,
    CONSTRAINT tenant_binding_pkey PRIMARY KEY (role, tenant),
    CONSTRAINT tenant_binding_tenant_valid CHECK (tenant <> '' AND pg_catalog.length(tenant) <= 200)
);

COMMENT ON TABLE x_jobs.tenant_binding IS
'Roles bound to tenants: a role with rows here acts only for those tenants.';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.tenant_binding', '');

ALTER TABLE x_jobs.event ADD COLUMN tenant_id text NOT NULL DEFAULT 'none';
ALTER TABLE x_jobs.outbox ADD COLUMN tenant_id text NOT NULL DEFAULT 'none';

DROP INDEX x_jobs.event_name_idx;
CREATE INDEX event_name_idx ON x_jobs.event (tenant_id, name, published_at);
DROP INDEX x_jobs.event_key_idx;
CREATE INDEX event_key_idx ON x_jobs.event (tenant_id, name, key, published_at)
WHERE key IS NOT NULL;

DROP INDEX x_jobs.job_idempotency_key_idx;
CREATE UNIQUE INDEX job_idempotency_key_idx ON x_jobs.job (tenant_id, idempotency_key)
WHERE idempotency_key IS NOT NULL AND state IN ('ready', 'delayed', 'suspended', 'running');

ALTER TYPE x_jobs.outbox_entry ADD ATTRIBUTE tenant_id text;

--@function x_jobs._tenant_scope
--@function x_jobs._stamp_tenant
--@function x_jobs._refuse_cross_tenant
--@function x_jobs.bind_tenant
--@function x_jobs.unbind_tenant
--@function x_jobs.tenant_bindings
--@function x_jobs._enqueue
--@function x_jobs.result
--@function x_jobs.outbox_put
--@function x_jobs.outbox_put_many
--@function x_jobs.cancel_jobs
--@function x_jobs.retry_jobs
--@function x_jobs.pause_queue
--@function x_jobs.resume_queue
--@function x_jobs.queue_stats
--@function x_jobs.job_counters
--@function x_jobs.list_outbox
--@function x_jobs.outbox_message

ALTER TABLE x_jobs.job ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.job FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.job
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.outbox ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.outbox FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.outbox
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.event ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.event FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.event
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

ALTER TABLE x_jobs.job_error ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.job_error FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.job_error
USING (
    (SELECT x_jobs._tenant_scope()) IS NULL
    OR EXISTS (
        SELECT FROM x_jobs.job AS j
        WHERE j.id = job_error.job_id AND j.tenant_id = any((SELECT x_jobs._tenant_scope())::text[])
    )
);

ALTER TABLE x_jobs.step ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.step FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.step
USING (
    (SELECT x_jobs._tenant_scope()) IS NULL
    OR EXISTS (
        SELECT FROM x_jobs.job AS j
        WHERE j.id = step.job_id AND j.tenant_id = any((SELECT x_jobs._tenant_scope())::text[])
    )
);
-- Rate limits per key (x_jobs.rate_limit, set_rate_limit, drop_rate_limit, rate_limits), named
-- by a job at enqueue or by its declaration (rate_limit_key), enforced by the claim. The jobs'
-- keys are in a table of their own, x_jobs.job_rate: a column of x_jobs.job would change the
-- row type claim returns, and a claim of 0.4.1 in flight while this update commits would fail
-- (see CHANGELOG). The attribute and the declaration's column go last, as a fresh install has
-- them.
ALTER TYPE x_jobs.enqueue_request ADD ATTRIBUTE rate_limit_key text;
ALTER TABLE x_jobs.job_type ADD COLUMN rate_limit_key text;

CREATE TABLE x_jobs.rate_limit (
    key text NOT NULL, -- noqa: RF04
    max_starts integer NOT NULL,
    per interval NOT NULL, -- noqa: RF04
    window_start timestamptz,
    starts integer NOT NULL DEFAULT 0, -- noqa: RF04
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT rate_limit_pkey PRIMARY KEY (key),
    CONSTRAINT rate_limit_max_starts_positive CHECK (max_starts >= 1),
    CONSTRAINT rate_limit_per_positive CHECK (per > interval '0')
);

COMMENT ON TABLE x_jobs.rate_limit IS
'Rate limits per key: at most max_starts claims of the key''s jobs per fixed window of length per.';

CREATE TABLE x_jobs.job_rate (
    job_id bigint NOT NULL,
    rate_limit_key text NOT NULL,
    queue text NOT NULL,
    priority smallint NOT NULL,
    run_at timestamptz NOT NULL,
    parked_state x_jobs.job_state,
    CONSTRAINT job_rate_pkey PRIMARY KEY (job_id)
);

COMMENT ON TABLE x_jobs.job_rate IS
'The rate limit key of each job that names one; parked_state set: the job waits for the key''s budget.';

CREATE INDEX job_rate_parked_idx ON x_jobs.job_rate (queue, rate_limit_key, priority, run_at, job_id)
WHERE parked_state IS NOT NULL;

SELECT pg_catalog.pg_extension_config_dump('x_jobs.rate_limit', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.job_rate', '');

-- enqueue takes rate_limit_key, last: a new signature.
DROP FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean
);

-- declare_job likewise.
DROP FUNCTION x_jobs.declare_job(
    text, text, integer, interval, interval, boolean, interval, integer, text, boolean, integer, text, text
);

--@function x_jobs._rate_parked_at
--@function x_jobs._rate_window
--@function x_jobs._park_rated
--@function x_jobs._filled
--@function x_jobs.enqueue
--@function x_jobs.enqueue_many
--@function x_jobs.queue_demand
--@function x_jobs.purge
--@function x_jobs._require_rate_limit_key
--@function x_jobs.set_rate_limit
--@function x_jobs.drop_rate_limit
--@function x_jobs.rate_limits
--@function x_jobs._claim_rated
--@function x_jobs._repark_rated
--@function x_jobs._park_picked_rated
--@function x_jobs._scoped_queue_stats
--@function x_jobs.queue_gauges
--@function x_jobs.outbox_nack
--@function x_jobs.outbox_extend_lease
--@function x_jobs.outbox_ack
--@function x_jobs._declare
--@function x_jobs.declare_job
--@function x_jobs.declare_jobs

GRANT EXECUTE ON FUNCTION x_jobs.enqueue(
    text, jsonb, text, timestamptz, text, integer, integer, text, text, text, text, integer, boolean, interval,
    interval, boolean, text
) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.declare_job(
    text, text, integer, interval, interval, boolean, interval, integer, text, boolean, integer, text, text, text
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.set_rate_limit(text, integer, interval) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.rate_limits() TO x_jobs_worker, pg_monitor;
GRANT EXECUTE ON FUNCTION x_jobs.drop_rate_limit(text) TO x_jobs_admin;
GRANT SELECT, DELETE ON x_jobs.job_rate TO x_jobs_admin;

-- The webhook ledger: an admin repairs it by hand (SELECT, DELETE), a bound one its tenants' rows.
ALTER TABLE x_jobs.webhook_ledger ENABLE ROW LEVEL SECURITY;
ALTER TABLE x_jobs.webhook_ledger FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_scope ON x_jobs.webhook_ledger
USING ((SELECT x_jobs._tenant_scope()) IS NULL OR tenant_id = any((SELECT x_jobs._tenant_scope())::text[]));

-- The owner policies, one a table: to x_jobs_owner, who owns the functions that run as their
-- owner; where an install by a database owner left the objects to it (no x_jobs_owner, see
-- 05-roles.sql), to that installer, who then owns them.
DO $$
DECLARE
    v_owner name := CASE
        WHEN EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = 'x_jobs_owner') THEN 'x_jobs_owner'
        ELSE current_user
    END;
    v_table text;
BEGIN
    FOREACH v_table IN ARRAY ARRAY['job', 'outbox', 'event', 'job_error', 'step', 'webhook_ledger'] LOOP
        EXECUTE pg_catalog.format(
            'CREATE POLICY owner_functions ON x_jobs.%I TO %I USING (TRUE) WITH CHECK (TRUE)', v_table, v_owner
        );
    END LOOP;
END
$$;

-- Nothing new left to PUBLIC (a new function is executable by PUBLIC until revoked); the
-- functions from before hold no PUBLIC right, so this changes none of theirs.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA x_jobs FROM public;
REVOKE ALL ON TABLE x_jobs.schedule FROM public;
-- Webhooks: the receiver's role alone receives them (see 95-grants.sql).
GRANT USAGE ON SCHEMA x_jobs TO x_jobs_webhook;
REVOKE EXECUTE ON FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) FROM x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb) TO x_jobs_webhook;
REVOKE ALL ON TABLE x_jobs.tenant_binding FROM public;
REVOKE ALL ON TABLE x_jobs.rate_limit, x_jobs.job_rate FROM public;
-- Schedules. Every x_jobs role may preview a cron expression (cron_next runs as its caller,
-- through the pure helpers granted with it). Workers declare their app's schedules, read them
-- and tick, through functions that run as their owner; pg_cron's job ticks as a login granted
-- x_jobs_worker. Admins pause, resume and drop schedules, as themselves, holding the rights on
-- the rows; run_schedule_now enqueues, as its owner.
GRANT EXECUTE ON FUNCTION x_jobs.cron_next(text, text, timestamptz, integer) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_parse(text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_field(text, text, text, integer, integer, text[], text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._require_time_zone(text) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_next(x_jobs.cron_fields, text, timestamptz) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._cron_match_after(x_jobs.cron_fields, timestamp) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._zone_change(timestamptz, timestamptz) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.set_schedule(
    text, text, text, text, jsonb, text, text, integer, text, interval, integer, integer, text, text,
    integer, boolean, interval, interval, boolean, boolean, text, text
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.list_schedules(text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.tick_schedules(integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.drop_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.pause_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.resume_schedule(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.run_schedule_now(text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._schedule_info(x_jobs.schedule) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._schedule_not_found(text) TO x_jobs_admin;
GRANT SELECT, UPDATE, DELETE ON x_jobs.schedule TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._tenant_scope() TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs._caller() TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._stamp_tenant(text, text[]) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs._refuse_cross_tenant(text, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.bind_tenant(name, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.unbind_tenant(name, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.tenant_bindings() TO x_jobs_admin;


-- The fence's functions again, with their new signatures (see Grants).
REVOKE ALL ON TABLE x_jobs.worker_login FROM public;
REVOKE ALL ON TABLE x_jobs.event_lock FROM public;
GRANT SELECT ON x_jobs.worker_login TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.extend_lease(bigint[], text, interval, integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.release(bigint[], text, integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete(bigint, text, jsonb, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.complete_many(bigint[], text, jsonb[], integer[]) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.fail(bigint, text, text, text, interval, boolean, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs._require_held(bigint, text, text, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.steps(bigint, text, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_record(bigint, text, text, jsonb, text, boolean, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_sleep(bigint, text, text, interval, integer) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.step_wait(
    bigint, text, text, text, text, jsonb, interval, timestamptz, integer
) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.progress(bigint, text, double precision, double precision, text, integer)
TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.hand_back(bigint[], text, interval, integer[]) TO x_jobs_worker;

-- Notifications carry an opaque tag per queue or topic, not its name: any login may LISTEN (see
-- x_jobs.notify_secret). The secret is made here as at install; every function that notifies
-- sends the tag. A worker or relay of 0.4.1 still listening for names hears none of them until
-- it restarts (it polls meanwhile, see CHANGELOG).
CREATE TABLE x_jobs.notify_secret (
    one boolean NOT NULL DEFAULT TRUE,
    secret text NOT NULL,
    CONSTRAINT notify_secret_pkey PRIMARY KEY (one),
    CONSTRAINT notify_secret_one_row CHECK (one)
);
INSERT INTO x_jobs.notify_secret (secret)
VALUES (pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text);
REVOKE ALL ON TABLE x_jobs.notify_secret FROM public;
--@function x_jobs._notify_tag
--@function x_jobs.notify_tags
--@function x_jobs._notify
--@function x_jobs.resolve_step
--@function x_jobs.outbox_redrive
--@function x_jobs.retry
--@function x_jobs._wake_parked
REVOKE ALL ON FUNCTION x_jobs._notify_tag(text, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.notify_tags(text, text[]) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs._notify_tag(text, text) TO x_jobs_admin;
GRANT EXECUTE ON FUNCTION x_jobs.notify_tags(text, text[]) TO x_jobs_worker;

-- Fair queues: a queue's policy, its tenants' weights, and the claim's turns across tenants.
CREATE TABLE x_jobs.queue_policy (
    queue text NOT NULL,
    fair boolean NOT NULL,
    updated_at timestamptz NOT NULL,
    updated_by text NOT NULL,
    CONSTRAINT queue_policy_pkey PRIMARY KEY (queue)
);
COMMENT ON TABLE x_jobs.queue_policy IS
'Queue policies: fair, claims take the queue''s ready rows round-robin across tenants.';
CREATE TABLE x_jobs.queue_weight (
    queue text NOT NULL,
    tenant_id text NOT NULL,
    weight integer NOT NULL,
    CONSTRAINT queue_weight_pkey PRIMARY KEY (queue, tenant_id),
    CONSTRAINT queue_weight_in_range CHECK (weight BETWEEN 1 AND 1000)
);
COMMENT ON TABLE x_jobs.queue_weight IS
'Weights of tenants in fair queues: rows a turn (1 when absent).';
SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_policy', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.queue_weight', '');
REVOKE ALL ON TABLE x_jobs.queue_policy, x_jobs.queue_weight FROM public;
--@function x_jobs._fair_index
--@function x_jobs.queue_policies
--@function x_jobs.set_queue_policy
--@function x_jobs._claim_fair
--@function x_jobs._fair_function
--@function x_jobs._fair_source
REVOKE ALL ON FUNCTION x_jobs._fair_index(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.queue_policies() FROM public;
REVOKE ALL ON FUNCTION x_jobs.set_queue_policy(text, boolean, jsonb) FROM public;
REVOKE ALL ON FUNCTION x_jobs._claim_fair(text, integer, timestamptz, text[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs._fair_function(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs._fair_source(text) FROM public;
REVOKE ALL ON FUNCTION x_jobs._repark_rated(bigint[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs._park_picked_rated(bigint[]) FROM public;
REVOKE ALL ON FUNCTION x_jobs._scoped_queue_stats(text[], timestamptz) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.queue_policies() TO x_jobs_worker, pg_monitor;
GRANT EXECUTE ON FUNCTION x_jobs.set_queue_policy(text, boolean, jsonb) TO x_jobs_admin;

-- The stream (x_jobs.stream_entry, stream_append, stream_read) and the consumers' cursors.
-- One row per entry appended to a stream (x_jobs.stream_append), in the producer's transaction.
-- xid is that transaction's id: entries are read in (xid, id) order, and only below the oldest
-- running transaction (see x_jobs.stream_read), so an entry that commits late is never passed
-- over by a reader that already read past it.
CREATE TABLE x_jobs.stream_entry (
    stream text NOT NULL, -- noqa: RF04
    xid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    id bigint GENERATED ALWAYS AS IDENTITY,
    key text, -- noqa: RF04
    appended_at timestamptz NOT NULL,
    tenant_id text NOT NULL,
    payload jsonb NOT NULL,
    CONSTRAINT stream_entry_pkey PRIMARY KEY (stream, xid, id)
);

COMMENT ON TABLE x_jobs.stream_entry IS
'Entries appended to streams, read in (xid, id) order below the oldest running transaction.';

-- One key's entries, for a reader that follows a single key.
CREATE INDEX stream_entry_key_idx ON x_jobs.stream_entry (stream, key, xid, id)
WHERE key IS NOT NULL;

-- Where each consumer is, per key: any JSON the consumer chose (a stream position, a table's
-- last id, a partner's page token). Saved by x_jobs.save_cursor in the caller's transaction, so
-- that a batch's writes and its new position commit together or not at all.
CREATE TABLE x_jobs.consumer_cursor (
    consumer text NOT NULL,
    key text NOT NULL, -- noqa: RF04
    tenant_id text NOT NULL,
    cursor jsonb NOT NULL, -- noqa: RF04
    saved_at timestamptz NOT NULL,
    CONSTRAINT consumer_cursor_pkey PRIMARY KEY (consumer, key, tenant_id)
);

COMMENT ON TABLE x_jobs.consumer_cursor IS
'Each consumer''s position per key, saved in the transaction of the batch it follows.';

SELECT pg_catalog.pg_extension_config_dump('x_jobs.stream_entry', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.stream_entry_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('x_jobs.consumer_cursor', '');
REVOKE ALL ON TABLE x_jobs.stream_entry, x_jobs.consumer_cursor FROM public;
--@function x_jobs._require_stream
--@function x_jobs._stream_position
--@function x_jobs.stream_append
--@function x_jobs.stream_append_many
--@function x_jobs.stream_read
--@function x_jobs.consumer_cursor
--@function x_jobs.save_cursor
REVOKE ALL ON FUNCTION x_jobs._require_stream(text, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs._stream_position(xid8, bigint) FROM public;
REVOKE ALL ON FUNCTION x_jobs.stream_append(text, text, jsonb) FROM public;
REVOKE ALL ON FUNCTION x_jobs.stream_append_many(text, jsonb) FROM public;
REVOKE ALL ON FUNCTION x_jobs.stream_read(text, text, integer, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.consumer_cursor(text, text) FROM public;
REVOKE ALL ON FUNCTION x_jobs.save_cursor(text, text, jsonb) FROM public;
GRANT EXECUTE ON FUNCTION x_jobs.stream_append(text, text, jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.stream_append_many(text, jsonb) TO x_jobs_producer;
GRANT EXECUTE ON FUNCTION x_jobs.stream_read(text, text, integer, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.consumer_cursor(text, text) TO x_jobs_worker;
GRANT EXECUTE ON FUNCTION x_jobs.save_cursor(text, text, jsonb) TO x_jobs_worker;

SELECT x_jobs._adopt();
