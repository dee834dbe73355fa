-- The contract of the extension, pinned: which objects exist, what each function returns, how
-- volatile it is, whose rights it runs with, which settings it pins, and who may use what.
-- A change to any of these is a change to the API: it shows up here first, on purpose.
BEGIN;
SELECT plan(1561);

-- The functions of the API, one row each, with what 00-schema pins about them. `args` is how
-- pgTAP's catalog view spells the argument types (regtype output: 'timestamp with time zone',
-- schema-qualified x_jobs types), which function_returns and friends compare as text.
CREATE TEMP TABLE api (
    fn name PRIMARY KEY,
    args name[] NOT NULL,
    return_type text NOT NULL,
    volatility text NOT NULL,
    -- Why the function runs as its owner (SECURITY DEFINER); NULL: it runs as its caller.
    runs_as_owner_because text
);

INSERT INTO api (fn, args, return_type, volatility, runs_as_owner_because) VALUES
('now', '{}', 'timestamp with time zone', 'STABLE', NULL),
('_fake_now', '{}', 'timestamp with time zone', 'STABLE', NULL),
('error_codes', '{}', 'setof record', 'IMMUTABLE', NULL),
('version', '{}', 'text', 'IMMUTABLE', NULL),
('_minute', '{timestamp with time zone}', 'timestamp with time zone', 'IMMUTABLE', NULL),
('_shard', '{}', 'smallint', 'STABLE', NULL),
('_max_payload_bytes', '{}', 'integer', 'STABLE', NULL),
('_max_payload_setting', '{}', 'integer', 'STABLE', NULL),
('_payload_bytes', '{jsonb}', 'integer', 'IMMUTABLE', NULL),
('_require_worker', '{text,text}', 'void', 'IMMUTABLE', NULL),
('_require_lease', '{interval,text}', 'void', 'IMMUTABLE', NULL),
('_notify', '{text,text}', 'void', 'VOLATILE', NULL),
-- Notifications carry tags (0.4.2): both read the secret, which only the owner may.
(
    '_notify_tag', '{text,text}', 'text', 'STABLE',
    'so that every notify sends the tag of a name, made of a secret no role may read'
),
(
    'notify_tags', '{text,text[]}', 'text[]', 'STABLE',
    'so that a listener learns the tags of the names it names, never the secret'
),
('_caller', '{}', 'name', 'STABLE', NULL),
-- The fence (0.4.2): a worker id is its first claimer's login's (see _fence).
(
    '_fence', '{text}', 'boolean', 'VOLATILE',
    'so the functions a worker calls record which login a worker id belongs to, which no role may write'
),
('_require_fence', '{text}', 'void', 'VOLATILE', NULL),
('_require_attempts', '{bigint[],integer[]}', 'void', 'IMMUTABLE', NULL),
('_attempt_map', '{bigint[],integer[]}', 'jsonb', 'IMMUTABLE', NULL),
('_lock_event', '{smallint,text,boolean}', 'void', 'VOLATILE', NULL),
('_require_retention', '{text,interval,integer,text}', 'void', 'IMMUTABLE', NULL),
('_enqueue', '{x_jobs.enqueue_request[]}', 'setof x_jobs.enqueue_many_result', 'VOLATILE', NULL),
('_run_ids', '{integer}', 'uuid[]', 'VOLATILE', NULL),
('_ready_since', '{}', 'timestamp with time zone', 'STABLE', NULL),
-- The roles and the ownership (0.4.0): the scripts' own helpers, and the health reader.
('_role_problems', '{}', 'setof record', 'STABLE', NULL),
('_setup_roles', '{}', 'void', 'VOLATILE', NULL),
('_adopt', '{}', 'void', 'VOLATILE', NULL),
('health', '{}', 'setof record', 'STABLE', NULL),
(
    'enqueue',
    '{text,jsonb,text,timestamp with time zone,text,integer,integer,text,text,text,text,integer,boolean,'
    'interval,interval,boolean,text}',
    'x_jobs.enqueue_result', 'VOLATILE', 'so a producer enqueues without any right on the jobs table'
),
(
    'enqueue_many', '{jsonb}', 'setof x_jobs.enqueue_many_result', 'VOLATILE',
    'so a producer enqueues without any right on the jobs table'
),
(
    'result', '{bigint}', 'setof record', 'STABLE',
    'so a producer reads a job''s outcome, and nothing else of any row'
),
(
    'claim', '{text[],text,interval,integer}', 'setof x_jobs.job', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'extend_lease', '{bigint[],text,interval,integer[]}', 'setof bigint', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'release', '{bigint[],text,integer[]}', 'setof bigint', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'complete_many', '{bigint[],text,jsonb[],integer[]}', 'setof bigint', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'complete', '{bigint,text,jsonb,integer}', 'boolean', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'fail', '{bigint,text,text,text,interval,boolean,integer}', 'x_jobs.job_state', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
('cancel', '{bigint}', 'boolean', 'VOLATILE', NULL),
('retry', '{bigint}', 'boolean', 'VOLATILE', NULL),
('list_jobs', '{text,text,bigint,integer,text}', 'setof x_jobs.job', 'STABLE', NULL),
-- Bulk operations (0.4.0).
(
    '_bulk_states',
    '{text,text,x_jobs.job_state[],x_jobs.job_state[],text,timestamp with time zone,'
    'timestamp with time zone,integer}',
    'x_jobs.job_state[]', 'STABLE', NULL
),
(
    'cancel_jobs', '{text,text,text,text,timestamp with time zone,timestamp with time zone,integer,boolean}',
    'bigint', 'VOLATILE', NULL
),
(
    'retry_jobs', '{text,text,text,text,timestamp with time zone,timestamp with time zone,integer,boolean}',
    'bigint', 'VOLATILE', NULL
),
('queue_stats', '{}', 'setof record', 'STABLE', NULL),
('pause_queue', '{text}', 'boolean', 'VOLATILE', NULL),
('resume_queue', '{text}', 'boolean', 'VOLATILE', NULL),
(
    'announce_worker', '{text,text[],text,boolean,interval,text[]}', 'x_jobs.worker', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'queue_demand', '{}', 'setof record', 'STABLE',
    'so monitoring roles get counts without reading jobs'
),
(
    'queue_gauges', '{interval,text[]}', 'setof record', 'VOLATILE',
    'so workers and monitoring roles get counts, and store the snapshot, without any right on the tables'
),
('rollup_counters', '{interval,interval,interval}', 'bigint', 'VOLATILE', NULL),
('purge', '{interval,integer}', 'bigint', 'VOLATILE', NULL),
-- Steps and events (0.2.0).
('_clock', '{}', 'timestamp with time zone', 'VOLATILE', NULL),
('_require_held', '{bigint,text,text,integer}', 'x_jobs.job', 'VOLATILE', NULL),
('_require_event', '{text}', 'void', 'IMMUTABLE', NULL),
('_suspend', '{bigint,timestamp with time zone}', 'void', 'VOLATILE', NULL),
(
    'steps', '{bigint,text,integer}', 'setof x_jobs.step', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'step_record', '{bigint,text,text,jsonb,text,boolean,integer}', 'x_jobs.step_status', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'step_sleep', '{bigint,text,text,interval,integer}', 'x_jobs.step', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'step_wait', '{bigint,text,text,text,text,jsonb,interval,timestamp with time zone,integer}', 'x_jobs.step',
    'VOLATILE', 'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'publish', '{text,jsonb,text}', 'setof record', 'VOLATILE',
    'so a producer resolves waits and wakes runs without any right to write steps or jobs'
),
('resolve_step', '{bigint,text,jsonb}', 'x_jobs.step', 'VOLATILE', NULL),
(
    'progress', '{bigint,text,double precision,double precision,text,integer}', 'boolean', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
('purge_events', '{interval,integer}', 'bigint', 'VOLATILE', NULL),
-- The outbox and the webhook ledger (0.2.0).
('_require_message', '{text,jsonb,jsonb,integer}', 'void', 'STABLE', NULL),
(
    'outbox_put', '{text,jsonb,text,jsonb,integer}', 'bigint', 'VOLATILE',
    'so a producer puts messages without any right on the outbox'
),
(
    'outbox_put_many', '{jsonb}', 'setof record', 'VOLATILE',
    'so a producer puts messages without any right on the outbox'
),
(
    'relay_outbox', '{text,integer,interval,text[]}', 'setof record', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'outbox_ack', '{bigint[],text}', 'setof bigint', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'outbox_extend_lease', '{bigint[],text,interval}', 'setof bigint', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
(
    'outbox_nack', '{bigint,text,text,timestamp with time zone,boolean}', 'x_jobs.outbox_state', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
('outbox_redrive', '{bigint[],text,integer}', 'bigint', 'VOLATILE', NULL),
('purge_outbox', '{interval,integer}', 'bigint', 'VOLATILE', NULL),
(
    'receive_webhook', '{text,text,text,jsonb,text,jsonb}', 'setof record', 'VOLATILE',
    'so the receiver''s role records a webhook and its job without any right on the ledger or the jobs'
),
-- The tenant a webhook id is unique within (0.4.2): the tenant scope decides it there alone.
('_webhook_tenant', '{jsonb}', 'text', 'STABLE', NULL),
('purge_webhook_ledger', '{interval,integer}', 'bigint', 'VOLATILE', NULL),
-- Declarations (0.4.0).
('_filled', '{x_jobs.enqueue_request,x_jobs.job_type}', 'x_jobs.enqueue_request', 'IMMUTABLE', NULL),
('_wake_parked', '{text[],text[],integer}', 'integer', 'VOLATILE', NULL),
('_declare', '{x_jobs.job_type[]}', 'setof x_jobs.job_type', 'VOLATILE', NULL),
('_declarer', '{text}', 'text', 'STABLE', NULL),
(
    'declare_job',
    '{text,text,integer,interval,interval,boolean,interval,integer,text,boolean,integer,text,text,text}',
    'x_jobs.job_type', 'VOLATILE', 'so a worker declares its jobs with no right to write the tables'
),
(
    'declare_jobs', '{jsonb,text,text}', 'setof x_jobs.job_type', 'VOLATILE',
    'so a worker declares its jobs with no right to write the tables'
),
(
    'job_types', '{}', 'setof record', 'STABLE',
    'so a worker reads the declarations and who serves them, and no job input'
),
('drop_job_type', '{text}', 'boolean', 'VOLATILE', NULL),
(
    'hand_back', '{bigint[],text,interval,integer[]}', 'setof record', 'VOLATILE',
    'so a worker settles only what it claimed, with no right to write the tables'
),
-- Readers (0.4.1): what clients read of the tables, as their caller.
('job_detail', '{bigint}', 'setof record', 'STABLE', NULL),
('job_errors', '{bigint}', 'setof record', 'STABLE', NULL),
('job_steps', '{bigint}', 'setof record', 'STABLE', NULL),
('job_states', '{bigint[]}', 'setof record', 'STABLE', NULL),
('held_jobs', '{text}', 'setof record', 'STABLE', NULL),
('list_outbox', '{text,text,text,bigint,integer}', 'setof x_jobs.outbox_entry', 'STABLE', NULL),
('outbox_message', '{bigint}', 'setof x_jobs.outbox_entry', 'STABLE', NULL),
('job_counters', '{timestamp with time zone}', 'setof record', 'STABLE', NULL),
-- Schedules (0.4.2): the cron reader and evaluator, pure but for the zone they set while they
-- run; the functions of the schedules, of which those a worker calls run as their owner.
('_cron_field', '{text,text,text,integer,integer,text[],text}', 'integer[]', 'IMMUTABLE', NULL),
('_cron_parse', '{text}', 'x_jobs.cron_fields', 'IMMUTABLE', NULL),
(
    '_cron_match_after',
    '{x_jobs.cron_fields,timestamp without time zone}',
    'timestamp without time zone',
    'IMMUTABLE',
    NULL
),
('_zone_change', '{timestamp with time zone,timestamp with time zone}', 'timestamp with time zone', 'STABLE', NULL),
('_cron_next', '{x_jobs.cron_fields,text,timestamp with time zone}', 'timestamp with time zone', 'STABLE', NULL),
(
    '_cron_last', '{x_jobs.cron_fields,text,timestamp with time zone,timestamp with time zone}',
    'timestamp with time zone', 'STABLE', NULL
),
('_require_time_zone', '{text}', 'text', 'STABLE', NULL),
('cron_next', '{text,text,timestamp with time zone,integer}', 'setof timestamp with time zone', 'STABLE', NULL),
(
    '_schedule_request', '{x_jobs.schedule,timestamp with time zone,timestamp with time zone,boolean}',
    'x_jobs.enqueue_request', 'STABLE', NULL
),
('_schedule_info', '{x_jobs.schedule}', 'x_jobs.schedule_info', 'STABLE', NULL),
('_schedule_not_found', '{text}', 'void', 'STABLE', NULL),
('_schedule_due', '{x_jobs.schedule,timestamp with time zone}', 'record', 'STABLE', NULL),
(
    'set_schedule',
    '{text,text,text,text,jsonb,text,text,integer,text,interval,integer,integer,text,text,integer,boolean,'
    'interval,interval,boolean,boolean,text,text}',
    'x_jobs.schedule_info', 'VOLATILE', 'so a worker declares its app''s schedules with no right on the table'
),
('drop_schedule', '{text}', 'boolean', 'VOLATILE', NULL),
('pause_schedule', '{text}', 'x_jobs.schedule_info', 'VOLATILE', NULL),
('resume_schedule', '{text}', 'x_jobs.schedule_info', 'VOLATILE', NULL),
(
    'list_schedules', '{text}', 'setof x_jobs.schedule_info', 'STABLE',
    'so a worker reads its app''s schedules with no right on the table'
),
(
    'run_schedule_now', '{text}', 'x_jobs.enqueue_result', 'VOLATILE',
    'so an admin enqueues a schedule''s job through the helper only enqueue''s owner calls'
),
(
    'tick_schedules', '{integer}', 'setof record', 'VOLATILE',
    'so workers and pg_cron''s jobs tick with no right on the tables'
),
-- Tenants (0.4.2): the scope every call and policy computes, the stamp and the refusal of a
-- cross-tenant act, and the admins' bindings.
(
    '_tenant_scope', '{}', 'text[]', 'STABLE',
    'so that every role, in a policy too, reads its own bindings from a table only the owner reads'
),
('_stamp_tenant', '{text,text[]}', 'text', 'STABLE', NULL),
('_refuse_cross_tenant', '{text,text}', 'void', 'STABLE', NULL),
('bind_tenant', '{name,text}', 'void', 'VOLATILE', 'so an admin binds roles with no right on the bindings'),
('unbind_tenant', '{name,text}', 'boolean', 'VOLATILE', 'so an admin unbinds roles with no right on the bindings'),
('tenant_bindings', '{}', 'setof record', 'STABLE', 'so an admin reads the bindings with no right on the table'),
-- Rate limits (0.4.2).
('_require_rate_limit_key', '{text}', 'void', 'IMMUTABLE', NULL),
('_rate_window', '{interval,timestamp with time zone}', 'timestamp with time zone', 'IMMUTABLE', NULL),
('_rate_parked_at', '{}', 'timestamp with time zone', 'IMMUTABLE', NULL),
('_park_rated', '{x_jobs.enqueue_request[],bigint[],timestamp with time zone}', 'void', 'VOLATILE', NULL),
('_claim_rated', '{text[],integer,timestamp with time zone}', 'setof record', 'VOLATILE', NULL),
('_repark_rated', '{bigint[]}', 'void', 'VOLATILE', NULL),
('_park_picked_rated', '{bigint[]}', 'bigint[]', 'VOLATILE', NULL),
('_scoped_queue_stats', '{text[],timestamp with time zone}', 'setof record', 'STABLE', NULL),
-- The stream (0.4.2).
('_require_stream', '{text,text}', 'void', 'IMMUTABLE', NULL),
('_stream_position', '{xid8,bigint}', 'text', 'IMMUTABLE', NULL),
('stream_append', '{text,text,jsonb}', 'text', 'VOLATILE', 'so a producer appends with no right on the table'),
('stream_append_many', '{text,jsonb}', 'setof record', 'VOLATILE', 'so a producer appends with no right on the table'),
('stream_read', '{text,text,integer,text}', 'setof record', 'STABLE', 'so a consumer reads with no right on the table'),
('consumer_cursor', '{text,text}', 'jsonb', 'STABLE', 'so a consumer reads its cursor with no right on the table'),
('save_cursor', '{text,text,jsonb}', 'jsonb', 'VOLATILE', 'so a consumer saves its cursor with no right on the table'),
(
    'set_rate_limit', '{text,integer,interval}', 'x_jobs.rate_limit', 'VOLATILE',
    'so a worker declares its app''s rate limits with no right on the table'
),
(
    'drop_rate_limit', '{text}', 'text', 'VOLATILE',
    'so an admin drops a limit with no right on the table'
),
(
    'rate_limits', '{}', 'setof record', 'STABLE',
    'so monitoring and workers read the limits and counts with no right on the tables'
),
-- Fair queues (0.4.2).
('_fair_index', '{text}', 'text', 'IMMUTABLE', NULL),
('_claim_fair', '{text,integer,timestamp with time zone,text[]}', 'setof record', 'VOLATILE', NULL),
('_fair_function', '{text}', 'text', 'IMMUTABLE', NULL),
('_fair_source', '{text}', 'text', 'IMMUTABLE', NULL),
(
    'set_queue_policy', '{text,boolean,jsonb}', 'x_jobs.queue_policy', 'VOLATILE',
    'so an admin sets a policy, and its index is made on the owner''s table, with no right on the tables'
),
(
    'queue_policies', '{}', 'setof record', 'STABLE',
    'so monitoring and workers read the policies with no right on the tables'
);

-- Who may execute what, as the Grants section states it: the lowest x_jobs role granted
-- EXECUTE (a worker is a member of producer and an admin of worker, and has_function_privilege,
-- which function_privs_are uses, counts inherited rights), and whether pg_monitor is granted it.
-- PUBLIC is granted nothing.
CREATE TEMP TABLE api_grant (
    fn name PRIMARY KEY REFERENCES api (fn),
    lowest_role name,
    to_pg_monitor boolean NOT NULL
);

INSERT INTO api_grant (fn, lowest_role, to_pg_monitor) VALUES
('now', 'x_jobs_producer', TRUE),
('_fake_now', 'x_jobs_producer', TRUE),
('error_codes', 'x_jobs_producer', FALSE),
('version', 'x_jobs_producer', TRUE),
-- NULL: no role; only the functions that run as their owner call it (0.3.6).
('_max_payload_bytes', 'x_jobs_worker', FALSE),
('_max_payload_setting', 'x_jobs_worker', FALSE),
('_payload_bytes', 'x_jobs_worker', FALSE),
('_enqueue', NULL, FALSE),
('_run_ids', NULL, FALSE),
('_ready_since', NULL, FALSE),
-- The scripts run the role helpers and _adopt; health reads catalogs as its caller, and calls
-- _role_problems (0.4.0).
('_setup_roles', NULL, FALSE),
('_adopt', NULL, FALSE),
('_role_problems', 'x_jobs_worker', TRUE),
('health', 'x_jobs_worker', TRUE),
('_notify', NULL, FALSE),
-- The admins' functions that wake run as their caller and call _notify_tag; workers' and
-- relays' listeners ask notify_tags (0.4.2).
('_notify_tag', 'x_jobs_admin', FALSE),
('notify_tags', 'x_jobs_worker', FALSE),
-- The admins' functions that run as their caller name it in their refusals (0.4.2).
('_caller', 'x_jobs_admin', FALSE),
('_fence', NULL, FALSE),
('_require_fence', NULL, FALSE),
('_require_attempts', NULL, FALSE),
('_attempt_map', NULL, FALSE),
('_lock_event', NULL, FALSE),
('_require_retention', 'x_jobs_admin', FALSE),
('enqueue', 'x_jobs_producer', FALSE),
('enqueue_many', 'x_jobs_producer', FALSE),
('result', 'x_jobs_producer', FALSE),
('_minute', 'x_jobs_worker', FALSE),
('_shard', 'x_jobs_worker', FALSE),
('_require_worker', 'x_jobs_worker', FALSE),
('_require_lease', 'x_jobs_worker', FALSE),
('claim', 'x_jobs_worker', FALSE),
('extend_lease', 'x_jobs_worker', FALSE),
('release', 'x_jobs_worker', FALSE),
('complete', 'x_jobs_worker', FALSE),
('complete_many', 'x_jobs_worker', FALSE),
('fail', 'x_jobs_worker', FALSE),
('announce_worker', 'x_jobs_worker', FALSE),
('queue_demand', 'x_jobs_worker', TRUE),
('queue_gauges', 'x_jobs_worker', TRUE),
('cancel', 'x_jobs_admin', FALSE),
('retry', 'x_jobs_admin', FALSE),
('list_jobs', 'x_jobs_admin', FALSE),
('_bulk_states', 'x_jobs_admin', FALSE),
('cancel_jobs', 'x_jobs_admin', FALSE),
('retry_jobs', 'x_jobs_admin', FALSE),
('queue_stats', 'x_jobs_admin', FALSE),
('pause_queue', 'x_jobs_admin', FALSE),
('resume_queue', 'x_jobs_admin', FALSE),
('rollup_counters', 'x_jobs_admin', FALSE),
('purge', 'x_jobs_admin', FALSE),
-- Steps and events (0.2.0): a producer publishes (publish runs as its owner, so the helpers it
-- calls are the worker's), a worker runs the steps of the jobs it holds, an admin resolves steps
-- by hand and purges events.
('publish', 'x_jobs_producer', FALSE),
('_clock', 'x_jobs_worker', FALSE),
('_require_event', 'x_jobs_worker', FALSE),
('_require_held', 'x_jobs_worker', FALSE),
('_suspend', 'x_jobs_worker', FALSE),
('steps', 'x_jobs_worker', FALSE),
('step_record', 'x_jobs_worker', FALSE),
('step_sleep', 'x_jobs_worker', FALSE),
('step_wait', 'x_jobs_worker', FALSE),
('progress', 'x_jobs_worker', FALSE),
('resolve_step', 'x_jobs_admin', FALSE),
('purge_events', 'x_jobs_admin', FALSE),
-- The outbox (0.2.0): a producer puts messages and receives webhooks, a worker relays (claims,
-- acks, nacks), an admin redrives dead messages and runs the retention of both tables.
('_require_message', NULL, FALSE),
('outbox_put', 'x_jobs_producer', FALSE),
('outbox_put_many', 'x_jobs_producer', FALSE),
-- Webhooks are received by the receiver's role alone (0.4.2; producers could before).
('receive_webhook', 'x_jobs_webhook', FALSE),
('_webhook_tenant', NULL, FALSE),
('relay_outbox', 'x_jobs_worker', FALSE),
('outbox_ack', 'x_jobs_worker', FALSE),
('outbox_extend_lease', 'x_jobs_worker', FALSE),
('outbox_nack', 'x_jobs_worker', FALSE),
('outbox_redrive', 'x_jobs_admin', FALSE),
('purge_outbox', 'x_jobs_admin', FALSE),
('purge_webhook_ledger', 'x_jobs_admin', FALSE),
-- Declarations (0.4.0): a worker declares, reads the declarations and hands back what it cannot
-- run (the helpers run inside those functions, as their owner); an admin forgets a declaration.
('_filled', NULL, FALSE),
('_wake_parked', NULL, FALSE),
('_declare', NULL, FALSE),
('_declarer', NULL, FALSE),
('declare_job', 'x_jobs_worker', FALSE),
('declare_jobs', 'x_jobs_worker', FALSE),
('job_types', 'x_jobs_worker', FALSE),
('drop_job_type', 'x_jobs_admin', FALSE),
('hand_back', 'x_jobs_worker', FALSE),
-- Readers (0.4.1): an admin reads a job, its errors and steps, the outbox and the counters; a
-- worker asks its jobs' states and what it holds.
('job_detail', 'x_jobs_admin', FALSE),
('job_errors', 'x_jobs_admin', FALSE),
('job_steps', 'x_jobs_admin', FALSE),
('list_outbox', 'x_jobs_admin', FALSE),
('outbox_message', 'x_jobs_admin', FALSE),
('job_counters', 'x_jobs_admin', FALSE),
('job_states', 'x_jobs_worker', FALSE),
('held_jobs', 'x_jobs_worker', FALSE),
-- Schedules (0.4.2): anyone previews a cron expression (cron_next runs as its caller, through
-- the pure helpers); a worker declares, lists and ticks schedules (as their owner); an admin
-- drops, pauses and resumes them as itself, and runs one by hand. The tick's own helpers run
-- inside the functions that run as their owner.
('cron_next', 'x_jobs_producer', FALSE),
('_cron_parse', 'x_jobs_producer', FALSE),
('_cron_field', 'x_jobs_producer', FALSE),
('_cron_match_after', 'x_jobs_producer', FALSE),
('_zone_change', 'x_jobs_producer', FALSE),
('_cron_next', 'x_jobs_producer', FALSE),
('_require_time_zone', 'x_jobs_producer', FALSE),
('_cron_last', NULL, FALSE),
('_schedule_request', NULL, FALSE),
('_schedule_due', NULL, FALSE),
('_schedule_info', 'x_jobs_admin', FALSE),
('_schedule_not_found', 'x_jobs_admin', FALSE),
('set_schedule', 'x_jobs_worker', FALSE),
('list_schedules', 'x_jobs_worker', FALSE),
('tick_schedules', 'x_jobs_worker', FALSE),
('drop_schedule', 'x_jobs_admin', FALSE),
('pause_schedule', 'x_jobs_admin', FALSE),
('resume_schedule', 'x_jobs_admin', FALSE),
('run_schedule_now', 'x_jobs_admin', FALSE),
('_tenant_scope', 'x_jobs_producer', FALSE),
('_stamp_tenant', 'x_jobs_admin', FALSE),
('_refuse_cross_tenant', 'x_jobs_admin', FALSE),
('bind_tenant', 'x_jobs_admin', FALSE),
('unbind_tenant', 'x_jobs_admin', FALSE),
('tenant_bindings', 'x_jobs_admin', FALSE),
-- Rate limits (0.4.2): a worker declares and lists them, monitoring lists them, an admin drops
-- one; the helpers run inside the functions that run as their owner.
('_require_rate_limit_key', NULL, FALSE),
('_rate_window', NULL, FALSE),
('_rate_parked_at', NULL, FALSE),
('_park_rated', NULL, FALSE),
('_claim_rated', NULL, FALSE),
('_repark_rated', NULL, FALSE),
('_park_picked_rated', NULL, FALSE),
('_scoped_queue_stats', NULL, FALSE),
-- The stream (0.4.2): producers append, workers read and keep their cursors.
('_require_stream', NULL, FALSE),
('_stream_position', NULL, FALSE),
('stream_append', 'x_jobs_producer', FALSE),
('stream_append_many', 'x_jobs_producer', FALSE),
('stream_read', 'x_jobs_worker', FALSE),
('consumer_cursor', 'x_jobs_worker', FALSE),
('save_cursor', 'x_jobs_worker', FALSE),
('set_rate_limit', 'x_jobs_worker', FALSE),
('rate_limits', 'x_jobs_worker', TRUE),
('drop_rate_limit', 'x_jobs_admin', FALSE),
-- Fair queues (0.4.2): an admin sets a policy, workers and monitoring read them; the claim's
-- part runs inside the claim, as its owner.
('_fair_index', NULL, FALSE),
('_claim_fair', NULL, FALSE),
('_fair_function', NULL, FALSE),
('_fair_source', NULL, FALSE),
('set_queue_policy', 'x_jobs_admin', FALSE),
('queue_policies', 'x_jobs_worker', TRUE);

-- The roles a grant is checked for, in the order of their membership chain; NULL: outside it
-- (x_jobs_webhook is a member of no x_jobs role, and none is a member of it).
CREATE TEMP TABLE grant_role (grantee name PRIMARY KEY, chain_rank integer);

INSERT INTO grant_role (grantee, chain_rank) VALUES
('x_jobs_producer', 1), ('x_jobs_worker', 2), ('x_jobs_admin', 3), ('x_jobs_webhook', NULL), ('pg_monitor', NULL),
('public', NULL);

-- The extension and its schema --------------------------------------------------------------

SELECT has_extension('x_jobs', 'The x_jobs extension should be installed');
SELECT has_schema('x_jobs', 'The x_jobs schema should exist');
SELECT ok(
    EXISTS (
        SELECT
        FROM pg_catalog.pg_depend AS d
        INNER JOIN pg_catalog.pg_extension AS e ON d.refobjid = e.oid
        WHERE
            d.classid = 'pg_catalog.pg_namespace'::regclass
            AND d.objid = 'x_jobs'::regnamespace
            AND d.deptype = 'e'
            AND e.extname = 'x_jobs'
    ),
    'The x_jobs schema should belong to the extension, so DROP EXTENSION removes it'
);

SELECT tables_are(
    'x_jobs',
    ARRAY[
        'job', 'job_error', 'queue_pause', 'worker', 'queue_snapshot', 'counter', 'step', 'event', 'outbox',
        'webhook_ledger', 'job_type', 'schedule', 'worker_login', 'tenant_binding', 'rate_limit', 'job_rate',
        'event_lock', 'notify_secret', 'queue_policy', 'queue_weight', 'stream_entry', 'consumer_cursor'
    ],
    'The x_jobs schema should hold exactly the tables job, job_error, queue_pause, worker, queue_snapshot, counter, '
    'step, event, outbox, webhook_ledger, job_type, schedule, worker_login, tenant_binding, rate_limit, job_rate, '
    'event_lock, notify_secret, queue_policy, queue_weight, stream_entry and consumer_cursor'
);

SELECT sequences_are(
    'x_jobs', ARRAY['job_id_seq', 'event_id_seq', 'outbox_id_seq', 'stream_entry_id_seq'],
    'The x_jobs schema should hold exactly the identity sequences of job, event, outbox and stream_entry'
);

SELECT functions_are(
    'x_jobs', array(SELECT a.fn FROM api AS a),
    'The x_jobs schema should hold exactly the functions of the API, private helpers included'
);

SELECT types_are(
    'x_jobs',
    ARRAY[
        'job_state', 'enqueue_request', 'enqueue_result', 'enqueue_many_result', 'step_status', 'outbox_state',
        'outbox_entry', 'cron_fields', 'schedule_info'
    ],
    'The x_jobs schema should define exactly the types job_state, enqueue_request, enqueue_result, '
    'enqueue_many_result, step_status, outbox_state, outbox_entry, cron_fields and schedule_info'
);

SELECT enum_has_labels(
    'x_jobs', 'job_state',
    ARRAY['ready', 'delayed', 'suspended', 'running', 'done', 'failed', 'dead', 'cancelled'],
    'x_jobs.job_state should have the eight states, live ones first, in this order'
);

SELECT enum_has_labels(
    'x_jobs', 'step_status', ARRAY['waiting', 'done', 'failed'],
    'x_jobs.step_status should have the three statuses waiting, done and failed, in this order'
);

SELECT enum_has_labels(
    'x_jobs', 'outbox_state', ARRAY['pending', 'inflight', 'delivered', 'dead'],
    'x_jobs.outbox_state should have the four states pending, inflight, delivered and dead, in this order'
);

-- The step and event rows are what steps, step_sleep, step_wait and resolve_step answer, and
-- what an operator reads: their columns, in order, are part of the contract.
SELECT results_eq(
    $$
    SELECT
        a.attrelid::regclass::text,
        a.attname::text COLLATE "default",
        pg_catalog.format_type(a.atttypid, a.atttypmod),
        a.attnotnull
    FROM pg_catalog.pg_attribute AS a
    WHERE
        a.attrelid IN ('x_jobs.event'::regclass, 'x_jobs.step'::regclass)
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.event', 'id', 'bigint', TRUE),
        ('x_jobs.event', 'name', 'text', TRUE),
        ('x_jobs.event', 'key', 'text', FALSE),
        ('x_jobs.event', 'published_at', 'timestamp with time zone', TRUE),
        ('x_jobs.event', 'payload', 'jsonb', FALSE),
        ('x_jobs.event', 'tenant_id', 'text', TRUE),
        ('x_jobs.step', 'job_id', 'bigint', TRUE),
        ('x_jobs.step', 'name', 'text', TRUE),
        ('x_jobs.step', 'compensation', 'boolean', TRUE),
        ('x_jobs.step', 'kind', 'text', TRUE),
        ('x_jobs.step', 'created_at', 'timestamp with time zone', TRUE),
        ('x_jobs.step', 'event', 'text', FALSE),
        ('x_jobs.step', 'event_key', 'text', FALSE),
        ('x_jobs.step', 'match', 'jsonb', FALSE),
        ('x_jobs.step', 'since', 'timestamp with time zone', FALSE),
        ('x_jobs.step', 'timeout_at', 'timestamp with time zone', FALSE),
        ('x_jobs.step', 'status', 'x_jobs.step_status', TRUE),
        ('x_jobs.step', 'attempt', 'integer', TRUE),
        ('x_jobs.step', 'output', 'jsonb', FALSE),
        ('x_jobs.step', 'error', 'text', FALSE),
        ('x_jobs.step', 'event_id', 'bigint', FALSE),
        ('x_jobs.step', 'resolved_by', 'text', FALSE),
        ('x_jobs.step', 'resolved_at', 'timestamp with time zone', FALSE)
    $$,
    'The step and event tables should have the documented columns, types and NOT NULLs, in order'
);

-- A step is one per (job, name, compensation), of a known kind, and a wait names its event.
SELECT results_eq(
    $$
    SELECT c.conrelid::regclass::text, c.conname::text COLLATE "default", pg_catalog.pg_get_constraintdef(c.oid)
    FROM pg_catalog.pg_constraint AS c
    WHERE c.conrelid IN ('x_jobs.event'::regclass, 'x_jobs.step'::regclass)
    ORDER BY 1, 2
    $$,
    $$
    VALUES
        ('x_jobs.event', 'event_pkey', 'PRIMARY KEY (id)'),
        ('x_jobs.step', 'step_kind_known',
         'CHECK ((kind = ANY (ARRAY[''run''::text, ''sleep''::text, ''wait''::text])))'),
        ('x_jobs.step', 'step_pkey', 'PRIMARY KEY (job_id, name, compensation)'),
        ('x_jobs.step', 'step_wait_names_event', 'CHECK (((kind <> ''wait''::text) OR (event IS NOT NULL)))')
    $$,
    'The step and event tables should have exactly their documented keys and checks'
);

-- The outbox rows are what relay_outbox hands out and what an operator reads before a redrive;
-- the ledger row is what receive_webhook looks a redelivery up by. Column order is put order:
-- what a put sets first, what relays change last.
SELECT results_eq(
    $$
    SELECT
        a.attrelid::regclass::text,
        a.attname::text COLLATE "default",
        pg_catalog.format_type(a.atttypid, a.atttypmod),
        a.attnotnull,
        a.attidentity::text COLLATE "default"
    FROM pg_catalog.pg_attribute AS a
    WHERE
        a.attrelid IN ('x_jobs.outbox'::regclass, 'x_jobs.webhook_ledger'::regclass)
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.outbox', 'id', 'bigint', TRUE, 'a'),
        ('x_jobs.outbox', 'created_at', 'timestamp with time zone', TRUE, ''),
        ('x_jobs.outbox', 'max_attempts', 'integer', TRUE, ''),
        ('x_jobs.outbox', 'topic', 'text', TRUE, ''),
        ('x_jobs.outbox', 'key', 'text', FALSE, ''),
        ('x_jobs.outbox', 'headers', 'jsonb', TRUE, ''),
        ('x_jobs.outbox', 'payload', 'jsonb', TRUE, ''),
        ('x_jobs.outbox', 'state', 'x_jobs.outbox_state', TRUE, ''),
        ('x_jobs.outbox', 'attempt', 'integer', TRUE, ''),
        ('x_jobs.outbox', 'available_at', 'timestamp with time zone', TRUE, ''),
        ('x_jobs.outbox', 'relay', 'text', FALSE, ''),
        ('x_jobs.outbox', 'delivered_at', 'timestamp with time zone', FALSE, ''),
        ('x_jobs.outbox', 'last_error', 'text', FALSE, ''),
        ('x_jobs.outbox', 'tenant_id', 'text', TRUE, ''),
        ('x_jobs.webhook_ledger', 'source', 'text', TRUE, ''),
        ('x_jobs.webhook_ledger', 'webhook_id', 'text', TRUE, ''),
        ('x_jobs.webhook_ledger', 'received_at', 'timestamp with time zone', TRUE, ''),
        ('x_jobs.webhook_ledger', 'job_id', 'bigint', TRUE, ''),
        ('x_jobs.webhook_ledger', 'tenant_id', 'text', TRUE, '')
    $$,
    'The outbox and webhook_ledger tables should have the documented columns, types, NOT NULLs and '
    'identity, in order'
);

-- A message in flight names the relay that holds it (outbox_ack and outbox_nack match on it),
-- and a webhook is one per (source, tenant, id): that key is what makes a redelivery one job,
-- and another tenant's receipt of the id its own.
SELECT results_eq(
    $$
    SELECT c.conrelid::regclass::text, c.conname::text COLLATE "default", pg_catalog.pg_get_constraintdef(c.oid)
    FROM pg_catalog.pg_constraint AS c
    WHERE c.conrelid IN ('x_jobs.outbox'::regclass, 'x_jobs.webhook_ledger'::regclass)
    ORDER BY 1, 2
    $$,
    $$
    VALUES
        ('x_jobs.outbox', 'outbox_inflight_is_held',
         'CHECK (((state <> ''inflight''::x_jobs.outbox_state) OR (relay IS NOT NULL)))'),
        ('x_jobs.outbox', 'outbox_max_attempts_positive', 'CHECK ((max_attempts >= 1))'),
        ('x_jobs.outbox', 'outbox_pkey', 'PRIMARY KEY (id)'),
        ('x_jobs.webhook_ledger', 'webhook_ledger_pkey', 'PRIMARY KEY (source, tenant_id, webhook_id)')
    $$,
    'The outbox and webhook_ledger tables should have exactly their documented keys and checks'
);

-- A declaration is what declare_job answers and every enqueue of its name reads (0.4.0); what a
-- worker announces it serves is the last column of x_jobs.worker.
SELECT results_eq(
    $$
    SELECT
        a.attrelid::regclass::text,
        a.attname::text COLLATE "default",
        pg_catalog.format_type(a.atttypid, a.atttypmod),
        a.attnotnull
    FROM pg_catalog.pg_attribute AS a
    WHERE
        (a.attrelid = 'x_jobs.job_type'::regclass OR (a.attrelid = 'x_jobs.worker'::regclass AND a.attname = 'jobs'))
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.job_type', 'name', 'text', TRUE),
        ('x_jobs.job_type', 'queue', 'text', FALSE),
        ('x_jobs.job_type', 'max_attempts', 'integer', FALSE),
        ('x_jobs.job_type', 'priority', 'integer', FALSE),
        ('x_jobs.job_type', 'dead_letter', 'boolean', FALSE),
        ('x_jobs.job_type', 'backoff_base', 'interval', FALSE),
        ('x_jobs.job_type', 'backoff_max', 'interval', FALSE),
        ('x_jobs.job_type', 'keep_done', 'boolean', FALSE),
        ('x_jobs.job_type', 'concurrency_key', 'text', FALSE),
        ('x_jobs.job_type', 'concurrency_limit', 'integer', FALSE),
        ('x_jobs.job_type', 'timeout', 'interval', FALSE),
        ('x_jobs.job_type', 'declared_at', 'timestamp with time zone', TRUE),
        ('x_jobs.job_type', 'declared_by', 'text', TRUE),
        ('x_jobs.job_type', 'build', 'text', FALSE),
        ('x_jobs.job_type', 'rate_limit_key', 'text', FALSE),
        ('x_jobs.worker', 'jobs', 'text[]', FALSE)
    $$,
    'The job_type table and worker.jobs should have the documented columns, types and NOT NULLs, in order'
);

SELECT is(
    (
        SELECT max(a.attnum) FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = 'x_jobs.worker'::regclass
    ),
    (
        SELECT a.attnum FROM pg_catalog.pg_attribute AS a
        WHERE a.attrelid = 'x_jobs.worker'::regclass AND a.attname = 'jobs'
    ),
    'x_jobs.worker.jobs should be the last column, where the 0.3.9 -> 0.4.0 update adds it'
);

-- A schedule is what set_schedule writes and list_schedules answers (0.4.2): the cron expression
-- beside what _cron_parse read of it, the job's options, the catch-up and overlap policies, the
-- instant it fires next and what it fired last.
SELECT results_eq(
    $$
    SELECT
        a.attrelid::regclass::text,
        a.attname::text COLLATE "default",
        pg_catalog.format_type(a.atttypid, a.atttypmod),
        a.attnotnull
    FROM pg_catalog.pg_attribute AS a
    WHERE a.attrelid = 'x_jobs.schedule'::regclass AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.schedule', 'name', 'text', TRUE),
        ('x_jobs.schedule', 'job', 'text', TRUE),
        ('x_jobs.schedule', 'cron', 'text', TRUE),
        ('x_jobs.schedule', 'tz', 'text', TRUE),
        ('x_jobs.schedule', 'fields', 'x_jobs.cron_fields', TRUE),
        ('x_jobs.schedule', 'input', 'jsonb', TRUE),
        ('x_jobs.schedule', 'queue', 'text', FALSE),
        ('x_jobs.schedule', 'priority', 'integer', FALSE),
        ('x_jobs.schedule', 'max_attempts', 'integer', FALSE),
        ('x_jobs.schedule', 'tenant_id', 'text', FALSE),
        ('x_jobs.schedule', 'concurrency_key', 'text', FALSE),
        ('x_jobs.schedule', 'concurrency_limit', 'integer', FALSE),
        ('x_jobs.schedule', 'dead_letter', 'boolean', FALSE),
        ('x_jobs.schedule', 'backoff_base', 'interval', FALSE),
        ('x_jobs.schedule', 'backoff_max', 'interval', FALSE),
        ('x_jobs.schedule', 'keep_done', 'boolean', FALSE),
        ('x_jobs.schedule', 'catchup', 'text', TRUE),
        ('x_jobs.schedule', 'catchup_max', 'integer', TRUE),
        ('x_jobs.schedule', 'overlap', 'text', TRUE),
        ('x_jobs.schedule', 'grace', 'interval', TRUE),
        ('x_jobs.schedule', 'paused', 'boolean', TRUE),
        ('x_jobs.schedule', 'next_fire_at', 'timestamp with time zone', TRUE),
        ('x_jobs.schedule', 'last_fire_at', 'timestamp with time zone', FALSE),
        ('x_jobs.schedule', 'last_enqueued_at', 'timestamp with time zone', FALSE),
        ('x_jobs.schedule', 'last_job_id', 'bigint', FALSE),
        ('x_jobs.schedule', 'fires', 'bigint', TRUE),
        ('x_jobs.schedule', 'skips', 'bigint', TRUE),
        ('x_jobs.schedule', 'last_error', 'text', FALSE),
        ('x_jobs.schedule', 'origin', 'text', FALSE),
        ('x_jobs.schedule', 'declared_by', 'text', FALSE),
        ('x_jobs.schedule', 'created_at', 'timestamp with time zone', TRUE),
        ('x_jobs.schedule', 'updated_at', 'timestamp with time zone', TRUE)
    $$,
    'The schedule table should have the documented columns, types and NOT NULLs, in order'
);

SELECT results_eq(
    $$
    SELECT c.conname::text COLLATE "default", pg_catalog.pg_get_constraintdef(c.oid)
    FROM pg_catalog.pg_constraint AS c
    WHERE c.conrelid = 'x_jobs.schedule'::regclass
    ORDER BY 1
    $$,
    $$
    VALUES
        ('schedule_catchup_known', 'CHECK ((catchup = ANY (ARRAY[''latest''::text, ''all''::text, ''none''::text])))'),
        ('schedule_catchup_max_positive', 'CHECK ((catchup_max >= 1))'),
        ('schedule_overlap_known', 'CHECK ((overlap = ANY (ARRAY[''allow''::text, ''skip''::text])))'),
        ('schedule_pkey', 'PRIMARY KEY (name)')
    $$,
    'The schedule table should have exactly its documented key and checks'
);

-- A tick seeks the due rows in next_fire_at order; tick_schedules repeats the predicate word
-- for word (NOT paused), so that the planner can use the partial index.
SELECT results_eq(
    $$
    SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid = 'x_jobs.schedule'::regclass
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.schedule_due_idx',
         'CREATE INDEX schedule_due_idx ON x_jobs.schedule USING btree (next_fire_at) WHERE (NOT paused)'),
        ('x_jobs.schedule_pkey', 'CREATE UNIQUE INDEX schedule_pkey ON x_jobs.schedule USING btree (name)')
    $$,
    'x_jobs.schedule should have exactly its primary key and the index of the due rows'
);

-- What _cron_parse answers and the functions of the schedules answer, read by name.
SELECT results_eq(
    $$
    SELECT a.attrelid::regclass::text, a.attname::text COLLATE "default", pg_catalog.format_type(a.atttypid, a.atttypmod)
    FROM pg_catalog.pg_attribute AS a
    WHERE
        a.attrelid IN ('x_jobs.cron_fields'::regclass, 'x_jobs.schedule_info'::regclass)
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.cron_fields', 'minutes', 'integer[]'),
        ('x_jobs.cron_fields', 'hours', 'integer[]'),
        ('x_jobs.cron_fields', 'days', 'integer[]'),
        ('x_jobs.cron_fields', 'months', 'integer[]'),
        ('x_jobs.cron_fields', 'weekdays', 'integer[]'),
        ('x_jobs.cron_fields', 'day_and', 'boolean'),
        ('x_jobs.cron_fields', 'fixed', 'boolean'),
        ('x_jobs.schedule_info', 'name', 'text'),
        ('x_jobs.schedule_info', 'job', 'text'),
        ('x_jobs.schedule_info', 'cron', 'text'),
        ('x_jobs.schedule_info', 'tz', 'text'),
        ('x_jobs.schedule_info', 'input', 'jsonb'),
        ('x_jobs.schedule_info', 'queue', 'text'),
        ('x_jobs.schedule_info', 'priority', 'integer'),
        ('x_jobs.schedule_info', 'max_attempts', 'integer'),
        ('x_jobs.schedule_info', 'tenant_id', 'text'),
        ('x_jobs.schedule_info', 'concurrency_key', 'text'),
        ('x_jobs.schedule_info', 'concurrency_limit', 'integer'),
        ('x_jobs.schedule_info', 'dead_letter', 'boolean'),
        ('x_jobs.schedule_info', 'backoff_base', 'interval'),
        ('x_jobs.schedule_info', 'backoff_max', 'interval'),
        ('x_jobs.schedule_info', 'keep_done', 'boolean'),
        ('x_jobs.schedule_info', 'catchup', 'text'),
        ('x_jobs.schedule_info', 'catchup_max', 'integer'),
        ('x_jobs.schedule_info', 'overlap', 'text'),
        ('x_jobs.schedule_info', 'grace', 'interval'),
        ('x_jobs.schedule_info', 'paused', 'boolean'),
        ('x_jobs.schedule_info', 'next_fire_at', 'timestamp with time zone'),
        ('x_jobs.schedule_info', 'last_fire_at', 'timestamp with time zone'),
        ('x_jobs.schedule_info', 'last_enqueued_at', 'timestamp with time zone'),
        ('x_jobs.schedule_info', 'last_job_id', 'bigint'),
        ('x_jobs.schedule_info', 'last_job_state', 'x_jobs.job_state'),
        ('x_jobs.schedule_info', 'fires', 'bigint'),
        ('x_jobs.schedule_info', 'skips', 'bigint'),
        ('x_jobs.schedule_info', 'last_error', 'text'),
        ('x_jobs.schedule_info', 'origin', 'text'),
        ('x_jobs.schedule_info', 'declared_by', 'text'),
        ('x_jobs.schedule_info', 'created_at', 'timestamp with time zone'),
        ('x_jobs.schedule_info', 'updated_at', 'timestamp with time zone')
    $$,
    'The cron_fields and schedule_info types should have the documented fields, in order'
);

-- The composite types are the shape of what enqueue takes and answers: callers read them by name.
SELECT results_eq(
    $$
    SELECT a.attrelid::regclass::text, a.attname::text COLLATE "default", pg_catalog.format_type(a.atttypid, a.atttypmod)
    FROM pg_catalog.pg_attribute AS a
    WHERE
        a.attrelid IN (
            'x_jobs.enqueue_request'::regclass, 'x_jobs.enqueue_result'::regclass,
            'x_jobs.enqueue_many_result'::regclass
        )
        AND a.attnum > 0
        AND NOT a.attisdropped
    ORDER BY a.attrelid::regclass::text, a.attnum
    $$,
    $$
    VALUES
        ('x_jobs.enqueue_many_result', 'ord', 'integer'),
        ('x_jobs.enqueue_many_result', 'id', 'bigint'),
        ('x_jobs.enqueue_many_result', 'run_id', 'uuid'),
        ('x_jobs.enqueue_many_result', 'deduped', 'boolean'),
        ('x_jobs.enqueue_request', 'name', 'text'),
        ('x_jobs.enqueue_request', 'input', 'jsonb'),
        ('x_jobs.enqueue_request', 'queue', 'text'),
        ('x_jobs.enqueue_request', 'run_at', 'timestamp with time zone'),
        ('x_jobs.enqueue_request', 'idempotency_key', 'text'),
        ('x_jobs.enqueue_request', 'max_attempts', 'integer'),
        ('x_jobs.enqueue_request', 'priority', 'integer'),
        ('x_jobs.enqueue_request', 'tenant_id', 'text'),
        ('x_jobs.enqueue_request', 'concurrency_key', 'text'),
        ('x_jobs.enqueue_request', 'concurrency_limit', 'integer'),
        ('x_jobs.enqueue_request', 'traceparent', 'text'),
        ('x_jobs.enqueue_request', 'enqueued_by', 'text'),
        ('x_jobs.enqueue_request', 'dead_letter', 'boolean'),
        ('x_jobs.enqueue_request', 'backoff_base', 'interval'),
        ('x_jobs.enqueue_request', 'backoff_max', 'interval'),
        ('x_jobs.enqueue_request', 'keep_done', 'boolean'),
        ('x_jobs.enqueue_request', 'rate_limit_key', 'text'),
        ('x_jobs.enqueue_result', 'id', 'bigint'),
        ('x_jobs.enqueue_result', 'run_id', 'uuid'),
        ('x_jobs.enqueue_result', 'deduped', 'boolean')
    $$,
    'The request and result types should have the documented fields, in order'
);

-- Indexes of x_jobs.job: the claim's three arms and their keyed windows, the live-key
-- uniqueness, the concurrency count, the waiting keyed rows by key (queue_demand, the claim's
-- visit of keys), the keys of each queue (the walk of that visit) and the rows that ended badly
-- (list_jobs).
SELECT indexes_are(
    'x_jobs', 'job',
    ARRAY[
        'job_pkey', 'job_ready_idx', 'job_waiting_idx', 'job_running_idx', 'job_ready_keyed_idx',
        'job_waiting_keyed_idx', 'job_idempotency_key_idx', 'job_concurrency_idx', 'job_keyed_idx',
        'job_queue_key_idx', 'job_ended_idx', 'job_parked_idx'
    ],
    'x_jobs.job should have exactly its primary key, the three claim arms, the keyed windows, the live-key, '
    'the concurrency, the keyed, the queue-key, the ended and the parked indexes'
);

-- The claim, queue_demand and list_jobs repeat these predicates word for word (a partial index is
-- used only when the planner can prove its predicate), so their columns and predicates are part
-- of the contract.
SELECT results_eq(
    $$
    SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid = 'x_jobs.job'::regclass
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.job_concurrency_idx',
         'CREATE INDEX job_concurrency_idx ON x_jobs.job USING btree (concurrency_key) '
         'WHERE ((concurrency_key IS NOT NULL) AND (state = ''running''::x_jobs.job_state))'),
        ('x_jobs.job_ended_idx',
         'CREATE INDEX job_ended_idx ON x_jobs.job USING btree (id) '
         'WHERE (state = ANY (ARRAY[''dead''::x_jobs.job_state, ''failed''::x_jobs.job_state, '
         '''cancelled''::x_jobs.job_state]))'),
        ('x_jobs.job_idempotency_key_idx',
         'CREATE UNIQUE INDEX job_idempotency_key_idx ON x_jobs.job USING btree (tenant_id, idempotency_key) '
         'WHERE ((idempotency_key IS NOT NULL) AND (state = ANY (ARRAY[''ready''::x_jobs.job_state, '
         '''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state, ''running''::x_jobs.job_state])))'),
        ('x_jobs.job_keyed_idx',
         'CREATE INDEX job_keyed_idx ON x_jobs.job USING btree (concurrency_key, queue, priority, run_at, id) '
         'INCLUDE (concurrency_limit) WHERE ((concurrency_key IS NOT NULL) AND (state = ANY '
         '(ARRAY[''ready''::x_jobs.job_state, ''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state])))'),
        ('x_jobs.job_parked_idx',
         'CREATE INDEX job_parked_idx ON x_jobs.job USING btree (queue, name, id) '
         'WHERE ((state = ''delayed''::x_jobs.job_state) AND (run_at = ''infinity''::timestamp with time zone))'),
        ('x_jobs.job_pkey',
         'CREATE UNIQUE INDEX job_pkey ON x_jobs.job USING btree (id)'),
        ('x_jobs.job_queue_key_idx',
         'CREATE INDEX job_queue_key_idx ON x_jobs.job USING btree (queue, concurrency_key, concurrency_limit DESC) '
         'WHERE ((concurrency_key IS NOT NULL) AND (state = ANY (ARRAY[''ready''::x_jobs.job_state, '
         '''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state])))'),
        ('x_jobs.job_ready_idx',
         'CREATE INDEX job_ready_idx ON x_jobs.job USING btree (queue, priority, run_at, id) '
         'WHERE ((state = ''ready''::x_jobs.job_state) AND (concurrency_key IS NULL))'),
        ('x_jobs.job_ready_keyed_idx',
         'CREATE INDEX job_ready_keyed_idx ON x_jobs.job USING btree (queue, priority, run_at, id) '
         'INCLUDE (concurrency_key, concurrency_limit) '
         'WHERE ((state = ''ready''::x_jobs.job_state) AND (concurrency_key IS NOT NULL))'),
        ('x_jobs.job_running_idx',
         'CREATE INDEX job_running_idx ON x_jobs.job USING btree (queue, visible_at, id) '
         'WHERE (state = ''running''::x_jobs.job_state)'),
        ('x_jobs.job_waiting_idx',
         'CREATE INDEX job_waiting_idx ON x_jobs.job USING btree (queue, run_at, id) '
         'WHERE ((state = ANY (ARRAY[''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state])) '
         'AND (concurrency_key IS NULL))'),
        ('x_jobs.job_waiting_keyed_idx',
         'CREATE INDEX job_waiting_keyed_idx ON x_jobs.job USING btree (queue, run_at, id) '
         'INCLUDE (priority, concurrency_key, concurrency_limit) '
         'WHERE ((state = ANY (ARRAY[''delayed''::x_jobs.job_state, ''suspended''::x_jobs.job_state])) '
         'AND (concurrency_key IS NOT NULL))')
    $$,
    'Each index of x_jobs.job should have its documented columns, uniqueness and partial predicate'
);

-- A publish reads only the open waits (step_waiting_idx); a wait reaching its step looks up the
-- first event of a name, or of a name and key, since an instant.
SELECT indexes_are(
    'x_jobs', 'step', ARRAY['step_pkey', 'step_waiting_idx'],
    'x_jobs.step should have exactly its primary key and the index of the open waits'
);

SELECT indexes_are(
    'x_jobs', 'event', ARRAY['event_pkey', 'event_name_idx', 'event_key_idx'],
    'x_jobs.event should have exactly its primary key and the by-name and by-key lookup indexes'
);

SELECT results_eq(
    $$
    SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid IN ('x_jobs.step'::regclass, 'x_jobs.event'::regclass)
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.event_key_idx',
         'CREATE INDEX event_key_idx ON x_jobs.event USING btree (tenant_id, name, key, published_at) '
         'WHERE (key IS NOT NULL)'),
        ('x_jobs.event_name_idx',
         'CREATE INDEX event_name_idx ON x_jobs.event USING btree (tenant_id, name, published_at)'),
        ('x_jobs.event_pkey',
         'CREATE UNIQUE INDEX event_pkey ON x_jobs.event USING btree (id)'),
        ('x_jobs.step_pkey',
         'CREATE UNIQUE INDEX step_pkey ON x_jobs.step USING btree (job_id, name, compensation)'),
        ('x_jobs.step_waiting_idx',
         'CREATE INDEX step_waiting_idx ON x_jobs.step USING btree (event, event_key) '
         'WHERE (status = ''waiting''::x_jobs.step_status)')
    $$,
    'Each index of x_jobs.step and x_jobs.event should have its documented columns, uniqueness and predicate'
);

-- relay_outbox repeats the predicates of the three arms and of the per-key lookups word for
-- word, as the claim does; purge_webhook_ledger deletes along received_at.
SELECT indexes_are(
    'x_jobs', 'outbox',
    ARRAY[
        'outbox_pkey', 'outbox_pending_keyless_idx', 'outbox_pending_keyed_idx', 'outbox_inflight_idx',
        'outbox_key_idx'
    ],
    'x_jobs.outbox should have exactly its primary key, the three relay arms and the per-key index'
);

SELECT indexes_are(
    'x_jobs', 'webhook_ledger', ARRAY['webhook_ledger_pkey', 'webhook_ledger_received_idx'],
    'x_jobs.webhook_ledger should have exactly its primary key and the retention index'
);

SELECT results_eq(
    $$
    SELECT i.indexrelid::regclass::text, pg_catalog.pg_get_indexdef(i.indexrelid)
    FROM pg_catalog.pg_index AS i
    WHERE i.indrelid IN ('x_jobs.outbox'::regclass, 'x_jobs.webhook_ledger'::regclass)
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.outbox_inflight_idx',
         'CREATE INDEX outbox_inflight_idx ON x_jobs.outbox USING btree (available_at, id) '
         'WHERE (state = ''inflight''::x_jobs.outbox_state)'),
        ('x_jobs.outbox_key_idx',
         'CREATE INDEX outbox_key_idx ON x_jobs.outbox USING btree (key, state, id) '
         'WHERE ((key IS NOT NULL) AND (state = ANY (ARRAY[''pending''::x_jobs.outbox_state, '
         '''inflight''::x_jobs.outbox_state])))'),
        ('x_jobs.outbox_pending_keyed_idx',
         'CREATE INDEX outbox_pending_keyed_idx ON x_jobs.outbox USING btree (available_at, id) '
         'WHERE ((state = ''pending''::x_jobs.outbox_state) AND (key IS NOT NULL))'),
        ('x_jobs.outbox_pending_keyless_idx',
         'CREATE INDEX outbox_pending_keyless_idx ON x_jobs.outbox USING btree (available_at, id) '
         'WHERE ((state = ''pending''::x_jobs.outbox_state) AND (key IS NULL))'),
        ('x_jobs.outbox_pkey',
         'CREATE UNIQUE INDEX outbox_pkey ON x_jobs.outbox USING btree (id)'),
        ('x_jobs.webhook_ledger_pkey',
         'CREATE UNIQUE INDEX webhook_ledger_pkey ON x_jobs.webhook_ledger USING btree (source, tenant_id, webhook_id)'),
        ('x_jobs.webhook_ledger_received_idx',
         'CREATE INDEX webhook_ledger_received_idx ON x_jobs.webhook_ledger USING btree (received_at)')
    $$,
    'Each index of x_jobs.outbox and x_jobs.webhook_ledger should have its documented columns, uniqueness and '
    'predicate'
);

