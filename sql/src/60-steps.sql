------------------------------------------------------------------------------------------------
-- Functions: steps and events
------------------------------------------------------------------------------------------------
--
-- A run records each step it reaches. `steps` answers what is recorded (the worker replays it),
-- `step_record` keeps a step's result, and `step_sleep` / `step_wait` suspend the run: its row
-- becomes `suspended`, held by no worker, due again when the sleep ends, the wait times out, or
-- (`publish`, `resolve_step`) the step is resolved. A suspension is not an attempt: the row's
-- attempt count goes back by one, so that a workflow waiting on ten events keeps its retries.
--
-- The wait and the publish, without a lost wake-up. A wait checks the published events, then
-- suspends; a publish records its event, then resolves the open waits. Run side by side, each
-- could miss the other: the wait's check sees no event, the publish sees no wait yet. So both
-- take a transaction-scoped lock on the event first (a publish a shared one on its name and on
-- its name and key; a wait an exclusive one on its name, or on its name and key when it names a
-- key: row locks of x_jobs.event_lock, which only x_jobs's functions can take), and read after
-- the lock: whichever comes second sees what the first committed.
-- Publishes of one event never wait for each other; a wait waits for the publishes of its event
-- that are in flight, and a publish for the waits being registered.
--
-- The rule a wait matches by: the first event of its name (and key, and containing `match`)
-- published at or after `since`, which is when the run first reached the step unless the caller
-- passes an earlier instant (the Python client's since="run" passes the job's created_at, for an
-- event that may come before the run reaches its wait). `published_at` is the clock at the
-- publish, taken under the lock, so "before" and "after" are the order the locks gave.

-- The clock for events and first-reached instants: the wall clock (not the transaction start:
-- see "The wait and the publish" above), or the test clock as x_jobs.now() allows it.
CREATE FUNCTION x_jobs._clock()
RETURNS timestamptz
LANGUAGE sql
VOLATILE
AS $$
    SELECT CASE
        WHEN coalesce(pg_catalog.current_setting('x_jobs.fake_now', true), '') = '' THEN pg_catalog.clock_timestamp()
        ELSE x_jobs._fake_now()
    END
$$;

-- The refusals shared by the step functions: the worker must hold the job (it is running and
-- claimed by `p_worker`, `p_worker` is the caller's as x_jobs._fence has it, and the job is at
-- attempt `p_attempt` when one is passed), and the step needs a name. Locks the job row, so that a cancel or a
-- lapse-and-reclaim cannot slip in between the check and the write.
CREATE FUNCTION x_jobs._require_held(p_id bigint, p_worker text, p_step text, p_attempt integer)
RETURNS x_jobs.job
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_job x_jobs.job;
    v_scope text[] := x_jobs._tenant_scope();
BEGIN
    PERFORM x_jobs._require_worker(p_worker, 'Pass the id the worker claimed with.');
    IF p_step IS NOT NULL AND (p_step = '' OR pg_catalog.length(p_step) > 200) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ024',
            MESSAGE = pg_catalog.format('X_STEP_INVALID: step name %L is empty or longer than 200 characters',
                p_step),
            HINT = 'Name each step of a run with a short text unique within the run, such as ''charge''.';
    END IF;
    -- Another tenant's job is no job to a bound worker: the same refusal as a missing id.
    SELECT j.* INTO v_job
    FROM x_jobs.job AS j
    WHERE j.id = p_id
        AND (v_scope IS NULL OR j.tenant_id = ANY (v_scope))
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(p_id::text, 'NULL')),
            HINT = 'Pass the id of the job the worker claimed.';
    END IF;
    -- Another login's worker id, or a stale attempt, holds nothing: the same answer as a row
    -- the worker lost, so that it tells another login's caller nothing more.
    IF v_job.state <> 'running' OR v_job.claimed_by IS DISTINCT FROM p_worker
        OR v_job.attempt IS DISTINCT FROM coalesce(p_attempt, v_job.attempt)
        OR NOT x_jobs._fence(p_worker) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ026',
            MESSAGE = pg_catalog.format('X_JOB_NOT_HELD: job %s is %s and not held by worker %L',
                p_id, v_job.state, p_worker),
            -- A settled row keeps the worker that ran it in claimed_by; only a running row is held.
            DETAIL = CASE
                WHEN v_job.state = 'running' THEN pg_catalog.format('It is held by %s.',
                    coalesce(pg_catalog.quote_literal(v_job.claimed_by), 'no worker'))
                ELSE 'It is held by no worker.'
            END,
            HINT = 'The job was cancelled, or its lease lapsed and another worker took it: stop its body.';
    END IF;
    RETURN v_job;
