------------------------------------------------------------------------------------------------
-- Functions: helpers
------------------------------------------------------------------------------------------------

-- The test clock: x_jobs.fake_now, for a session whose login role is a superuser, and for no
-- other. Any role can set a custom setting, and a clock moved forward makes every other worker's
-- lease look lapsed to the mover's claims, which would take those jobs while they run. By
-- session_user: SET ROLE and SECURITY DEFINER functions change current_user, not the login.
CREATE FUNCTION x_jobs._fake_now()
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_setting text := pg_catalog.current_setting('x_jobs.fake_now', true);
BEGIN
    IF NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user), FALSE) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ038',
            MESSAGE = pg_catalog.format('X_CLOCK_REFUSED: x_jobs.fake_now is set to %L, and role %I may not move the clock',
                v_setting, session_user),
            HINT = 'x_jobs.fake_now is a test clock for superuser sessions: RESET x_jobs.fake_now (or ALTER ROLE ... RESET).';
    END IF;
    RETURN v_setting::timestamptz;
END
$$;

-- The clock: now(), the transaction's start, unless a test moved it (x_jobs._fake_now). One
-- expression, and no SET search_path, so that the planner inlines it: the check costs nothing
-- while the setting is unset.
CREATE FUNCTION x_jobs.now()
RETURNS timestamptz
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.now()
        ELSE x_jobs._fake_now()
    END
$$;