-- pg_dump keeps the rows of an extension's tables only when they are registered.
SELECT results_eq(
    $$
    SELECT c.config::regclass::text, e.extcondition[c.n] COLLATE "default"
    FROM pg_catalog.pg_extension AS e
    CROSS JOIN LATERAL unnest(e.extconfig) WITH ORDINALITY AS c (config, n)
    WHERE e.extname = 'x_jobs'
    ORDER BY 1
    $$,
    $$
    VALUES
        ('x_jobs.consumer_cursor', ''),
        ('x_jobs.counter', ''),
        ('x_jobs.event', ''),
        ('x_jobs.event_id_seq', ''),
        ('x_jobs.job', ''),
        ('x_jobs.job_error', ''),
        ('x_jobs.job_id_seq', ''),
        ('x_jobs.job_rate', ''),
        ('x_jobs.job_type', ''),
        ('x_jobs.outbox', ''),
        ('x_jobs.outbox_id_seq', ''),
        ('x_jobs.queue_pause', ''),
        ('x_jobs.queue_policy', ''),
        ('x_jobs.queue_weight', ''),
        ('x_jobs.rate_limit', ''),
        ('x_jobs.schedule', ''),
        ('x_jobs.step', ''),
        ('x_jobs.stream_entry', ''),
        ('x_jobs.stream_entry_id_seq', ''),
        ('x_jobs.tenant_binding', ''),
        ('x_jobs.webhook_ledger', '')
    $$,
    'pg_dump should keep every row of job, job_error, queue_pause, counter, step, event, outbox, webhook_ledger, '
    'job_type, schedule, tenant_binding, rate_limit, job_rate, queue_policy and queue_weight, '
    'and the three id sequences'
);