END
$$;

-- The refusal of a bad event name, shared by publish and step_wait.
CREATE FUNCTION x_jobs._require_event(p_event text)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_event IS NULL OR p_event = '' OR pg_catalog.length(p_event) > 200 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event name %s is missing, empty or longer than 200 characters',
                coalesce(pg_catalog.quote_literal(p_event), 'NULL')),
            HINT = 'Name the event with a short text, such as ''order.paid''.';
    END IF;
END
$$;

-- The lock of the wait and the publish (see "The wait and the publish" above): the row of
-- `p_text`'s slot in x_jobs.event_lock, of kind 1 (an event name) or 2 (a name and a key),
-- FOR UPDATE for a wait, FOR SHARE for a publish. Held to the end of the transaction.
CREATE FUNCTION x_jobs._lock_event(p_kind smallint, p_text text, p_exclusive boolean)
RETURNS void
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF p_exclusive THEN
        PERFORM FROM x_jobs.event_lock AS l
        WHERE l.kind = p_kind AND l.slot = pg_catalog.hashtext(p_text) & 4095
        FOR UPDATE;
    ELSE
        PERFORM FROM x_jobs.event_lock AS l
        WHERE l.kind = p_kind AND l.slot = pg_catalog.hashtext(p_text) & 4095
        FOR SHARE;
    END IF;
END
$$;

-- Suspend a held run on a step: no worker holds it, and it is due at `p_until` (infinity: only
-- a publish or an operator wakes it). The attempt the claim counted is given back.
CREATE FUNCTION x_jobs._suspend(p_id bigint, p_until timestamptz)
RETURNS void
LANGUAGE sql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    UPDATE x_jobs.job AS j
    SET state = 'suspended',
        run_at = p_until,
        attempt = j.attempt - 1,
        visible_at = NULL,
        claimed_by = NULL,
        updated_at = x_jobs.now()
    WHERE j.id = p_id
$$;

-- The steps a run recorded, for the worker to replay: first the timers that ran out are
-- resolved (a sleep is done, a wait failed with a timeout), then every step is answered in the
-- order the run reached them. Refused unless `worker` holds the job.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.steps(id bigint, worker text, attempt integer DEFAULT NULL)
RETURNS SETOF x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
BEGIN
    PERFORM x_jobs._require_held(steps.id, steps.worker, NULL, steps.attempt);

    UPDATE x_jobs.step AS s
    SET status = CASE WHEN s.kind = 'sleep' THEN 'done' ELSE 'failed' END::x_jobs.step_status,
        error = CASE
            WHEN s.kind = 'wait' THEN pg_catalog.format(
                'X_STEP_TIMEOUT: no event %L%s came before %s', s.event,
                CASE WHEN s.event_key IS NULL THEN '' ELSE pg_catalog.format(' with key %L', s.event_key) END, s.timeout_at)
        END,
        resolved_by = 'timeout',
        resolved_at = v_now
    WHERE s.job_id = steps.id
        AND s.status = 'waiting'
        AND s.timeout_at <= v_now;

    RETURN QUERY
    SELECT s.* FROM x_jobs.step AS s
    WHERE s.job_id = steps.id
    ORDER BY s.created_at, s.compensation, s.name;
END
$$;