-- The catalogue of refusals: every SQLSTATE an x_jobs function raises, its X_ code, what it
-- means. The README's table is checked against it by the tests.
CREATE FUNCTION x_jobs.error_codes()
RETURNS TABLE (sqlstate text, code text, meaning text)
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    VALUES
        ('XJ001', 'X_NAME_INVALID', 'A job name is missing, empty or longer than 200 characters.'),
        ('XJ002', 'X_QUEUE_INVALID', 'A queue name is empty or longer than 200 characters.'),
        ('XJ003', 'X_PAYLOAD_TOO_LARGE', 'An input, output or event payload, or an outbox message''s payload and headers together, is larger than x_jobs.max_payload_bytes.'),
        ('XJ004', 'X_MAX_ATTEMPTS_INVALID', 'max_attempts is below 1.'),
        ('XJ005', 'X_PRIORITY_INVALID', 'priority is outside -32768..32767.'),
        ('XJ006', 'X_TENANT_INVALID', 'tenant_id is empty or longer than 200 characters.'),
        ('XJ007', 'X_CONCURRENCY_INVALID', 'A concurrency limit is below 1 or given without a key, or the key is empty or longer than 400 characters.'),
        ('XJ008', 'X_BACKOFF_INVALID', 'backoff_base or backoff_max is negative, or base exceeds max.'),
        ('XJ009', 'X_JOBS_INVALID', 'enqueue_many got something other than an array of request objects, or a field of the wrong JSON type (receive_webhook: a request that is not an object); an idempotency_key is empty or longer than 400 characters, a traceparent longer than 512 or enqueued_by than 200.'),
        ('XJ010', 'X_QUEUES_INVALID', 'The queue list is missing, empty or holds an empty name.'),
        ('XJ011', 'X_WORKER_INVALID', 'A worker id is missing, empty or longer than 400 characters.'),
        ('XJ012', 'X_LEASE_INVALID', 'A lease is missing, not positive, or longer than 1000 years.'),
        ('XJ013', 'X_QTY_INVALID', 'qty, a page size or cron_next''s count is outside 1..1000 (outbox_redrive and tick_schedules max_rows: 1..100000; cancel_jobs and retry_jobs max_rows: 1 or more).'),
        ('XJ014', 'X_JOB_NOT_FOUND', 'No job has this id.'),
        ('XJ015', 'X_JOB_NOT_RETRYABLE', 'retry was asked of a row that is live or done.'),
        ('XJ016', 'X_STATE_UNKNOWN', 'A state name is not one of the job states (list_outbox: of the outbox states).'),
        ('XJ017', 'X_IDEMPOTENCY_CONFLICT', 'A live row already holds the idempotency key.'),
        ('XJ018', 'X_DELAY_INVALID', 'A retry delay is negative, or a hand-back delay is negative or longer than 1000 years.'),
        ('XJ019', 'X_TTL_INVALID', 'A worker announce ttl is missing, not positive, or longer than 1000 years.'),
        ('XJ020', 'X_RETENTION_INVALID', 'A purge or rollup_counters got a missing or negative age, an age over 1000 years, or a batch below 1.'),
        ('XJ021', 'X_OUTPUTS_INVALID', 'complete_many got a different number of outputs than ids.'),
        ('XJ022', 'X_ISOLATION_UNSUPPORTED', 'claim, publish, step_wait, relay_outbox, receive_webhook or tick_schedules ran in a REPEATABLE READ or SERIALIZABLE transaction.'),
        ('XJ023', 'X_ERROR_MISSING', 'fail or outbox_nack was called without an error message.'),
        ('XJ024', 'X_STEP_INVALID', 'A step name is missing, empty or longer than 200 characters.'),
        ('XJ025', 'X_TIMEOUT_INVALID', 'A sleep is missing or negative, or a wait timeout is negative; either ends past the year 9999.'),
        ('XJ026', 'X_JOB_NOT_HELD', 'A step function was called by a worker that does not hold the job.'),
        ('XJ027', 'X_STEP_CONFLICT', 'A step name is already used by a step of another kind in the run.'),
        ('XJ028', 'X_EVENT_INVALID', 'An event name is missing, empty or longer than 200 characters, or its key is longer than 400.'),
        ('XJ029', 'X_MATCH_INVALID', 'A wait''s match is not a JSON object.'),
        ('XJ030', 'X_JOB_HELD', 'resolve_step was asked of a job that a worker holds (running).'),
        ('XJ031', 'X_STEP_NOT_FOUND', 'The job has no step of this name.'),
        ('XJ032', 'X_STEP_NOT_WAITING', 'resolve_step was asked of a step that is not waiting.'),
        ('XJ033', 'X_PROGRESS_INVALID', 'Progress is negative, past its total, or its note is too long.'),
        ('XJ034', 'X_TOPIC_INVALID', 'An outbox topic is missing, empty or longer than 200 characters.'),
        ('XJ035', 'X_MESSAGE_INVALID', 'An outbox message has no payload, headers that are not an object of strings, a key longer than 400 characters, an unknown field or one of the wrong type, or is not an object.'),
        ('XJ036', 'X_RELAY_INVALID', 'A relay id is missing or empty.'),
        ('XJ037', 'X_WEBHOOK_INVALID', 'receive_webhook got no source or no webhook id, or one longer than 200 characters.'),
        ('XJ038', 'X_CLOCK_REFUSED', 'x_jobs.fake_now (the test clock) is set in a session whose login role is not a superuser.'),
        ('XJ039', 'X_TIME_INVALID', 'A run_at (enqueue) or retry_at (outbox_nack) is infinite or outside the years 1 to 9999 (UTC).'),
        ('XJ040', 'X_SETTING_INVALID', 'x_jobs.max_payload_bytes is set to something other than a whole number of bytes from 1 to 2147483647.'),
        ('XJ041', 'X_ROLE_UNSAFE', 'An install or update found an x_jobs role that can log in, has an attribute, or is a member of a role outside x_jobs''s (x_jobs_owner: has a member).'),
        ('XJ042', 'X_ROLES_MISSING', 'x-jobs install by a role that may not create or link the missing x_jobs roles; the hint lists what an administrator runs first.'),
        ('XJ043', 'X_CRON_INVALID', 'A cron expression is not five fields or a known macro, or a field has a term that is not a value, range or step, a value out of its range, a range that runs backwards, a step out of range, or a day no month of it has.'),
        ('XJ044', 'X_STATE_NOT_ALLOWED', 'cancel_jobs was asked for a state that is not live, or retry_jobs for one that is not dead, failed or cancelled.'),
        ('XJ045', 'X_RANGE_EMPTY', 'cancel_jobs or retry_jobs got a created_after at or after its created_before.'),
        ('XJ046', 'X_TIME_ZONE_INVALID', 'A time zone is not the name of a zone of the IANA database (a POSIX zone string included).'),
        ('XJ049', 'X_SCHEDULE_INVALID', 'set_schedule got a schedule name that is missing, empty or longer than 200 characters, an input that is not an object or holds _schedule, a catchup, catchup_max, overlap or grace out of range, or an origin or declared_by longer than 200 characters.'),
        ('XJ050', 'X_SCHEDULE_NOT_FOUND', 'No schedule has this name.'),
        ('XJ051', 'X_MAX_AGE_INVALID', 'A queue_gauges max_age is missing, negative, or longer than a day.'),
        ('XJ052', 'X_WORKER_NOT_YOURS', 'claim or announce_worker got a worker id bound to another login (the fence: an id belongs to the login that first claimed or announced with it).'),
        ('XJ053', 'X_ATTEMPTS_INVALID', 'A settle, heartbeat, release or hand-back got an attempts list whose length is not that of its ids.'),
        ('XJ047', 'X_DECLARATIONS_INVALID', 'declare_jobs got something other than an array of declaration objects, an unknown field or one of the wrong type, or a job declared twice in one call.'),
        ('XJ048', 'X_JOB_TIMEOUT_INVALID', 'A declared job timeout is not above zero, or longer than 1000 years.'),
        ('XJ058', 'X_ROLE_UNKNOWN', 'bind_tenant or unbind_tenant named a role that does not exist.'),
        ('XJ059', 'X_TENANT_NOT_BOUND', 'A call by a role whose bindings and its login''s share no tenant wrote a tenant row.'),
        ('XJ060', 'X_TENANT_OUT_OF_SCOPE', 'A bound role named a tenant it is not bound to (tenant_id, or the x_jobs.tenant setting).'),
        ('XJ061', 'X_TENANT_AMBIGUOUS', 'A role bound to several tenants wrote a row naming none, with x_jobs.tenant unset.'),
        ('XJ062', 'X_CROSS_TENANT', 'A bound role filtered by a tenant outside its scope, or paused or resumed a queue (every tenant''s jobs).'),
        ('XJ063', 'X_RATE_LIMIT_INVALID', 'A rate limit key is missing, empty or longer than 400 characters, max_starts is below 1, or per is not a positive interval up to 366 days.'),
        ('XJ064', 'X_RATE_LIMIT_UNKNOWN', 'No rate limit has this key (an enqueue named a key no set_rate_limit declared, or drop_rate_limit a key without a limit).'),
        ('XJ065', 'X_RATE_LIMIT_CONFLICT', 'A job named both a rate_limit_key and a concurrency_key.'),
        ('XJ067', 'X_STREAM_INVALID', 'A stream name is missing, empty or longer than 200 characters, an entry''s key longer than 400, an entry has no payload, or stream_append_many got something other than an array of objects of a payload and a key.'),
        ('XJ068', 'X_POSITION_INVALID', 'stream_read got an after that is not a position it answered (xid/id).'),
        ('XJ069', 'X_CURSOR_INVALID', 'save_cursor got a consumer that is missing, empty or longer than 200 characters, a key missing or longer than 400, or no cursor.'),
        ('XJ066', 'X_QUEUE_POLICY_INVALID', 'set_queue_policy got weights that are not an object of tenant ids (1 to 200 characters) to whole numbers from 1 to 1000.'),
        ('40001', 'X_ENQUEUE_RACE', 'An idempotency key kept changing hands during enqueue; retry the call.')