-- Every function: return type, volatility, security ------------------------------------------

SELECT
    function_returns(
        'x_jobs', a.fn, a.args, a.return_type,
        pg_catalog.format(
            'x_jobs.%s(%s) should return %s', a.fn, pg_catalog.array_to_string(a.args, ', '), a.return_type
        )
    )
FROM api AS a
ORDER BY a.fn;

SELECT
    volatility_is(
        'x_jobs', a.fn, a.args, a.volatility,
        pg_catalog.format('x_jobs.%s(%s) should be %s', a.fn, pg_catalog.array_to_string(a.args, ', '), a.volatility)
    )
FROM api AS a
ORDER BY a.fn;

SELECT
    CASE
        WHEN a.runs_as_owner_because IS NOT NULL
            THEN is_definer(
                'x_jobs', a.fn, a.args,
                pg_catalog.format(
                    'x_jobs.%s(%s) should run as its owner, %s', a.fn, pg_catalog.array_to_string(a.args, ', '),
                    a.runs_as_owner_because
                )
            )
        ELSE isnt_definer(
            'x_jobs', a.fn, a.args,
            pg_catalog.format(
                'x_jobs.%s(%s) should run with the rights of its caller', a.fn, pg_catalog.array_to_string(a.args, ', ')
            )
        )
    END