-- Record the result of a run step (or, compensation => true, of the compensation of a step):
-- its output, or the error it ended with (status failed). A done step is never changed: the
-- first result recorded is the one every replay answers. A failed one is replaced by the next
-- attempt's result. Answers the status recorded now.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_record(
    id bigint,
    worker text,
    step text,
    output jsonb DEFAULT NULL,
    error text DEFAULT NULL,
    compensation boolean DEFAULT FALSE,
    attempt integer DEFAULT NULL
)
RETURNS x_jobs.step_status
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_status x_jobs.step_status;
    v_kind text;
BEGIN
    v_job := x_jobs._require_held(
        step_record.id, step_record.worker, coalesce(step_record.step, ''), step_record.attempt
    );
    IF x_jobs._payload_bytes(step_record.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(step_record.output), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For step %L of job %s.', step_record.step, step_record.id),
            HINT = 'Store large results elsewhere and return a reference, or raise x_jobs.max_payload_bytes.';
    END IF;

    INSERT INTO x_jobs.step AS s (
        job_id, name, compensation, kind, created_at, status, attempt, output, error,
        resolved_by, resolved_at
    )
    VALUES (
        step_record.id, step_record.step, coalesce(step_record.compensation, FALSE), 'run',
        x_jobs._clock(),
        CASE WHEN step_record.error IS NULL THEN 'done' ELSE 'failed' END::x_jobs.step_status,
        v_job.attempt, step_record.output,
        -- Cut, not refused, as fail cuts a job's error (see there).
        CASE WHEN pg_catalog.length(step_record.error) > 65536
            THEN pg_catalog.format(E'%s\n[truncated: %s characters in all]',
                pg_catalog.left(step_record.error, 65536), pg_catalog.length(step_record.error))
            ELSE step_record.error
        END,
        'worker', v_now
    )
    ON CONFLICT (job_id, name, compensation) DO UPDATE
    SET status = excluded.status,
        attempt = excluded.attempt,
        output = excluded.output,
        error = excluded.error,
        resolved_at = excluded.resolved_at
    WHERE s.kind = 'run' AND s.status = 'failed'
    RETURNING s.status INTO v_status;

    IF v_status IS NOT NULL THEN
        RETURN v_status;
    END IF;
    SELECT s.status, s.kind INTO v_status, v_kind
    FROM x_jobs.step AS s
    WHERE s.job_id = step_record.id
        AND s.name = step_record.step
        AND s.compensation = coalesce(step_record.compensation, FALSE);
    IF v_kind <> 'run' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a run step',
                step_record.step, step_record.id, v_kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    RETURN v_status;
END
$$;

-- Sleep: suspend the run until `duration` after it first reached the step. A replay (after a
-- crash, or the claim that ends the sleep) finds the step and keeps its first wake-up time, so a
-- crash never restarts the sleep. Answers the step: status done when the time has come (go on),
-- waiting when the run is now suspended (the caller stops the body; its row is no longer held).
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_sleep(
    id bigint,
    worker text,
    step text,
    duration interval,
    attempt integer DEFAULT NULL
)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
BEGIN
    v_job := x_jobs._require_held(
        step_sleep.id, step_sleep.worker, coalesce(step_sleep.step, ''), step_sleep.attempt
    );
    IF step_sleep.duration IS NULL OR step_sleep.duration < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s is missing or negative',
                coalesce(step_sleep.duration::text, 'NULL')),
            HINT = 'Pass a duration of zero or more, such as ''1 day''.';
    END IF;
    -- The run is due when the sleep ends: that must be a time clients can read, as enqueue's
    -- run_at (to the day: an interval's months count as 30 days here). Many millennia more
    -- were past what timestamptz holds, a bare "timestamp out of range".
    IF extract(EPOCH FROM step_sleep.duration)
        >= extract(EPOCH FROM timestamptz '10000-01-01 00:00:00+00' - v_now) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: sleep of %s ends past the year 9999',
                step_sleep.duration),
            HINT = 'Pass a duration that ends before the year 10000, such as ''1 day''.';
    END IF;

    INSERT INTO x_jobs.step AS s (job_id, name, kind, created_at, timeout_at, status, attempt)
    VALUES (step_sleep.id, step_sleep.step, 'sleep', x_jobs._clock(), v_now + step_sleep.duration,
        'waiting', v_job.attempt)
    ON CONFLICT (job_id, name, compensation) DO NOTHING;

    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = step_sleep.id AND s.name = step_sleep.step AND NOT s.compensation
    FOR UPDATE;
    IF v_step.kind <> 'sleep' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a sleep',
                step_sleep.step, step_sleep.id, v_step.kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    IF v_step.status = 'waiting' AND v_step.timeout_at <= v_now THEN
        UPDATE x_jobs.step AS s
        SET status = 'done', resolved_by = 'timeout', resolved_at = v_now
        WHERE s.job_id = step_sleep.id AND s.name = step_sleep.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSIF v_step.status = 'waiting' THEN
        PERFORM x_jobs._suspend(step_sleep.id, v_step.timeout_at);
    END IF;
    RETURN v_step;