$$;

-- The version of the SQL API installed here. Clients check it before they speak to the database
-- (the Python worker refuses one it cannot speak to); it answers the same whether the schema came
-- from CREATE EXTENSION or from `x-jobs install` on a server that allows no extension files.
-- Each version's script (and upgrade script) replaces this function with its own number.
CREATE FUNCTION x_jobs.version()
RETURNS text
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT '0.4.2'::text
$$;

-- The bucket a settling statement adds to: its minute, in UTC whatever the session's TimeZone.
CREATE FUNCTION x_jobs._minute(p_at timestamptz)
RETURNS timestamptz
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT pg_catalog.date_trunc('minute', p_at, 'UTC')
$$;

-- Which counter shard this session adds to. One backend keeps to one shard, so two settlers
-- rarely share a row lock; readers sum over all shards.
CREATE FUNCTION x_jobs._shard()
RETURNS smallint
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT (pg_catalog.pg_backend_pid() % 16)::smallint
$$;

-- x_jobs.max_payload_bytes as set. Any role can SET a custom setting, and producers enqueue
-- through functions that run as their owner, so a session's own value counts only up to 1 MiB;
-- above it, only up to what ALTER DATABASE or ALTER ROLE set (the most specific, as PostgreSQL
-- applies them; only a superuser, or a role granted SET on it, may set those). The catalog is
-- read only for a value above 1 MiB.
--
-- A custom setting is any text, so a value is taken only as digits within 1..2147483647 and
-- refused otherwise: cast as it was, 'abc' or '4MB' failed every enqueue, put and complete with
-- a bare cast error, and '-5' was taken as a limit. Its own code, not X_PAYLOAD_TOO_LARGE: the
-- deployment's setting is wrong, not the caller's payload, and a client that refuses a payload
-- for good (a relay's job, a webhook answered 413) must retry this one once it is fixed.
CREATE FUNCTION x_jobs._max_payload_setting()
RETURNS integer
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_value text := pg_catalog.current_setting('x_jobs.max_payload_bytes', true);
    v_scope text; -- where v_value was read: NULL, the session; else the ALTER that set it
    v_bytes integer;
    v_session integer;
BEGIN
    -- The session's value, then (above 1 MiB) the catalog's: each parsed and checked alike.
    LOOP
        v_bytes := CASE
            WHEN coalesce(v_value, '') = '' THEN 1048576
            -- Matched before the cast, so the cast cannot fail.
            WHEN v_value ~ '^\s*[0-9]{1,10}\s*$' THEN
                CASE WHEN v_value::bigint BETWEEN 1 AND 2147483647 THEN v_value::integer END
        END;
        IF v_bytes IS NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ040',
                MESSAGE = pg_catalog.format(
                    'X_SETTING_INVALID: x_jobs.max_payload_bytes %s is not a whole number of bytes '
                    'from 1 to 2147483647',
                    CASE
                        WHEN pg_catalog.length(v_value) > 64 THEN pg_catalog.format('%L... (%s characters)',
                            pg_catalog.left(v_value, 64), pg_catalog.length(v_value))
                        ELSE pg_catalog.quote_literal(v_value)
                    END),
                DETAIL = CASE
                    WHEN v_scope IS NULL
                        THEN 'As this session reads it (SET, ALTER ROLE, ALTER DATABASE or postgresql.conf).'
                    ELSE pg_catalog.format('Set by %s, which holds a session''s value above 1 MiB to it.', v_scope)
                END,
                HINT = 'Set it to a number of bytes without a unit, such as 4194304 for 4 MiB, or RESET it '
                    'for the default of 1 MiB (1048576).';
        END IF;
        EXIT WHEN v_session IS NOT NULL OR v_bytes <= 1048576;
        v_session := v_bytes;
        -- No row sets both to NULL: the catalog's cap is then the default.
        SELECT pg_catalog.substr(o.setting, pg_catalog.strpos(o.setting, '=') + 1),
               CASE WHEN d.setrole = 0 THEN 'ALTER DATABASE' ELSE 'ALTER ROLE' END
        INTO v_value, v_scope
        FROM pg_catalog.pg_db_role_setting AS d
        CROSS JOIN LATERAL pg_catalog.unnest(d.setconfig) AS o (setting)
        WHERE d.setdatabase IN (0, (SELECT b.oid FROM pg_catalog.pg_database AS b
                                    WHERE b.datname = pg_catalog.current_database()))
            AND d.setrole IN (0, (SELECT r.oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = session_user))
            AND pg_catalog.split_part(o.setting, '=', 1) = 'x_jobs.max_payload_bytes'
        ORDER BY d.setrole <> 0 DESC, d.setdatabase <> 0 DESC
        LIMIT 1;
    END LOOP;
    RETURN least(coalesce(v_session, v_bytes), v_bytes);
END
$$;

-- The size limit for inputs and outputs, default 1 MiB, set per database or role:
-- ALTER DATABASE app SET x_jobs.max_payload_bytes = 4194304. One expression, and no SET
-- search_path, so that the planner inlines it: unset, the limit costs nothing (as x_jobs.now()).
-- A value set is read by _max_payload_setting, whose plans are kept: a SQL function with a
-- catalog subquery would be planned afresh on every call, tens to hundreds of times the cost.
CREATE FUNCTION x_jobs._max_payload_bytes()
RETURNS integer
LANGUAGE sql
STABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.max_payload_bytes', true), '') = '' THEN 1048576
        ELSE x_jobs._max_payload_setting()
    END
$$;

-- A payload's size as the limit counts it: uncompressed. pg_column_size counts a value as it is
-- stored, and one read from a table can arrive compressed: 80 MB of one repeated letter passed
-- publish as 0.9 MB. A composite value holds its fields uncompressed, so a compressed payload is
-- measured inside a one-field row (less the row's 24-byte header).
CREATE FUNCTION x_jobs._payload_bytes(p_payload jsonb)
RETURNS integer
LANGUAGE sql
IMMUTABLE
PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN pg_catalog.pg_column_compression(p_payload) IS NULL THEN pg_catalog.pg_column_size(p_payload)
        ELSE pg_catalog.pg_column_size(ROW(p_payload)) - 24
    END
$$;

-- When the server last began to take connections: the end of its crash recovery (or of its
-- start, or of a standby's promotion), which can come long after pg_postmaster_start_time()
-- (a recovery of 700 MB of WAL took 2 s, and a busy server's minutes). The processes that start
-- then (the WAL writer, the autovacuum launcher) say when, to a role with pg_read_all_stats: it
-- runs as claim's owner, x_jobs_owner, which is granted it. A role without it (the owner under
-- `x-jobs install` by a database owner) sees no such process, and the postmaster's start stands
-- in: x_jobs.health() says so, and workers log it when they start. It reads
-- every backend's status, 0.2 ms a call: only claim's restart grace asks, and only for a lapsed
-- lease last renewed before the server started.
CREATE FUNCTION x_jobs._ready_since()
RETURNS timestamptz
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT GREATEST(pg_catalog.pg_postmaster_start_time(), max(a.backend_start))
    FROM pg_catalog.pg_stat_activity AS a
    WHERE a.backend_type IN ('walwriter', 'autovacuum launcher')
$$;

-- Run ids for `p_count` new jobs, as UUIDv7 (RFC 9562): 48 bits of Unix time in milliseconds,
-- then random bits that count up from a random start through the batch (the RFC's "monotonic
-- random" method), so ids sort by creation and a batch draws randomness once. One
-- gen_random_uuid per row cost a batch of 1,000 about 3 ms, an eighth of its enqueue_many.
CREATE FUNCTION x_jobs._run_ids(p_count integer)
RETURNS uuid[]
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    -- 32 hex digits; the 13th (version) and 17th (variant) are fixed, the others random.
    v_random text := pg_catalog.replace(pg_catalog.gen_random_uuid()::text, '-', '');
    v_prefix text := pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.floor(
        pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::bigint), 12, '0')
        || '7' || pg_catalog.substr(v_random, 1, 3);
    -- The low 64 bits: variant 10, then 62 bits starting below 2^60 (15 random hex digits), so
    -- counting through any batch cannot carry into the variant. As a signed bigint the variant
    -- bit is the sign: to_hex prints the two's complement, 16 digits from 8 to b.
    v_start bigint := -9223372036854775808
        + ('x' || pg_catalog.substr(v_random, 18, 15))::bit(60)::bigint;
BEGIN
    RETURN ARRAY(
        SELECT (v_prefix || pg_catalog.to_hex(v_start + g.i))::uuid
        FROM pg_catalog.generate_series(1, p_count) AS g (i)
    );
END
$$;

-- What notifications carry is a tag, not a name: LISTEN cannot be restricted in PostgreSQL, so
-- any login that may connect hears every payload on 'x_jobs' and 'x_jobs_outbox'. A tag is the
-- first 16 hex digits of sha256(secret, channel, name); the secret is this one row, made at
-- install (and by the update to 0.4.2), readable by the owner alone (no grant, not registered
-- with pg_extension_config_dump, so a dump carries no secret: a restore makes a new one). A
-- listener that may name what it waits for asks notify_tags for their tags once and matches
-- payloads against them; any other login learns that something of some tag was notified, when
-- and how often, and not what.
CREATE TABLE x_jobs.notify_secret (
    one boolean NOT NULL DEFAULT TRUE,
    secret text NOT NULL,
    CONSTRAINT notify_secret_pkey PRIMARY KEY (one),
    CONSTRAINT notify_secret_one_row CHECK (one)
);

INSERT INTO x_jobs.notify_secret (secret)
VALUES (pg_catalog.gen_random_uuid()::text || pg_catalog.gen_random_uuid()::text);

-- The tag of `p_name` on `p_channel`: every pg_notify of x_jobs sends this and nothing else (see
-- notify_secret). SECURITY DEFINER: the secret is the owner's alone; the admins' functions,
-- which run as their caller, notify too (granted to x_jobs_admin, see Grants).
CREATE FUNCTION x_jobs._notify_tag(p_channel text, p_name text)
RETURNS text
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(
        s.secret || E'\n' || p_channel || E'\n' || p_name, 'UTF8'
    )), 'hex'), 16)
    FROM x_jobs.notify_secret AS s