FROM api AS a
ORDER BY a.fn;

-- The table functions: their output columns are what callers select by name.
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.error_codes()'::regprocedure),
    'TABLE(sqlstate text, code text, meaning text)',
    'x_jobs.error_codes() should answer (sqlstate, code, meaning)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.health()'::regprocedure),
    'TABLE(check_name text, ok boolean, detail text, hint text)',
    'x_jobs.health() should answer (check_name, ok, detail, hint)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.queue_demand()'::regprocedure),
    'TABLE(queue text, demand bigint)',
    'x_jobs.queue_demand() should answer (queue, demand)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.queue_gauges(interval, text[])'::regprocedure),
    'TABLE(queue text, ready bigint, delayed bigint, suspended bigint, running bigint, paused boolean, '
    'demand bigint, taken_at timestamp with time zone)',
    'x_jobs.queue_gauges() should answer (queue, ready, delayed, suspended, running, paused, demand, taken_at)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.publish(text, jsonb, text)'::regprocedure),
    'TABLE(event_id bigint, woken integer)',
    'x_jobs.publish() should answer (event_id, woken)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.outbox_put_many(jsonb)'::regprocedure),
    'TABLE(ord integer, id bigint)',
    'x_jobs.outbox_put_many() should answer (ord, id)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.relay_outbox(text, integer, interval, text[])'::regprocedure),
    'TABLE(id bigint, topic text, key text, payload jsonb, headers jsonb, attempt integer)',
    'x_jobs.relay_outbox() should answer (id, topic, key, payload, headers, attempt)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.job_types()'::regprocedure),
    'TABLE(name text, queue text, max_attempts integer, priority integer, dead_letter boolean, '
    'backoff_base interval, backoff_max interval, keep_done boolean, concurrency_key text, '
    'concurrency_limit integer, timeout interval, declared_at timestamp with time zone, declared_by text, '
    'build text, served_by text[], parked bigint)',
    'x_jobs.job_types() should answer the declaration, who serves it and how many rows are parked'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.hand_back(bigint[], text, interval, integer[])'::regprocedure),
    'TABLE(id bigint, name text, parked boolean, served_by text[])',
    'x_jobs.hand_back() should answer (id, name, parked, served_by)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.receive_webhook(text, text, text, jsonb, text, jsonb)'::regprocedure),
    'TABLE(job_id bigint, duplicate boolean)',
    'x_jobs.receive_webhook() should answer (job_id, duplicate)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.cron_next(text, text, timestamptz, integer)'::regprocedure),
    'TABLE(fire_at timestamp with time zone)',
    'x_jobs.cron_next() should answer (fire_at)'
);
SELECT is(
    pg_catalog.pg_get_function_result('x_jobs.tick_schedules(integer)'::regprocedure),
    'TABLE(schedules integer, enqueued integer, skipped integer, next_fire_at timestamp with time zone)',
    'x_jobs.tick_schedules() should answer (schedules, enqueued, skipped, next_fire_at)'
);