END
$$;

-- Wait for an event: answers the step done (output: the event's payload) when a matching event
-- was published since `since` (default: when the run first reached this step), failed when the
-- timeout has passed, or waiting when the run is now suspended until a publish resolves the
-- step or the timeout comes. A wait names a key to match only events published with that key,
-- and `match` (a JSON object) to match only payloads that contain it. A replay keeps the step's
-- first `since` and timeout.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.step_wait(
    id bigint,
    worker text,
    step text,
    event text,
    event_key text DEFAULT NULL,
    match jsonb DEFAULT NULL,
    timeout interval DEFAULT NULL,
    since timestamptz DEFAULT NULL,
    attempt integer DEFAULT NULL
)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
    v_reached timestamptz;
    v_event record;
BEGIN
    -- The event lookup below must see every publish that committed before the lock: a snapshot
    -- taken at the transaction's start would miss one that came while the lock was awaited, and
    -- that publish found no step to wake, so the run would sleep past its event.
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: step_wait cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Wait from a READ COMMITTED transaction (the default).';
    END IF;
    v_job := x_jobs._require_held(
        step_wait.id, step_wait.worker, coalesce(step_wait.step, ''), step_wait.attempt
    );
    PERFORM x_jobs._require_event(step_wait.event);
    -- The key is in the events' and the waits' indexes with the name: past a btree entry's size
    -- (about 2.7 kB) an insert failed with a bare 54000. 400 characters keep both within it.
    IF pg_catalog.length(step_wait.event_key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event key %s is longer than 400 characters',
                pg_catalog.quote_literal(pg_catalog.left(step_wait.event_key, 410))),
            HINT = 'Key events with a short text, such as an order id; put the rest in the payload.';
    END IF;
    IF step_wait.timeout < interval '0' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s is negative', step_wait.timeout),
            HINT = 'Pass a timeout of zero or more, or NULL to wait for as long as it takes.';
    END IF;
    -- As step_sleep: the run is due when the timeout ends, a time clients must be able to read.
    IF extract(EPOCH FROM step_wait.timeout)
        >= extract(EPOCH FROM timestamptz '10000-01-01 00:00:00+00' - v_now) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ025',
            MESSAGE = pg_catalog.format('X_TIMEOUT_INVALID: wait timeout %s ends past the year 9999',
                step_wait.timeout),
            HINT = 'Pass a timeout that ends before the year 10000, or NULL to wait for as long as it takes.';
    END IF;
    IF step_wait.match IS NOT NULL AND pg_catalog.jsonb_typeof(step_wait.match) <> 'object' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ029',
            MESSAGE = pg_catalog.format('X_MATCH_INVALID: match %s is not a JSON object', step_wait.match),
            HINT = 'Pass an object that the payload must contain, such as ''{"order": 42}''.';
    END IF;

    -- See "The wait and the publish": after this lock, every publish of this event that came
    -- first has committed, and every one that comes later waits for this transaction.
    IF step_wait.event_key IS NULL THEN
        PERFORM x_jobs._lock_event(1::smallint, step_wait.event, TRUE);
    ELSE
        PERFORM x_jobs._lock_event(2::smallint, step_wait.event || E'\x1f' || step_wait.event_key, TRUE);
    END IF;
    v_reached := x_jobs._clock();

    INSERT INTO x_jobs.step AS s (
        job_id, name, kind, created_at, event, event_key, match, since, timeout_at, status, attempt
    )
    VALUES (
        step_wait.id, step_wait.step, 'wait', v_reached, step_wait.event, step_wait.event_key,
        step_wait.match, least(v_reached, coalesce(step_wait.since, v_reached)),
        v_now + step_wait.timeout, 'waiting', v_job.attempt
    )
    ON CONFLICT (job_id, name, compensation) DO NOTHING;

    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
    FOR UPDATE;
    IF v_step.kind <> 'wait' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ027',
            MESSAGE = pg_catalog.format('X_STEP_CONFLICT: step %L of job %s is a %s step, not a wait',
                step_wait.step, step_wait.id, v_step.kind),
            HINT = 'Give every step of a run its own name.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RETURN v_step;
    END IF;

    -- The events of the run's tenant, and those an unscoped role published (tenant 'none': it
    -- acts for every tenant, and its publish resolves every tenant's open waits too). One seek
    -- each, the earlier wins.
    SELECT f.id, f.payload INTO v_event
    FROM (
        (
            SELECT e.id, e.payload, e.published_at
            FROM x_jobs.event AS e
            WHERE e.tenant_id = v_job.tenant_id
                AND e.name = v_step.event
                AND (v_step.event_key IS NULL OR e.key = v_step.event_key)
                AND (v_step.match IS NULL OR e.payload @> v_step.match)
                AND e.published_at >= v_step.since
            ORDER BY e.published_at, e.id
            LIMIT 1
        )
        UNION ALL
        (
            SELECT e.id, e.payload, e.published_at
            FROM x_jobs.event AS e
            WHERE e.tenant_id = 'none' AND v_job.tenant_id <> 'none'
                AND e.name = v_step.event
                AND (v_step.event_key IS NULL OR e.key = v_step.event_key)
                AND (v_step.match IS NULL OR e.payload @> v_step.match)
                AND e.published_at >= v_step.since
            ORDER BY e.published_at, e.id
            LIMIT 1
        )
    ) AS f
    ORDER BY f.published_at, f.id
    LIMIT 1;

    IF v_event.id IS NOT NULL THEN
        UPDATE x_jobs.step AS s
        SET status = 'done', output = v_event.payload, event_id = v_event.id,
            resolved_by = 'event', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSIF v_step.timeout_at <= v_now THEN
        UPDATE x_jobs.step AS s
        SET status = 'failed',
            error = pg_catalog.format('X_STEP_TIMEOUT: no event %L%s came before %s', s.event,
                CASE WHEN s.event_key IS NULL THEN '' ELSE pg_catalog.format(' with key %L', s.event_key) END, s.timeout_at),
            resolved_by = 'timeout', resolved_at = v_now
        WHERE s.job_id = step_wait.id AND s.name = step_wait.step AND NOT s.compensation
        RETURNING s.* INTO v_step;
    ELSE
        PERFORM x_jobs._suspend(step_wait.id, coalesce(v_step.timeout_at, 'infinity'));
    END IF;
    RETURN v_step;
END
$$;

-- Publish an event, in the caller's transaction: it is recorded, the open waits that match it
-- are resolved with its payload, their suspended runs are due at once and their queues are
-- notified, all when the caller commits (a rollback wakes nobody). A wait matches when it names
-- this event, names no key or this key, and its `match` is contained in the payload. Answers
-- the event's id and how many runs it woke.
--
-- READ COMMITTED only: the waits registered while this publish waited for the event's lock are
-- read by a statement after it, which under a transaction snapshot would not see them.
--
-- SECURITY DEFINER: a producer publishes (records an event, resolves the waits on it, makes
-- their runs due) without any right to write jobs or steps itself. Every name in the body is
-- schema-qualified and search_path is pinned with pg_temp last.
CREATE FUNCTION x_jobs.publish(event text, payload jsonb DEFAULT NULL, key text DEFAULT NULL)
RETURNS TABLE (event_id bigint, woken integer)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_id bigint;
    v_jobs bigint[];
    v_queues text[];
    v_scope text[] := x_jobs._tenant_scope();
    -- A scoped publisher's event is its tenant's (the one in scope; several: XJ061), and
    -- resolves only the waits of that tenant's runs. An unscoped one's is 'none', and resolves
    -- the open waits of every tenant, as before tenants were bound.
    v_tenant text := coalesce(x_jobs._stamp_tenant(NULL, v_scope), 'none');
BEGIN
    PERFORM x_jobs._require_event(publish.event);
    -- The key is in the events' and the waits' indexes with the name: past a btree entry's size
    -- (about 2.7 kB) an insert failed with a bare 54000. 400 characters keep both within it.
    IF pg_catalog.length(publish.key) > 400 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ028',
            MESSAGE = pg_catalog.format('X_EVENT_INVALID: event key %s is longer than 400 characters',
                pg_catalog.quote_literal(pg_catalog.left(publish.key, 410))),
            HINT = 'Key events with a short text, such as an order id; put the rest in the payload.';
    END IF;
    IF x_jobs._payload_bytes(publish.payload) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: payload of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(publish.payload), x_jobs._max_payload_bytes()),
            DETAIL = pg_catalog.format('For event %L.', publish.event),
            HINT = 'Publish a reference to large data, or raise x_jobs.max_payload_bytes.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: publish cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Publish from a READ COMMITTED transaction (the default).';
    END IF;

    PERFORM x_jobs._lock_event(1::smallint, publish.event, FALSE);
    IF publish.key IS NOT NULL THEN
        PERFORM x_jobs._lock_event(2::smallint, publish.event || E'\x1f' || publish.key, FALSE);
    END IF;

    INSERT INTO x_jobs.event (name, key, published_at, payload, tenant_id)
    VALUES (publish.event, publish.key, x_jobs._clock(), publish.payload, v_tenant)
    RETURNING id INTO v_id;

    -- The matching waits, locked in job order so that two publishes resolving the same steps
    -- cannot deadlock; a wait resolved meanwhile by another publish is passed over.
    WITH matched AS (
        SELECT s.job_id, s.name
        FROM x_jobs.step AS s
        WHERE s.status = 'waiting'
            AND s.event = publish.event
            AND (s.event_key IS NULL OR s.event_key = publish.key)
            AND (s.match IS NULL OR publish.payload @> s.match)
            -- A wait of another tenant's run is not this publisher's to resolve: its job's
            -- tenant is read by id, per matching wait (a scalar subquery: an EXISTS here may be
            -- planned as a hash of the whole job table).
            AND (v_scope IS NULL OR (SELECT t.tenant_id FROM x_jobs.job AS t WHERE t.id = s.job_id) = v_tenant)
        ORDER BY s.job_id, s.name
        FOR UPDATE OF s
    ),
    resolved AS (
        UPDATE x_jobs.step AS s
        SET status = 'done', output = publish.payload, event_id = v_id,
            resolved_by = 'event', resolved_at = v_now
        FROM matched AS m
        WHERE s.job_id = m.job_id AND s.name = m.name AND NOT s.compensation
            AND s.status = 'waiting'
        RETURNING s.job_id
    ),
    woke AS (
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        FROM resolved AS r
        WHERE j.id = r.job_id AND j.state = 'suspended'
        RETURNING j.id, j.queue
    )
    SELECT coalesce(pg_catalog.array_agg(w.id), '{}'), coalesce(pg_catalog.array_agg(DISTINCT w.queue), '{}')
    INTO v_jobs, v_queues
    FROM woke AS w;

    PERFORM x_jobs._notify('x_jobs', q.queue) FROM unnest(v_queues) AS q (queue);
    RETURN QUERY SELECT v_id, pg_catalog.cardinality(v_jobs);