$$;

-- The tags of `names` on `channel`, in their order ('x_jobs': queues, 'x_jobs_outbox': topics):
-- what a worker's or a relay's listener matches payloads against, asked once per connection.
-- SECURITY DEFINER: the tags are made of the secret, which no role may read; a role granted this
-- learns the tag of a name it names, and never the secret.
CREATE FUNCTION x_jobs.notify_tags(channel text, names text[])
RETURNS text[]
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ARRAY(
        SELECT x_jobs._notify_tag(notify_tags.channel, n.name)
        FROM unnest(notify_tags.names) WITH ORDINALITY AS n (name, i)
        ORDER BY n.i
    )
$$;

-- Every NOTIFY of a producer's call (enqueue, publish, outbox puts) goes through here, so that
-- a producer that wants throughput more than a wake-up can turn them off: SET x_jobs.notify =
-- off (per session, role or database). PostgreSQL serializes the commits of transactions that
-- notified, which costs concurrent producers about a third of their commits (docs/benchmarks.md);
-- workers and relays poll as well, so without notifications work waits at most a poll interval.
-- `p_payload` is the queue or topic: what goes out is its tag (_notify_tag).
CREATE FUNCTION x_jobs._notify(p_channel text, p_payload text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF coalesce(pg_catalog.current_setting('x_jobs.notify', true), '') <> 'off' THEN
        PERFORM pg_catalog.pg_notify(p_channel, x_jobs._notify_tag(p_channel, p_payload));
    END IF;
END
$$;

-- Who calls: the role the session acts as after SET ROLE (the `role` setting, which entering a
-- SECURITY DEFINER function leaves as it was), else the login (session_user). Inside such a
-- function current_user is the owner and says nothing of the caller. What claims are fenced by
-- and tenants are bound to: a role is the trust domain. No SET clause, so that it inlines into
-- the claim's and settles' per-call checks (a SET makes every call a function call, ~10 us);
-- its body names nothing through search_path.
CREATE FUNCTION x_jobs._caller()
RETURNS name
LANGUAGE sql
STABLE
AS $$
    SELECT CASE pg_catalog.current_setting('role')
        WHEN 'none' THEN session_user
        ELSE pg_catalog.current_setting('role')::name
    END
$$;

-- The refusal of a missing, empty or over-long worker id, shared by every function a worker
-- calls. `p_hint` is the fix for the caller at hand: a new id to claim with, or the id it
-- claimed with. The id is the primary key of x_jobs.worker: past a btree entry's size (about
-- 2.7 kB) announce_worker failed with a bare 54000. 400 characters, as event keys, keep it
-- within that in any encoding, and every function refuses the id announce would refuse.
CREATE FUNCTION x_jobs._require_worker(p_worker text, p_hint text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_worker IS NULL OR p_worker = '' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ011',
            MESSAGE = pg_catalog.format('X_WORKER_INVALID: worker id %s is empty',
                coalesce(pg_catalog.quote_literal(p_worker), 'NULL')),
            HINT = p_hint;
    END IF;
    IF pg_catalog.length(p_worker) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ011',
            MESSAGE = pg_catalog.format('X_WORKER_INVALID: worker id %L... is %s characters, longer than 400',
                pg_catalog.left(p_worker, 64), pg_catalog.length(p_worker)),
            HINT = 'Use a worker id of 1 to 400 characters, such as host:pid:random.';
    END IF;
END
$$;

-- The fence: is worker id `p_worker` the caller's? True when it is bound to the login the call
-- acts for (x_jobs._caller(): SET ROLE's role, else the session's login), false when another
-- login's. An id bound to no login yet is bound to the caller here, first come (an id claimed
-- before the fence existed, or one whose binding was swept): no existing caller needs a new
-- argument, and after the first claim of an id nobody else can take it. One primary-key probe a
-- call, whatever the number of rows the call then acts on; a write only the first time, and
-- once a day after (bound_at renewed, so that announce_worker's sweep keeps a binding in use).
-- The callers (claim, the settles, heartbeats, releases, steps, progress, hand_back) answer a
-- false as "not held", each as it answers a row it does not hold; claim and announce_worker
-- refuse it (XJ052). Worker ids themselves stay what they were: labels shown to operators.
-- SECURITY DEFINER: it writes x_jobs.worker_login, which no x_jobs role may write, for the
-- functions a worker calls (some of which run as their caller).
CREATE FUNCTION x_jobs._fence(p_worker text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_caller name := x_jobs._caller();
    v_login name;
    v_bound_at timestamptz;
BEGIN
    SELECT l.login, l.bound_at INTO v_login, v_bound_at
    FROM x_jobs.worker_login AS l
    WHERE l.worker = p_worker;
    IF FOUND THEN
        IF v_login = v_caller AND v_bound_at < x_jobs.now() - interval '1 day' THEN
            UPDATE x_jobs.worker_login AS l SET bound_at = x_jobs.now() WHERE l.worker = p_worker;
        END IF;
    ELSE
        INSERT INTO x_jobs.worker_login AS l (worker, login, bound_at)
        VALUES (p_worker, v_caller, x_jobs.now())
        ON CONFLICT (worker) DO NOTHING;
        -- Another caller may have bound it between the probe and the insert: read who won.
        SELECT l.login INTO v_login FROM x_jobs.worker_login AS l WHERE l.worker = p_worker;
    END IF;
    RETURN v_login = v_caller;
END
$$;

-- The refusal of a worker id bound to another login, for the functions that have no "not held"
-- answer to give instead: claim and announce_worker.
CREATE FUNCTION x_jobs._require_fence(p_worker text)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT x_jobs._fence(p_worker) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ052',
            MESSAGE = pg_catalog.format('X_WORKER_NOT_YOURS: worker id %L belongs to another login',
                pg_catalog.left(p_worker, 400)),
            HINT = 'Give each worker process an id of its own, such as host:pid:random.';
    END IF;
END
$$;

-- The refusal of an attempts list that does not pair with its ids: one attempt per id, in the
-- same order (an element NULL: that id's attempt is not checked).
CREATE FUNCTION x_jobs._require_attempts(p_ids bigint[], p_attempts integer[])
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_attempts IS NOT NULL
        AND pg_catalog.cardinality(p_attempts) <> coalesce(pg_catalog.cardinality(p_ids), 0) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ053',
            MESSAGE = pg_catalog.format('X_ATTEMPTS_INVALID: %s attempts for %s ids',
                pg_catalog.cardinality(p_attempts), coalesce(pg_catalog.cardinality(p_ids), 0)),
            HINT = 'Pass one attempt per id, in the same order (the attempt each claim answered), or NULL.';
    END IF;
END
$$;

-- The attempts of a many-form call as a map from id (as text) to attempt, NULL when none were
-- passed: each row looks its attempt up by key (a binary search) rather than scan the array, so
-- a batch costs what it did. Ids with a NULL attempt are left out: not checked.
CREATE FUNCTION x_jobs._attempt_map(p_ids bigint[], p_attempts integer[])
RETURNS jsonb
LANGUAGE sql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT CASE WHEN p_attempts IS NOT NULL THEN
        coalesce((
            SELECT pg_catalog.jsonb_object_agg(a.id::text, a.attempt)
            FROM unnest(p_ids, p_attempts) AS a (id, attempt)
            WHERE a.id IS NOT NULL AND a.attempt IS NOT NULL
        ), '{}'::jsonb)
    END
$$;

-- The refusal of a lease that is missing, not positive, or over 1000 years (one of many
-- millennia ended past what timestamptz holds: "timestamp out of range"), shared by the claims
-- and heartbeats of jobs and outbox messages. `p_hint` is the fix for the caller at hand.
CREATE FUNCTION x_jobs._require_lease(p_lease interval, p_hint text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_lease IS NULL OR p_lease <= interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is not positive', coalesce(p_lease::text, 'NULL')),
            HINT = p_hint;
    END IF;
    IF p_lease > interval '1000 years' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ012',
            MESSAGE = pg_catalog.format('X_LEASE_INVALID: lease %s is longer than 1000 years', p_lease),
            HINT = p_hint;
    END IF;
END
$$;

-- The tenants a call acts for: NULL for all of them (an unbound role without x_jobs.tenant set:
-- as before tenants were bound), else the array of those it may touch, sorted. Every function
-- of the API that reads or writes tenant rows calls it once per call (the policies of
-- 86-tenants.sql once per statement, as an InitPlan), never per row.
--   * The bindings are those of the role the call acts for (x_jobs._caller(): SET ROLE's role,
--     else the login), by that role's name exactly: membership passes no binding on, so that
--     bind a login, or the role a pooler SET ROLEs to.
--   * When SET ROLE is in effect and the login is bound too, the scope is what both are bound
--     to (an unbound side does not widen it): a bound login cannot leave its tenants by SET ROLE
--     to x_jobs_worker or any other unbound role it is a member of. That can leave nothing.
--   * The transaction-local x_jobs.tenant (SET LOCAL x_jobs.tenant = 'acme') narrows the scope
--     to one tenant: for an unbound role, to that one; for a bound role, to that one if it is in
--     its scope, else XJ060. Unset or '' (what a custom setting reverts to after SET LOCAL ends)
--     narrows nothing.
-- SECURITY DEFINER: the bindings are the owner's table; a caller learns only its own scope.
-- STABLE: within a statement the role, the login and the setting do not change.
CREATE FUNCTION x_jobs._tenant_scope()
RETURNS text[]
LANGUAGE plpgsql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_role name := x_jobs._caller();
    v_named text := nullif(pg_catalog.current_setting('x_jobs.tenant', true), '');
    v_scope text[];
    v_login text[];
BEGIN
    SELECT pg_catalog.array_agg(b.tenant ORDER BY b.tenant) INTO v_scope
    FROM x_jobs.tenant_binding AS b
    WHERE b.role = v_role;
    IF v_role <> session_user THEN
        SELECT pg_catalog.array_agg(b.tenant ORDER BY b.tenant) INTO v_login
        FROM x_jobs.tenant_binding AS b
        WHERE b.role = session_user;
        IF v_login IS NOT NULL THEN
            v_scope := CASE
                WHEN v_scope IS NULL THEN v_login
                ELSE ARRAY(SELECT t FROM unnest(v_scope) AS t WHERE t = ANY (v_login) ORDER BY t)
            END;
        END IF;
    END IF;
    IF v_named IS NULL THEN
        RETURN v_scope;
    END IF;
    IF v_scope IS NOT NULL AND NOT v_named = ANY (v_scope) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ060',
            MESSAGE = pg_catalog.format('X_TENANT_OUT_OF_SCOPE: role %I does not act for tenant %L',
                v_role, pg_catalog.left(v_named, 200)),
            HINT = 'Set x_jobs.tenant to a tenant the role is bound to (x_jobs.tenant_bindings()), or leave it unset.';
    END IF;
    RETURN ARRAY[v_named];
END
$$;

-- The tenant a row written by a call is stamped with: what the request names (p_tenant, NULL
-- when it names none) checked against the call's scope (p_scope, from _tenant_scope). An
-- unscoped call keeps the request's tenant as it is. A scoped one: the tenant named, if it is
-- in scope (else XJ060), or the only tenant of the scope (several: XJ061; none: XJ059).
CREATE FUNCTION x_jobs._stamp_tenant(p_tenant text, p_scope text[])
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_scope IS NULL THEN
        RETURN p_tenant;
    ELSIF pg_catalog.cardinality(p_scope) = 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ059',
            MESSAGE = pg_catalog.format('X_TENANT_NOT_BOUND: role %I acts for no tenant', x_jobs._caller()),
            DETAIL = 'The role and the login it was reached from are bound to tenants they do not share.',
            HINT = 'Bind the role to the tenant (x_jobs.bind_tenant), or SET ROLE to a role bound to one of the login''s tenants.';
    ELSIF p_tenant IS NULL THEN
        IF pg_catalog.cardinality(p_scope) = 1 THEN
            RETURN p_scope[1];
        END IF;
        RAISE EXCEPTION USING
            ERRCODE = 'XJ061',
            MESSAGE = pg_catalog.format('X_TENANT_AMBIGUOUS: role %I acts for %s tenants and the request names none',
                x_jobs._caller(), pg_catalog.cardinality(p_scope)),
            HINT = 'Name the tenant (tenant_id), or SET LOCAL x_jobs.tenant to one of the role''s tenants.';
    ELSIF NOT p_tenant = ANY (p_scope) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ060',
            MESSAGE = pg_catalog.format('X_TENANT_OUT_OF_SCOPE: role %I does not act for tenant %L',
                x_jobs._caller(), pg_catalog.left(p_tenant, 200)),
            HINT = 'Name a tenant the role is bound to (x_jobs.tenant_bindings()), or leave tenant_id out.';
    END IF;
    RETURN p_tenant;
END
$$;

-- The refusal of a cross-tenant act: a filter naming a tenant outside the call's scope (the
-- listings and bulk acts), or a queue-wide act (pause, resume) by a scoped caller, which would
-- touch every tenant's jobs of the queue. p_what names the act for the message.
CREATE FUNCTION x_jobs._refuse_cross_tenant(p_what text, p_tenant text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'XJ062',
        MESSAGE = pg_catalog.format('X_CROSS_TENANT: role %I may not %s%s', x_jobs._caller(), p_what,
            coalesce(pg_catalog.format(' of tenant %L', pg_catalog.left(p_tenant, 200)), '')),
        HINT = 'Act within the role''s tenants, or ask an unbound role (an unbound admin acts for every tenant).';
END
$$;

-- Tests: tests/pgtap/70-error-codes.sql, tests/pgtap/10-enqueue.sql,
--        tests/pgtap/51-queue-stats.sql, tests/python/test_errors.py, tests/python/test_readme.py,
--        tests/python/test_notify.py, tests/python/test_restart_grace.py