-- search_path ---------------------------------------------------------------------------------

SELECT set_eq(
    $$
    SELECT p.proname::text COLLATE "default"
    FROM pg_catalog.pg_proc AS p
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND NOT EXISTS (
            SELECT FROM unnest(p.proconfig) AS s (setting) WHERE s.setting LIKE 'search\_path=%'
        )
    $$,
    ARRAY[
        'now', '_minute', '_shard', '_max_payload_bytes', '_payload_bytes', '_clock', '_filled', '_schedule_request',
        '_caller'
    ],
    'Every function should pin search_path except the tiny SQL helpers now, _minute, _shard, _max_payload_bytes, '
    '_payload_bytes, _clock, _filled, _schedule_request and _caller'
);

SELECT is_empty(
    $$
    SELECT p.proname, l.lanname, p.proconfig, p.prosecdef, p.proisstrict
    FROM pg_catalog.pg_proc AS p
    INNER JOIN pg_catalog.pg_language AS l ON p.prolang = l.oid
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND p.proname IN (
            'now', '_minute', '_shard', '_max_payload_bytes', '_payload_bytes', '_clock', '_filled', '_schedule_request',
            '_caller'
        )
        AND (l.lanname <> 'sql' OR p.proconfig IS NOT NULL OR p.prosecdef)
    $$,
    'The helpers that skip search_path should be plain SQL functions with no SET clause, so they can inline'
);