END
$$;

-- An operator resolves a waiting step by hand (a sleep to end now, an approval given outside the
-- system): the step is done with `output`, and its run, if suspended, is due at once. Refused
-- while a worker holds the job (its body may be about to record the step itself).
CREATE FUNCTION x_jobs.resolve_step(job bigint, step text, output jsonb DEFAULT NULL)
RETURNS x_jobs.step
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    v_job x_jobs.job;
    v_step x_jobs.step;
BEGIN
    -- The step row is locked before the job row, as publish locks them: the other order could
    -- deadlock with a publish of the same event (and abort the publisher's transaction).
    SELECT s.* INTO v_step
    FROM x_jobs.step AS s
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    FOR UPDATE;
    SELECT j.* INTO v_job FROM x_jobs.job AS j WHERE j.id = resolve_step.job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ014',
            MESSAGE = pg_catalog.format('X_JOB_NOT_FOUND: no job has id %s', coalesce(resolve_step.job::text, 'NULL')),
            HINT = 'Check the id; finished jobs are removed by purge after their retention.';
    END IF;
    IF v_job.state = 'running' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ030',
            MESSAGE = pg_catalog.format('X_JOB_HELD: job %s is running on worker %L', resolve_step.job,
                v_job.claimed_by),
            HINT = 'Resolve a step while its run is suspended; wait for the worker to suspend or settle it.';
    END IF;

    IF v_step.job_id IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ031',
            MESSAGE = pg_catalog.format('X_STEP_NOT_FOUND: job %s has no step %L', resolve_step.job,
                coalesce(resolve_step.step, 'NULL')),
            HINT = 'List the job''s steps with `x-jobs jobs show`; a step exists once the run reached it.';
    END IF;
    IF v_step.status <> 'waiting' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ032',
            MESSAGE = pg_catalog.format('X_STEP_NOT_WAITING: step %L of job %s is %s', resolve_step.step,
                resolve_step.job, v_step.status),
            HINT = 'Only a waiting step (a sleep or a wait on an event) can be resolved.';
    END IF;
    IF x_jobs._payload_bytes(resolve_step.output) > x_jobs._max_payload_bytes() THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ003',
            MESSAGE = pg_catalog.format('X_PAYLOAD_TOO_LARGE: output of %s bytes exceeds the limit of %s',
                x_jobs._payload_bytes(resolve_step.output), x_jobs._max_payload_bytes()),
            HINT = 'Pass a smaller output, or raise x_jobs.max_payload_bytes.';
    END IF;

    UPDATE x_jobs.step AS s
    SET status = 'done', output = resolve_step.output, resolved_by = 'operator', resolved_at = v_now
    WHERE s.job_id = resolve_step.job AND s.name = resolve_step.step AND NOT s.compensation
    RETURNING s.* INTO v_step;

    IF v_job.state = 'suspended' THEN
        UPDATE x_jobs.job AS j
        SET state = 'ready', run_at = v_now, updated_at = v_now
        WHERE j.id = resolve_step.job;
        PERFORM pg_catalog.pg_notify('x_jobs', x_jobs._notify_tag('x_jobs', v_job.queue));
    END IF;
    RETURN v_step;
END
$$;

-- A running job's progress, as its body reports it: done out of total (either may be NULL) and
-- a note, with the instant. Answers true, or false when the worker no longer holds the job
-- (nothing changed: its body should stop), its id is another login's (x_jobs._fence) or, with
-- `attempt`, the job is at another attempt.
-- SECURITY DEFINER: workers hold no right to write the tables (see Grants).
CREATE FUNCTION x_jobs.progress(
    id bigint,
    worker text,
    done double precision DEFAULT NULL,
    total double precision DEFAULT NULL,
    note text DEFAULT NULL,
    attempt integer DEFAULT NULL
)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM x_jobs._require_worker(progress.worker, 'Pass the id the worker claimed with.');
    -- NaN and the infinities are no JSON numbers (jsonb writes them as strings), and NaN sorts
    -- above every number, so that a NaN total passed the `done > total` test.
    IF progress.done < 0 OR progress.total < 0 OR progress.done > progress.total
        OR progress.done IN ('NaN', 'Infinity') OR progress.total IN ('NaN', 'Infinity') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ033',
            MESSAGE = pg_catalog.format('X_PROGRESS_INVALID: progress %s of %s is negative, not finite or past the total',
                coalesce(progress.done::text, 'NULL'), coalesce(progress.total::text, 'NULL')),
            HINT = 'Report done and total as finite numbers of zero or more, with done <= total.';
    END IF;
    -- A message of its own: under the one above, a long note was reported as "progress NULL of
    -- NULL is negative, not finite or past the total".
    IF pg_catalog.length(progress.note) > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ033',
            MESSAGE = pg_catalog.format('X_PROGRESS_INVALID: progress note %L... is %s characters, longer than 1000',
                pg_catalog.left(progress.note, 64), pg_catalog.length(progress.note)),
            HINT = 'Keep a progress note to 1000 characters; log the rest, or put it in the job''s output.';
    END IF;
    IF NOT x_jobs._fence(progress.worker) THEN
        RETURN FALSE;
    END IF;

    UPDATE x_jobs.job AS j
    SET progress = pg_catalog.jsonb_strip_nulls(pg_catalog.jsonb_build_object(
            'done', progress.done, 'total', progress.total, 'note', progress.note,
            'at', x_jobs._clock()))
    WHERE j.id = progress.id
        AND j.state::text = 'running' -- by id only: see job_running_idx
        AND j.claimed_by = progress.worker
        AND (progress.attempt IS NULL OR j.attempt = progress.attempt)
        -- A bound worker reports on its tenants' runs only (see x_jobs._tenant_scope).
        AND (x_jobs._tenant_scope() IS NULL OR j.tenant_id = ANY (x_jobs._tenant_scope()));
    RETURN FOUND;
END
$$;

-- The refusal of bad retention arguments, shared by purge_events, purge_outbox and
-- purge_webhook_ledger: `p_what` names what is purged, `p_age` is an age that suits it.
CREATE FUNCTION x_jobs._require_retention(
    p_what text, p_older_than interval, p_batch_size integer, p_age text
)
RETURNS void
LANGUAGE plpgsql
IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- At most 1000 years (as the x-jobs maintain command): now() minus many millennia is past
    -- what timestamptz holds, a bare "timestamp out of range".
    IF p_older_than IS NULL OR p_older_than < interval '0' OR p_older_than > interval '1000 years'
        OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ020',
            MESSAGE = pg_catalog.format('X_RETENTION_INVALID: purge %s older than %s in batches of %s',
                p_what, coalesce(p_older_than::text, 'NULL'), coalesce(p_batch_size::text, 'NULL')),
            HINT = pg_catalog.format('Pass an age from zero to 1000 years, %s, and a batch size of 1 or more.',
                p_age);
    END IF;
END
$$;

-- Retention for events: delete up to `batch_size` events published before now - older_than,
-- lowest id first (nearly oldest first, along the primary key). Answers how many; call it again
-- until it answers less than batch_size. A wait that asks for events since an instant older
-- than the retention will not see the purged ones. Run one purger at a time: it takes no row
-- locks to skip (admins may delete events, not update them).
CREATE FUNCTION x_jobs.purge_events(older_than interval, batch_size integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_count bigint;
BEGIN
    PERFORM x_jobs._require_retention('events', purge_events.older_than, purge_events.batch_size,
        'such as ''30 days''');

    -- The batch is picked once, as an array, as purge picks its own (see there).
    DELETE FROM x_jobs.event AS e
    WHERE e.id = ANY (ARRAY(
        SELECT k.id
        FROM x_jobs.event AS k
        WHERE k.published_at < x_jobs.now() - purge_events.older_than
        ORDER BY k.id
        LIMIT purge_events.batch_size
    ));
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$$;

-- Tests: tests/pgtap/34-steps.sql, tests/pgtap/35-events.sql, tests/pgtap/60-retention.sql,
--        tests/python/test_events.py, tests/python/test_workflows.py,
--        tests/python/test_steps_reconnect.py, tests/python/test_plan.py