SELECT is_empty(
    $$
    SELECT p.proname, s.setting
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL unnest(p.proconfig) AS s (setting)
    WHERE
        p.pronamespace = 'x_jobs'::regnamespace
        AND s.setting LIKE 'search\_path=%'
        AND s.setting <> 'search_path=pg_catalog, pg_temp'
    $$,
    'A pinned search_path should be exactly pg_catalog, pg_temp'
);

-- The other settings a function pins: the two claim queries (claim, relay_outbox) keep their
-- generic plan (the same seeks, without re-planning every call) and never compile it with JIT
-- (the generic plan's LIMIT is costed above the JIT thresholds on a big table); relay_outbox
-- walks its index in order even before the outbox has statistics (no bitmap scan and sort),
-- and joins by seeks only, locking its window's heads as it finds them (0.3.7); the settling
-- functions that take a batch of ids seek each id whatever the batch's size, and lock the rows
-- in id order (index plans only, 0.3.4; no bitmap scans either, 0.3.9); list_jobs plans each
-- call for its values (0.3.7); claim joins by seeks only too (its keyed windows, 0.3.8); the bulk
-- operations plan each statement for its values and walk their indexes in id order (0.4.0); the
-- cron evaluator and the zone check run in the zone they read (TimeZone, restored on return:
-- AT TIME ZONE would read a zone named like an abbreviation, CET, as the abbreviation, 0.4.2).
SELECT set_eq(
    $$
    SELECT p.proname::text COLLATE "default", s.setting
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL unnest(p.proconfig) AS s (setting)
    WHERE p.pronamespace = 'x_jobs'::regnamespace AND s.setting NOT LIKE 'search\_path=%'
    $$,
    $$
    VALUES
        ('claim', 'plan_cache_mode=force_generic_plan'),
        ('claim', 'jit=off'),
        ('claim', 'enable_hashjoin=off'),
        ('claim', 'enable_mergejoin=off'),
        ('claim', 'enable_seqscan=off'),
        ('claim', 'enable_bitmapscan=off'),
        ('relay_outbox', 'plan_cache_mode=force_generic_plan'),
        ('relay_outbox', 'jit=off'),
        ('relay_outbox', 'enable_bitmapscan=off'),
        ('relay_outbox', 'enable_seqscan=off'),
        ('relay_outbox', 'enable_hashjoin=off'),
        ('relay_outbox', 'enable_mergejoin=off'),
        ('complete_many', 'plan_cache_mode=force_generic_plan'),
        ('complete_many', 'enable_seqscan=off'),
        ('complete_many', 'enable_bitmapscan=off'),
        ('extend_lease', 'plan_cache_mode=force_generic_plan'),
        ('extend_lease', 'enable_seqscan=off'),
        ('extend_lease', 'enable_bitmapscan=off'),
        ('release', 'plan_cache_mode=force_generic_plan'),
        ('release', 'enable_seqscan=off'),
        ('release', 'enable_bitmapscan=off'),
        ('list_jobs', 'plan_cache_mode=force_custom_plan'),
        ('list_outbox', 'plan_cache_mode=force_custom_plan'),
        ('list_outbox', 'max_parallel_workers_per_gather=0'),
        ('cancel_jobs', 'plan_cache_mode=force_custom_plan'),
        ('cancel_jobs', 'enable_seqscan=off'),
        ('cancel_jobs', 'enable_bitmapscan=off'),
        ('retry_jobs', 'plan_cache_mode=force_custom_plan'),
        ('retry_jobs', 'enable_seqscan=off'),
        ('retry_jobs', 'enable_bitmapscan=off'),
        ('_cron_next', 'TimeZone=UTC'),
        ('_require_time_zone', 'TimeZone=UTC')
    $$,
    'Only claim, relay_outbox, the batch settlers, list_jobs, list_outbox, the bulk operations, the cron '
    'evaluator and the zone check should pin settings besides search_path'
);

-- Parameter names and defaults: callers use named notation, so both are API -----------------

-- Every public function, as pg_get_function_arguments prints its parameters. The private
-- helpers (_*) are called by position from our own bodies only.
CREATE TEMP TABLE api_param (
    fn name PRIMARY KEY REFERENCES api (fn),
    arguments text NOT NULL
);

INSERT INTO api_param (fn, arguments) VALUES
('now', ''),
('error_codes', ''),
('version', ''),
('health', ''),
(
    'enqueue',
    'name text, input jsonb DEFAULT ''{}''::jsonb, queue text DEFAULT NULL::text, '
    'run_at timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'idempotency_key text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, '
    'priority integer DEFAULT NULL::integer, tenant_id text DEFAULT NULL::text, '
    'concurrency_key text DEFAULT NULL::text, traceparent text DEFAULT NULL::text, '
    'enqueued_by text DEFAULT NULL::text, concurrency_limit integer DEFAULT NULL::integer, '
    'dead_letter boolean DEFAULT NULL::boolean, backoff_base interval DEFAULT NULL::interval, '
    'backoff_max interval DEFAULT NULL::interval, keep_done boolean DEFAULT NULL::boolean, '
    'rate_limit_key text DEFAULT NULL::text'
),
('enqueue_many', 'jobs jsonb'),
('result', 'id bigint'),
(
    'claim',
    'queues text[], worker text, lease interval DEFAULT ''00:00:30''::interval, qty integer DEFAULT 1'
),
('release', 'ids bigint[], worker text, attempts integer[] DEFAULT NULL::integer[]'),
(
    'extend_lease',
    'ids bigint[], worker text, lease interval DEFAULT ''00:00:30''::interval, '
    'attempts integer[] DEFAULT NULL::integer[]'
),
(
    'complete_many',
    'ids bigint[], worker text, outputs jsonb[] DEFAULT NULL::jsonb[], attempts integer[] DEFAULT NULL::integer[]'
),
('complete', 'id bigint, worker text, output jsonb DEFAULT NULL::jsonb, attempt integer DEFAULT NULL::integer'),
(
    'fail',
    'id bigint, worker text, error text, error_stack text DEFAULT NULL::text, '
    'retry_delay interval DEFAULT NULL::interval, retryable boolean DEFAULT true, '
    'attempt integer DEFAULT NULL::integer'
),
('cancel', 'id bigint'),
('retry', 'id bigint'),
(
    'list_jobs',
    'state text DEFAULT NULL::text, queue text DEFAULT NULL::text, before_id bigint DEFAULT NULL::bigint, '
    'max_rows integer DEFAULT 50, name text DEFAULT NULL::text'
),
(
    'cancel_jobs',
    'queue text DEFAULT NULL::text, name text DEFAULT NULL::text, state text DEFAULT NULL::text, '
    'tenant_id text DEFAULT NULL::text, '
    'created_before timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'created_after timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'max_rows integer DEFAULT NULL::integer, dry_run boolean DEFAULT false'
),
(
    'retry_jobs',
    'queue text DEFAULT NULL::text, name text DEFAULT NULL::text, state text DEFAULT NULL::text, '
    'tenant_id text DEFAULT NULL::text, '
    'created_before timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'created_after timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'max_rows integer DEFAULT NULL::integer, dry_run boolean DEFAULT false'
),
('pause_queue', 'queue text'),
('resume_queue', 'queue text'),
(
    'announce_worker',
    'worker text, queues text[], build text DEFAULT NULL::text, draining boolean DEFAULT false, '
    'ttl interval DEFAULT ''00:01:00''::interval, jobs text[] DEFAULT NULL::text[]'
),
('queue_demand', ''),
('queue_stats', ''),
('queue_gauges', 'max_age interval DEFAULT ''00:00:15''::interval, queues text[] DEFAULT NULL::text[]'),
(
    'rollup_counters',
    'minutes_for interval DEFAULT ''02:00:00''::interval, hours_for interval DEFAULT ''2 days''::interval, '
    'days_for interval DEFAULT ''400 days''::interval'
),
('purge', 'older_than interval, batch_size integer DEFAULT 10000'),
('steps', 'id bigint, worker text, attempt integer DEFAULT NULL::integer'),
(
    'step_record',
    'id bigint, worker text, step text, output jsonb DEFAULT NULL::jsonb, error text DEFAULT NULL::text, '
    'compensation boolean DEFAULT false, attempt integer DEFAULT NULL::integer'
),
('step_sleep', 'id bigint, worker text, step text, duration interval, attempt integer DEFAULT NULL::integer'),
(
    'step_wait',
    'id bigint, worker text, step text, event text, event_key text DEFAULT NULL::text, '
    'match jsonb DEFAULT NULL::jsonb, timeout interval DEFAULT NULL::interval, '
    'since timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'attempt integer DEFAULT NULL::integer'
),
('publish', 'event text, payload jsonb DEFAULT NULL::jsonb, key text DEFAULT NULL::text'),
('resolve_step', 'job bigint, step text, output jsonb DEFAULT NULL::jsonb'),
(
    'progress',
    'id bigint, worker text, done double precision DEFAULT NULL::double precision, '
    'total double precision DEFAULT NULL::double precision, note text DEFAULT NULL::text, '
    'attempt integer DEFAULT NULL::integer'
),
('purge_events', 'older_than interval, batch_size integer DEFAULT 10000'),
-- The outbox (0.2.0).
(
    'outbox_put',
    'topic text, payload jsonb, key text DEFAULT NULL::text, headers jsonb DEFAULT NULL::jsonb, '
    'max_attempts integer DEFAULT NULL::integer'
),
('outbox_put_many', 'messages jsonb'),
(
    'relay_outbox',
    'relay text, qty integer DEFAULT 100, lease interval DEFAULT ''00:00:30''::interval, '
    'topics text[] DEFAULT NULL::text[]'
),
('outbox_ack', 'ids bigint[], relay text'),
('outbox_extend_lease', 'ids bigint[], relay text, lease interval DEFAULT ''00:00:30''::interval'),
(
    'outbox_nack',
    'id bigint, relay text, error text, '
    'retry_at timestamp with time zone DEFAULT NULL::timestamp with time zone, retryable boolean DEFAULT true'
),
(
    'outbox_redrive',
    'ids bigint[] DEFAULT NULL::bigint[], topic text DEFAULT NULL::text, max_rows integer DEFAULT 1000'
),
('purge_outbox', 'older_than interval, batch_size integer DEFAULT 10000'),
(
    'receive_webhook',
    'source text, webhook_id text, name text, input jsonb DEFAULT NULL::jsonb, queue text DEFAULT NULL::text, '
    'request jsonb DEFAULT NULL::jsonb'
),
('purge_webhook_ledger', 'older_than interval, batch_size integer DEFAULT 10000'),
-- Declarations (0.4.0).
(
    'declare_job',
    'name text, queue text DEFAULT NULL::text, max_attempts integer DEFAULT NULL::integer, '
    'backoff_base interval DEFAULT NULL::interval, backoff_max interval DEFAULT NULL::interval, '
    'dead_letter boolean DEFAULT NULL::boolean, timeout interval DEFAULT NULL::interval, '
    'concurrency_limit integer DEFAULT NULL::integer, concurrency_key text DEFAULT NULL::text, '
    'keep_done boolean DEFAULT NULL::boolean, priority integer DEFAULT NULL::integer, '
    'declared_by text DEFAULT NULL::text, build text DEFAULT NULL::text, '
    'rate_limit_key text DEFAULT NULL::text'
),
('declare_jobs', 'jobs jsonb, declared_by text DEFAULT NULL::text, build text DEFAULT NULL::text'),
('job_types', ''),
('drop_job_type', 'name text'),
(
    'hand_back',
    'ids bigint[], worker text, delay interval DEFAULT ''00:00:01''::interval, '
    'attempts integer[] DEFAULT NULL::integer[]'
),
('job_detail', 'id bigint'),
('job_errors', 'id bigint'),
('job_steps', 'id bigint'),
('job_states', 'ids bigint[]'),
('held_jobs', 'worker text'),
(
    'list_outbox',
    'state text DEFAULT NULL::text, topic text DEFAULT NULL::text, key text DEFAULT NULL::text, '
    'before_id bigint DEFAULT NULL::bigint, max_rows integer DEFAULT 50'
),
('outbox_message', 'id bigint'),
('job_counters', 'since timestamp with time zone DEFAULT NULL::timestamp with time zone'),
(
    'cron_next',
    'cron text, tz text DEFAULT ''UTC''::text, after timestamp with time zone DEFAULT NULL::timestamp with time zone, '
    'count integer DEFAULT 1'
),
(
    'set_schedule',
    'name text, job text, cron text, tz text DEFAULT ''UTC''::text, input jsonb DEFAULT ''{}''::jsonb, '
    'queue text DEFAULT NULL::text, catchup text DEFAULT ''latest''::text, catchup_max integer DEFAULT 100, '
    'overlap text DEFAULT ''allow''::text, grace interval DEFAULT ''00:01:00''::interval, '
    'priority integer DEFAULT NULL::integer, max_attempts integer DEFAULT NULL::integer, '
    'tenant_id text DEFAULT NULL::text, concurrency_key text DEFAULT NULL::text, '
    'concurrency_limit integer DEFAULT NULL::integer, dead_letter boolean DEFAULT NULL::boolean, '
    'backoff_base interval DEFAULT NULL::interval, backoff_max interval DEFAULT NULL::interval, '
    'keep_done boolean DEFAULT NULL::boolean, paused boolean DEFAULT NULL::boolean, '
    'origin text DEFAULT NULL::text, declared_by text DEFAULT NULL::text'
),
('drop_schedule', 'name text'),
('pause_schedule', 'name text'),
('resume_schedule', 'name text'),
('list_schedules', 'name text DEFAULT NULL::text'),
('run_schedule_now', 'name text'),
('tick_schedules', 'max_rows integer DEFAULT 1000'),
('bind_tenant', 'role name, tenant text'),
('unbind_tenant', 'role name, tenant text'),
('tenant_bindings', ''),
('set_rate_limit', 'key text, max_starts integer, per interval'),
('drop_rate_limit', 'key text'),
('notify_tags', 'channel text, names text[]'),
('stream_append', 'stream text, key text, payload jsonb'),
('stream_append_many', 'stream text, entries jsonb'),
(
    'stream_read',
    'stream text, after text DEFAULT NULL::text, max_rows integer DEFAULT 100, '
    'key text DEFAULT NULL::text'
),
('consumer_cursor', 'consumer text, key text'),
('save_cursor', 'consumer text, key text, cursor jsonb'),
('rate_limits', ''),
('set_queue_policy', 'queue text, fair boolean DEFAULT NULL::boolean, weights jsonb DEFAULT NULL::jsonb'),
('queue_policies', '');

SELECT set_eq(
    $$ SELECT e.fn FROM api_param AS e $$,
    $$ SELECT a.fn FROM api AS a WHERE a.fn NOT LIKE '\_%' $$,
    'The parameters of every public function, and only of those, should be pinned here'
);

SELECT
    is(
        pg_catalog.pg_get_function_arguments(p.oid),
        e.arguments,
        pg_catalog.format('x_jobs.%s should take the parameters (%s)', e.fn, e.arguments)
    )
FROM api_param AS e
LEFT JOIN pg_catalog.pg_proc AS p ON p.pronamespace = 'x_jobs'::regnamespace AND e.fn = p.proname
ORDER BY e.fn;

-- Roles and privileges ------------------------------------------------------------------------

SELECT has_role('x_jobs_producer', 'The role x_jobs_producer should exist');
SELECT has_role('x_jobs_worker', 'The role x_jobs_worker should exist');
SELECT has_role('x_jobs_admin', 'The role x_jobs_admin should exist');
SELECT is_member_of(
    'x_jobs_producer', ARRAY['x_jobs_worker'], 'A worker should be a producer too, since a job may enqueue jobs'
);
SELECT is_member_of('x_jobs_worker', ARRAY['x_jobs_admin'], 'An admin should be a worker too');
SELECT has_role('x_jobs_webhook', 'The role x_jobs_webhook should exist');
SELECT is_empty(
    $$
    SELECT g.rolname, u.rolname
    FROM pg_catalog.pg_auth_members AS m
    INNER JOIN pg_catalog.pg_roles AS g ON m.roleid = g.oid
    INNER JOIN pg_catalog.pg_roles AS u ON m.member = u.oid
    WHERE u.rolname = 'x_jobs_webhook' OR (g.rolname = 'x_jobs_webhook' AND u.rolname LIKE 'x\_jobs\_%')
    $$,
    'x_jobs_webhook should be a member of no x_jobs role and have none as a member: an admin is no receiver'
);

SELECT
    schema_privs_are(
        'x_jobs', r.grantee, CASE WHEN r.grantee = 'public' THEN '{}' ELSE '{USAGE}' END::name[],
        pg_catalog.format(
            'Role %s should %s the x_jobs schema, and create nothing in it',
            r.grantee, CASE WHEN r.grantee = 'public' THEN 'not use' ELSE 'use' END
        )
    )
FROM grant_role AS r
ORDER BY r.grantee;

-- Effective EXECUTE rights: what a member of each role can run, inherited rights included.
SELECT
    function_privs_are(
        'x_jobs', g.fn, a.args, r.grantee,
        CASE
            WHEN
                r.chain_rank >= lr.chain_rank
                OR r.grantee = g.lowest_role
                OR (r.grantee = 'pg_monitor' AND g.to_pg_monitor)
                THEN '{EXECUTE}'
            ELSE '{}'
        END::name[],
        pg_catalog.format(
            'Role %s should %s x_jobs.%s',
            r.grantee,
            CASE
                WHEN
                    r.chain_rank >= lr.chain_rank
                    OR r.grantee = g.lowest_role
                    OR (r.grantee = 'pg_monitor' AND g.to_pg_monitor)
                    THEN 'be able to run'
                ELSE 'not be able to run'
            END,
            g.fn
        )
    )
FROM api_grant AS g
INNER JOIN api AS a ON g.fn = a.fn
LEFT JOIN grant_role AS lr ON g.lowest_role = lr.grantee
CROSS JOIN grant_role AS r
ORDER BY g.fn, r.grantee;

-- The grants themselves: each right is granted once, to the lowest role that needs it.
SELECT set_eq(
    $$
    SELECT p.proname::text COLLATE "default", coalesce(r.rolname::text COLLATE "default", 'public')
    FROM pg_catalog.pg_proc AS p
    CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE p.pronamespace = 'x_jobs'::regnamespace AND acl.grantee <> p.proowner
    $$,
    $$
    SELECT g.fn::text, g.lowest_role::text FROM api_grant AS g WHERE g.lowest_role IS NOT NULL
    UNION ALL
    SELECT g.fn::text, 'pg_monitor' FROM api_grant AS g WHERE g.to_pg_monitor
    $$,
    'EXECUTE should be granted directly only as the Grants section states: to the lowest role, and to pg_monitor'
);

SELECT set_eq(
    $$
    SELECT c.relname::text COLLATE "default", coalesce(r.rolname::text COLLATE "default", 'public'), acl.privilege_type
    FROM pg_catalog.pg_class AS c
    CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE c.relnamespace = 'x_jobs'::regnamespace AND acl.grantee <> c.relowner
    $$,
    $$
    VALUES
        -- A producer has no right on any table, and a worker only reads the jobs and the
        -- outbox (0.3.6): what they call runs as its owner. An admin's functions run as the
        -- admin, who holds what they change.
        ('job', 'x_jobs_worker', 'SELECT'),
        ('job', 'x_jobs_admin', 'UPDATE'),
        ('job', 'x_jobs_admin', 'DELETE'),
        ('job_error', 'x_jobs_admin', 'SELECT'),
        ('job_error', 'x_jobs_admin', 'DELETE'),
        ('queue_pause', 'x_jobs_admin', 'SELECT'),
        ('queue_pause', 'x_jobs_admin', 'INSERT'),
        ('queue_pause', 'x_jobs_admin', 'DELETE'),
        ('worker', 'x_jobs_admin', 'SELECT'),
        ('worker_login', 'x_jobs_admin', 'SELECT'),
        ('counter', 'x_jobs_admin', 'SELECT'),
        ('counter', 'x_jobs_admin', 'INSERT'),
        ('counter', 'x_jobs_admin', 'UPDATE'),
        ('counter', 'x_jobs_admin', 'DELETE'),
        -- Steps and events: publish writes both as its owner, so a producer has neither.
        ('step', 'x_jobs_admin', 'SELECT'),
        ('step', 'x_jobs_admin', 'UPDATE'),
        ('step', 'x_jobs_admin', 'DELETE'),
        ('event', 'x_jobs_admin', 'SELECT'),
        ('event', 'x_jobs_admin', 'DELETE'),
        -- The outbox and the webhook ledger.
        ('outbox', 'x_jobs_worker', 'SELECT'),
        ('outbox', 'x_jobs_admin', 'UPDATE'),
        ('outbox', 'x_jobs_admin', 'DELETE'),
        ('webhook_ledger', 'x_jobs_admin', 'SELECT'),
        ('webhook_ledger', 'x_jobs_admin', 'DELETE'),
        -- Declarations: workers write them through declare_job(s), which run as their owner.
        ('job_type', 'x_jobs_admin', 'SELECT'),
        ('job_type', 'x_jobs_admin', 'DELETE'),
        -- Schedules: workers set, list and tick them through functions that run as their owner;
        -- an admin pauses, resumes and drops them as itself.
        ('schedule', 'x_jobs_admin', 'SELECT'),
        ('schedule', 'x_jobs_admin', 'UPDATE'),
        ('schedule', 'x_jobs_admin', 'DELETE'),
        -- Rate limits: purge deletes the jobs' rows as the admin; the limits change only
        -- through functions that run as their owner.
        ('job_rate', 'x_jobs_admin', 'SELECT'),
        ('job_rate', 'x_jobs_admin', 'DELETE')
    $$,
    'Table and sequence privileges should be granted directly only as the Grants section states, none to PUBLIC'
);

SELECT set_eq(
    $$
    SELECT coalesce(r.rolname::text COLLATE "default", 'public'), acl.privilege_type
    FROM pg_catalog.pg_namespace AS n
    CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) AS acl
    LEFT JOIN pg_catalog.pg_roles AS r ON acl.grantee = r.oid
    WHERE n.nspname = 'x_jobs' AND acl.grantee <> n.nspowner
    $$,
    $$ VALUES ('x_jobs_producer', 'USAGE'), ('x_jobs_webhook', 'USAGE'), ('pg_monitor', 'USAGE') $$,
    'USAGE on the schema should be granted directly to x_jobs_producer, x_jobs_webhook and pg_monitor only'
);

-- Who owns what (0.4.0): every object of the schema is x_jobs_owner's, so that the functions that
-- run as their owner run with its rights, not those of the superuser that ran the script; and
-- that role may read other sessions' start times (the restart grace) and nothing beyond x_jobs.
SELECT is_empty(
    $$
    SELECT 'schema', n.nspname::text, pg_catalog.pg_get_userbyid(n.nspowner)::text
    FROM pg_catalog.pg_namespace AS n
    WHERE n.nspname = 'x_jobs' AND n.nspowner <> 'x_jobs_owner'::regrole
    UNION ALL
    SELECT 'relation', c.relname::text, pg_catalog.pg_get_userbyid(c.relowner)::text
    FROM pg_catalog.pg_class AS c
    WHERE c.relnamespace = 'x_jobs'::regnamespace AND c.relowner <> 'x_jobs_owner'::regrole
    UNION ALL
    SELECT 'type', t.typname::text, pg_catalog.pg_get_userbyid(t.typowner)::text
    FROM pg_catalog.pg_type AS t
    WHERE t.typnamespace = 'x_jobs'::regnamespace AND t.typowner <> 'x_jobs_owner'::regrole
    UNION ALL
    SELECT 'function', p.oid::regprocedure::text, pg_catalog.pg_get_userbyid(p.proowner)::text
    FROM pg_catalog.pg_proc AS p
    WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.proowner <> 'x_jobs_owner'::regrole
    $$,
    'Every object of the x_jobs schema should be owned by x_jobs_owner'
);

SELECT row_eq(
    $$
    SELECT r.rolcanlogin, r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls
    FROM pg_catalog.pg_roles AS r
    WHERE r.rolname = 'x_jobs_owner'
    $$,
    row(FALSE, FALSE, FALSE, FALSE, FALSE, FALSE),
    'x_jobs_owner should be a role nobody logs in as, with no attribute'
);

SELECT set_eq(
    $$
    SELECT g.rolname::text COLLATE "default" AS granted, u.rolname::text COLLATE "default" AS member
    FROM pg_catalog.pg_auth_members AS m
    INNER JOIN pg_catalog.pg_roles AS g ON m.roleid = g.oid
    INNER JOIN pg_catalog.pg_roles AS u ON m.member = u.oid
    WHERE 'x_jobs_owner' IN (g.rolname, u.rolname)
    $$,
    $$ VALUES ('pg_read_all_stats', 'x_jobs_owner') $$,
    'x_jobs_owner should be a member of pg_read_all_stats only, and have no member'
);

SELECT set_eq(
    $$
    SELECT g.rolname::text COLLATE "default" AS granted, u.rolname::text COLLATE "default" AS member
    FROM pg_catalog.pg_auth_members AS m
    INNER JOIN pg_catalog.pg_roles AS g ON m.roleid = g.oid
    INNER JOIN pg_catalog.pg_roles AS u ON m.member = u.oid
    WHERE u.rolname IN ('x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin')
    $$,
    $$ VALUES ('x_jobs_producer', 'x_jobs_worker'), ('x_jobs_worker', 'x_jobs_admin') $$,
    'The three x_jobs roles should be linked producer < worker < admin and be members of nothing else'
);

-- Effective table rights, inherited ones included.
SELECT
    table_privs_are(
        'x_jobs', t.tbl, r.grantee, t.privs::name[],
        pg_catalog.format(
            'Role %s should have %s on x_jobs.%s',
            r.grantee, coalesce(nullif(pg_catalog.array_to_string(t.privs::text[], ', '), ''), 'no privilege'), t.tbl
        )
    )
FROM (
    VALUES
    ('job', 'x_jobs_producer', '{}'),
    ('job', 'x_jobs_worker', '{SELECT}'),
    ('job', 'x_jobs_admin', '{DELETE,SELECT,UPDATE}'),
    ('job', 'pg_monitor', '{}'),
    ('job', 'public', '{}'),
    ('job_error', 'x_jobs_producer', '{}'),
    ('job_error', 'x_jobs_worker', '{}'),
    ('job_error', 'x_jobs_admin', '{DELETE,SELECT}'),
    ('job_error', 'pg_monitor', '{}'),
    ('job_error', 'public', '{}'),
    ('queue_pause', 'x_jobs_producer', '{}'),
    ('queue_pause', 'x_jobs_worker', '{}'),
    ('queue_pause', 'x_jobs_admin', '{DELETE,INSERT,SELECT}'),
    ('queue_pause', 'pg_monitor', '{}'),
    ('queue_pause', 'public', '{}'),
    ('worker', 'x_jobs_producer', '{}'),
    ('worker', 'x_jobs_worker', '{}'),
    ('worker', 'x_jobs_admin', '{SELECT}'),
    ('worker', 'pg_monitor', '{}'),
    ('worker', 'public', '{}'),
    -- The fence's bindings: written by _fence as its owner, read by admins.
    ('worker_login', 'x_jobs_producer', '{}'),
    ('worker_login', 'x_jobs_worker', '{}'),
    ('worker_login', 'x_jobs_admin', '{SELECT}'),
    ('worker_login', 'pg_monitor', '{}'),
    ('worker_login', 'public', '{}'),
    -- The events' lock rows: only publish and step_wait lock them, as their owner.
    ('event_lock', 'x_jobs_producer', '{}'),
    ('event_lock', 'x_jobs_worker', '{}'),
    ('event_lock', 'x_jobs_admin', '{}'),
    ('event_lock', 'pg_monitor', '{}'),
    ('event_lock', 'public', '{}'),
    -- The gauges' snapshot: queue_gauges reads and writes it as its owner.
    ('queue_snapshot', 'x_jobs_producer', '{}'),
    ('queue_snapshot', 'x_jobs_worker', '{}'),
    ('queue_snapshot', 'x_jobs_admin', '{}'),
    ('queue_snapshot', 'pg_monitor', '{}'),
    ('queue_snapshot', 'public', '{}'),
    ('counter', 'x_jobs_producer', '{}'),
    ('counter', 'x_jobs_worker', '{}'),
    ('counter', 'x_jobs_admin', '{DELETE,INSERT,SELECT,UPDATE}'),
    ('counter', 'pg_monitor', '{}'),
    ('counter', 'public', '{}'),
    -- A producer publishes through the SECURITY DEFINER publish: no right on steps or events.
    ('step', 'x_jobs_producer', '{}'),
    ('step', 'x_jobs_worker', '{}'),
    ('step', 'x_jobs_admin', '{DELETE,SELECT,UPDATE}'),
    ('step', 'pg_monitor', '{}'),
    ('step', 'public', '{}'),
    ('event', 'x_jobs_producer', '{}'),
    ('event', 'x_jobs_worker', '{}'),
    ('event', 'x_jobs_admin', '{DELETE,SELECT}'),
    ('event', 'pg_monitor', '{}'),
    ('event', 'public', '{}'),
    ('outbox', 'x_jobs_producer', '{}'),
    ('outbox', 'x_jobs_worker', '{SELECT}'),
    ('outbox', 'x_jobs_admin', '{DELETE,SELECT,UPDATE}'),
    ('outbox', 'pg_monitor', '{}'),
    ('outbox', 'public', '{}'),
    ('webhook_ledger', 'x_jobs_producer', '{}'),
    ('webhook_ledger', 'x_jobs_worker', '{}'),
    ('webhook_ledger', 'x_jobs_admin', '{DELETE,SELECT}'),
    ('webhook_ledger', 'x_jobs_webhook', '{}'),
    ('job', 'x_jobs_webhook', '{}'),
    ('webhook_ledger', 'pg_monitor', '{}'),
    ('webhook_ledger', 'public', '{}'),
    ('job_type', 'x_jobs_producer', '{}'),
    ('job_type', 'x_jobs_worker', '{}'),
    ('job_type', 'x_jobs_admin', '{DELETE,SELECT}'),
    ('job_type', 'pg_monitor', '{}'),
    ('job_type', 'public', '{}'),
    ('schedule', 'x_jobs_producer', '{}'),
    ('schedule', 'x_jobs_worker', '{}'),
    ('schedule', 'x_jobs_admin', '{DELETE,SELECT,UPDATE}'),
    ('schedule', 'pg_monitor', '{}'),
    ('schedule', 'public', '{}'),
    ('tenant_binding', 'x_jobs_producer', '{}'),
    ('tenant_binding', 'x_jobs_worker', '{}'),
    ('tenant_binding', 'x_jobs_admin', '{}'),
    ('tenant_binding', 'pg_monitor', '{}'),
    ('tenant_binding', 'public', '{}'),
    ('notify_secret', 'x_jobs_producer', '{}'),
    ('notify_secret', 'x_jobs_worker', '{}'),
    ('notify_secret', 'x_jobs_admin', '{}'),
    ('notify_secret', 'x_jobs_webhook', '{}'),
    ('notify_secret', 'pg_monitor', '{}'),
    ('notify_secret', 'public', '{}'),
    ('stream_entry', 'x_jobs_producer', '{}'),
    ('stream_entry', 'x_jobs_worker', '{}'),
    ('stream_entry', 'x_jobs_admin', '{}'),
    ('stream_entry', 'pg_monitor', '{}'),
    ('stream_entry', 'public', '{}'),
    ('consumer_cursor', 'x_jobs_producer', '{}'),
    ('consumer_cursor', 'x_jobs_worker', '{}'),
    ('consumer_cursor', 'x_jobs_admin', '{}'),
    ('consumer_cursor', 'pg_monitor', '{}'),
    ('consumer_cursor', 'public', '{}'),
    ('queue_policy', 'x_jobs_producer', '{}'),
    ('queue_policy', 'x_jobs_worker', '{}'),
    ('queue_policy', 'x_jobs_admin', '{}'),
    ('queue_policy', 'pg_monitor', '{}'),
    ('queue_policy', 'public', '{}'),
    ('queue_weight', 'x_jobs_producer', '{}'),
    ('queue_weight', 'x_jobs_worker', '{}'),
    ('queue_weight', 'x_jobs_admin', '{}'),
    ('queue_weight', 'pg_monitor', '{}'),
    ('queue_weight', 'public', '{}'),
    ('rate_limit', 'x_jobs_producer', '{}'),
    ('rate_limit', 'x_jobs_worker', '{}'),
    ('rate_limit', 'x_jobs_admin', '{}'),
    ('rate_limit', 'pg_monitor', '{}'),
    ('rate_limit', 'public', '{}'),
    ('job_rate', 'x_jobs_producer', '{}'),
    ('job_rate', 'x_jobs_worker', '{}'),
    ('job_rate', 'x_jobs_admin', '{DELETE,SELECT}'),
    ('job_rate', 'pg_monitor', '{}'),
    ('job_rate', 'public', '{}')
) AS t (tbl, grantee, privs)
INNER JOIN grant_role AS r ON t.grantee = r.grantee
ORDER BY t.tbl, r.grantee;

-- Who may draw ids from each sequence: nobody but the owner. enqueue, outbox_put and publish
-- draw them as their owner (0.3.6; a producer held USAGE on job_id_seq and outbox_id_seq).
SELECT
    sequence_privs_are(
        'x_jobs', q.seq, r.grantee, '{}'::name[],
        pg_catalog.format('Role %s should not be able to draw ids from x_jobs.%s', r.grantee, q.seq)
    )
FROM (VALUES ('job_id_seq'), ('outbox_id_seq'), ('event_id_seq')) AS q (seq)
CROSS JOIN grant_role AS r
ORDER BY q.seq, r.grantee;

-- Column grants: none. A publish resolves waits and wakes runs as the owner of publish, so a
-- producer needs no UPDATE of any column of a step or a job (0.1.0's column grants are gone).
SELECT is_empty(
    $$
    SELECT c.relname, a.attname, acl.grantee, acl.privilege_type
    FROM pg_catalog.pg_attribute AS a
    INNER JOIN pg_catalog.pg_class AS c ON a.attrelid = c.oid
    CROSS JOIN LATERAL pg_catalog.aclexplode(a.attacl) AS acl
    WHERE c.relnamespace = 'x_jobs'::regnamespace AND acl.grantee <> c.relowner
    $$,
    'No column privilege should be granted on an x_jobs table'
);

-- Effective column rights of a producer on the columns enqueue and publish write: none.
SELECT
    column_privs_are(
        'x_jobs', c.tbl, c.col, 'x_jobs_producer', c.privs::name[],
        pg_catalog.format(
            'A producer should have %s on x_jobs.%s.%s',
            coalesce(nullif(pg_catalog.array_to_string(c.privs::text[], ', '), ''), 'no privilege'), c.tbl, c.col
        )
    )
FROM (
    VALUES
    ('job', 'state', '{}'),
    ('job', 'run_at', '{}'),
    ('job', 'updated_at', '{}'),
    ('job', 'input', '{}'),
    ('step', 'status', '{}'),
    ('step', 'output', '{}'),
    ('step', 'resolved_by', '{}'),
    ('event', 'payload', '{}')
) AS c (tbl, col, privs)
ORDER BY c.tbl, c.col;

-- The grants suffice: each role can do its job through the functions --------------------------

SET LOCAL ROLE x_jobs_producer;
SELECT lives_ok(
    $$ SELECT x_jobs.enqueue('schema_grants', queue => 'schema_grants') $$,
    'A producer should be able to enqueue'
);
SELECT throws_ok(
    $$ SELECT x_jobs.claim(ARRAY['schema_grants'], 'w') $$,
    '42501', 'permission denied for function claim',
    'A producer should not be able to claim'
);
RESET ROLE;

SET LOCAL ROLE x_jobs_worker;
SELECT results_eq(
    $$
    SELECT x_jobs.complete(c.id, 'schema-worker')
    FROM x_jobs.claim(ARRAY['schema_grants'], 'schema-worker') AS c
    $$,
    ARRAY[TRUE],
    'A worker should be able to claim a job and complete it'
);
RESET ROLE;

SET LOCAL ROLE x_jobs_admin;
SELECT results_eq(
    $$
    SELECT x_jobs.pause_queue('schema_grants')
    UNION ALL
    SELECT x_jobs.cancel((x_jobs.enqueue('schema_grants_cancel', queue => 'schema_grants')).id)
    $$,
    ARRAY[TRUE, TRUE],
    'An admin should be able to pause a queue and cancel a job'
);
RESET ROLE;

SET LOCAL ROLE pg_monitor;
SELECT lives_ok(
    $$ SELECT * FROM x_jobs.queue_demand() $$,
    'pg_monitor should be able to read queue demand'
);
SELECT throws_ok(
    $$ SELECT * FROM x_jobs.job $$,
    '42501', 'permission denied for table job',
    'pg_monitor should not be able to read job rows (inputs) directly'
);
RESET ROLE;

SELECT * FROM finish();
ROLLBACK;
