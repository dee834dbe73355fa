------------------------------------------------------------------------------------------------
-- Functions: schedules
------------------------------------------------------------------------------------------------

-- The job a schedule enqueues for instant p_at: its input with `_schedule` added (the schedule's
-- name, the instant in UTC, whether it is enqueued later than the schedule's grace, and for a
-- run asked by hand `manual`), due at p_at. overlap 'skip' keys it by the schedule's name: an
-- idempotency key is unique among live rows, so no run starts while another one is live.
-- One expression and no SET clause, so that it inlines into the tick's statement: the instant
-- is written in UTC whatever the session's TimeZone ("2030-01-01T10:00:00+00:00").
CREATE FUNCTION x_jobs._schedule_request(
    p_schedule x_jobs.schedule, p_at timestamptz, p_now timestamptz, p_manual boolean
)
RETURNS x_jobs.enqueue_request
LANGUAGE sql
STABLE
AS $$
    SELECT ROW(
        p_schedule.job,
        p_schedule.input || pg_catalog.jsonb_build_object('_schedule',
            pg_catalog.jsonb_build_object(
                'name', p_schedule.name,
                'at', (pg_catalog.to_jsonb(p_at AT TIME ZONE 'UTC') #>> '{}') || '+00:00',
                'late', p_now - p_at > p_schedule.grace)
            || CASE WHEN p_manual THEN '{"manual": true}'::jsonb ELSE '{}'::jsonb END),
        p_schedule.queue,
        p_at,
        CASE WHEN p_schedule.overlap = 'skip' THEN 'x_jobs.schedule:' || p_schedule.name END,
        p_schedule.max_attempts,
        p_schedule.priority,
        p_schedule.tenant_id,
        p_schedule.concurrency_key,
        p_schedule.concurrency_limit,
        NULL,
        'schedule:' || p_schedule.name,
        p_schedule.dead_letter,
        p_schedule.backoff_base,
        p_schedule.backoff_max,
        p_schedule.keep_done,
        NULL
    )::x_jobs.enqueue_request
$$;

-- The answer of the functions that show a schedule, with the state of its last job.
CREATE FUNCTION x_jobs._schedule_info(p_schedule x_jobs.schedule)
RETURNS x_jobs.schedule_info
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT ROW(
        p_schedule.name, p_schedule.job, p_schedule.cron, p_schedule.tz, p_schedule.input,
        p_schedule.queue, p_schedule.priority, p_schedule.max_attempts, p_schedule.tenant_id,
        p_schedule.concurrency_key, p_schedule.concurrency_limit, p_schedule.dead_letter,
        p_schedule.backoff_base, p_schedule.backoff_max, p_schedule.keep_done, p_schedule.catchup,
        p_schedule.catchup_max, p_schedule.overlap, p_schedule.grace, p_schedule.paused,
        p_schedule.next_fire_at, p_schedule.last_fire_at, p_schedule.last_enqueued_at,
        p_schedule.last_job_id,
        (SELECT j.state FROM x_jobs.job AS j WHERE j.id = p_schedule.last_job_id),
        p_schedule.fires, p_schedule.skips, p_schedule.last_error, p_schedule.origin,
        p_schedule.declared_by, p_schedule.created_at, p_schedule.updated_at
    )::x_jobs.schedule_info
$$;

-- XJ050 for a schedule name that no row has.
CREATE FUNCTION x_jobs._schedule_not_found(p_name text)
RETURNS void
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'XJ050',
        MESSAGE = pg_catalog.format('X_SCHEDULE_NOT_FOUND: no schedule is named %s',
            coalesce(pg_catalog.quote_literal(pg_catalog.left(p_name, 210)), 'NULL')),
        HINT = 'SELECT name FROM x_jobs.list_schedules() lists them; set_schedule makes one.';
END
$$;

-- Create or update the schedule `name`: every `cron` instant in time zone `tz` (an IANA name)
-- it enqueues job `job` with `input` (an object, to which each run's `_schedule` is added)
-- and enqueue's options (NULL: the job's declaration, else the built-in default). Answers the
-- row, with the instant it fires next.
-- catchup: what a tick does with instants missed while nothing ticked or the schedule could
-- not fire: 'latest' (one run, for the last of them), 'all' (one run each, oldest first, at
-- most catchup_max, the rest skipped), 'none' (none of those older than `grace`).
-- overlap: 'allow', or 'skip' (no run while one of the schedule's is live).
-- grace: how late a run may be enqueued and still count as on time (its `_schedule.late`).
-- An update keeps next_fire_at while the expression and zone mean the same instants, so that a
-- worker that declares its schedules at each start neither skips nor repeats a fire; paused
-- NULL keeps the schedule paused or not (an operator's pause outlives a deploy), false resumes
-- it from now. origin names who keeps it ('code': an app's declarations), declared_by who set it.
-- Every refusal is the one a tick would meet: the options are tried by enqueue itself, in a
-- subtransaction rolled back, with the job's declaration filling what the schedule leaves out.
-- SECURITY DEFINER: workers declare their app's schedules and hold no right on the table.
CREATE FUNCTION x_jobs.set_schedule(
    name text,
    job text,
    cron text,
    tz text DEFAULT 'UTC',
    input jsonb DEFAULT '{}',
    queue text DEFAULT NULL,
    catchup text DEFAULT 'latest',
    catchup_max integer DEFAULT 100,
    overlap text DEFAULT 'allow',
    grace interval DEFAULT '1 minute',
    priority integer DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    tenant_id text DEFAULT NULL,
    concurrency_key text DEFAULT NULL,
    concurrency_limit integer DEFAULT NULL,
    dead_letter boolean DEFAULT NULL,
    backoff_base interval DEFAULT NULL,
    backoff_max interval DEFAULT NULL,
    keep_done boolean DEFAULT NULL,
    paused boolean DEFAULT NULL,
    origin text DEFAULT NULL,
    declared_by text DEFAULT NULL
)
RETURNS x_jobs.schedule_info
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_now timestamptz := x_jobs.now();
    v_new x_jobs.schedule;
    v_row x_jobs.schedule;
    v_problem text;
BEGIN
    v_problem := CASE
        WHEN set_schedule.name IS NULL OR set_schedule.name = '' OR pg_catalog.length(set_schedule.name) > 200
            THEN pg_catalog.format('name %s is not a schedule name (1 to 200 characters)',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(set_schedule.name, 210)), 'NULL'))
        WHEN set_schedule.input IS NULL OR pg_catalog.jsonb_typeof(set_schedule.input) <> 'object'
            THEN pg_catalog.format('input %s is not a JSON object',
                coalesce(pg_catalog.left(set_schedule.input::text, 100), 'NULL'))
        WHEN set_schedule.input ? '_schedule'
            THEN 'input has a key _schedule, which each run gets from its schedule'
        WHEN set_schedule.catchup IS NULL OR set_schedule.catchup NOT IN ('latest', 'all', 'none')
            THEN pg_catalog.format('catchup %s is not latest, all or none',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(set_schedule.catchup, 100)), 'NULL'))
        WHEN set_schedule.catchup_max IS NULL OR set_schedule.catchup_max NOT BETWEEN 1 AND 10000
            THEN pg_catalog.format('catchup_max %s is outside 1..10000',
                coalesce(set_schedule.catchup_max::text, 'NULL'))
        WHEN set_schedule.overlap IS NULL OR set_schedule.overlap NOT IN ('allow', 'skip')
            THEN pg_catalog.format('overlap %s is not allow or skip',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(set_schedule.overlap, 100)), 'NULL'))
        WHEN set_schedule.grace IS NULL OR set_schedule.grace < interval '0' OR set_schedule.grace > interval '1 day'
            THEN pg_catalog.format('grace %s is outside 0 to 1 day', coalesce(set_schedule.grace::text, 'NULL'))
        WHEN pg_catalog.length(set_schedule.origin) > 200 OR pg_catalog.length(set_schedule.declared_by) > 200
            THEN 'origin or declared_by is longer than 200 characters'
    END;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ049',
            MESSAGE = 'X_SCHEDULE_INVALID: ' || v_problem,
            DETAIL = pg_catalog.format('In schedule %s.',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(set_schedule.name, 210)), 'NULL')),
            HINT = 'A schedule takes a name, an input object (default {}), catchup latest, all or none '
                'with catchup_max from 1 to 10000 (default 100), overlap allow or skip, and a grace '
                'from 0 to 1 day (default 1 minute).';
    END IF;

    v_new.name := set_schedule.name;
    v_new.job := set_schedule.job;
    v_new.cron := pg_catalog.btrim(set_schedule.cron, E' \t\n\r');
    v_new.fields := x_jobs._cron_parse(set_schedule.cron);
    v_new.tz := x_jobs._require_time_zone(set_schedule.tz);
    v_new.input := set_schedule.input;
    v_new.queue := set_schedule.queue;
    v_new.priority := set_schedule.priority;
    v_new.max_attempts := set_schedule.max_attempts;
    v_new.tenant_id := set_schedule.tenant_id;
    v_new.concurrency_key := set_schedule.concurrency_key;
    v_new.concurrency_limit := set_schedule.concurrency_limit;
    v_new.dead_letter := set_schedule.dead_letter;
    v_new.backoff_base := set_schedule.backoff_base;
    v_new.backoff_max := set_schedule.backoff_max;
    v_new.keep_done := set_schedule.keep_done;
    v_new.catchup := set_schedule.catchup;
    v_new.catchup_max := set_schedule.catchup_max;
    v_new.overlap := set_schedule.overlap;
    v_new.grace := set_schedule.grace;
    v_new.paused := coalesce(set_schedule.paused, FALSE);
    v_new.next_fire_at := coalesce(x_jobs._cron_next(v_new.fields, v_new.tz, v_now), 'infinity');
    v_new.origin := set_schedule.origin;
    v_new.declared_by := coalesce(set_schedule.declared_by, SESSION_USER::text);

    -- The trial: enqueue takes the job or refuses it as a tick would, and the sentinel XJ999
    -- then rolls the block's subtransaction back, the trial's row with it (its id is spent).
    -- XJ999 is caught here and nowhere else raised: no caller ever meets it. A schedule set
    -- again as it is (each worker's start declares its app's) was tried when it was set: no
    -- trial, so that restarts leave no dead rows in x_jobs.job.
    SELECT s.* INTO v_row FROM x_jobs.schedule AS s WHERE s.name = v_new.name;
    IF NOT FOUND OR ROW(
        v_row.job, v_row.fields, v_row.tz, v_row.input, v_row.queue, v_row.priority,
        v_row.max_attempts, v_row.tenant_id, v_row.concurrency_key, v_row.concurrency_limit,
        v_row.dead_letter, v_row.backoff_base, v_row.backoff_max, v_row.keep_done, v_row.overlap,
        v_row.grace
    ) IS DISTINCT FROM ROW(
        v_new.job, v_new.fields, v_new.tz, v_new.input, v_new.queue, v_new.priority,
        v_new.max_attempts, v_new.tenant_id, v_new.concurrency_key, v_new.concurrency_limit,
        v_new.dead_letter, v_new.backoff_base, v_new.backoff_max, v_new.keep_done, v_new.overlap,
        v_new.grace
    ) THEN
        BEGIN
            PERFORM x_jobs._enqueue(ARRAY[x_jobs._schedule_request(v_new, v_now, v_now, FALSE)]);
            RAISE EXCEPTION USING
                ERRCODE = 'XJ999',
                MESSAGE = 'X_TRIAL_UNDONE: the trial enqueue of set_schedule is rolled back';
        EXCEPTION WHEN SQLSTATE 'XJ999' THEN
            NULL;
        END;
    END IF;

    INSERT INTO x_jobs.schedule AS s (
        name, job, cron, tz, fields, input, queue, priority, max_attempts, tenant_id,
        concurrency_key, concurrency_limit, dead_letter, backoff_base, backoff_max, keep_done,
        catchup, catchup_max, overlap, grace, paused, next_fire_at, origin, declared_by,
        created_at, updated_at
    ) VALUES (
        v_new.name, v_new.job, v_new.cron, v_new.tz, v_new.fields, v_new.input, v_new.queue,
        v_new.priority, v_new.max_attempts, v_new.tenant_id, v_new.concurrency_key,
        v_new.concurrency_limit, v_new.dead_letter, v_new.backoff_base, v_new.backoff_max,
        v_new.keep_done, v_new.catchup, v_new.catchup_max, v_new.overlap, v_new.grace,
        v_new.paused, v_new.next_fire_at, v_new.origin, v_new.declared_by, v_now, v_now
    )
    ON CONFLICT ON CONSTRAINT schedule_pkey DO UPDATE SET
        job = excluded.job, cron = excluded.cron, tz = excluded.tz, fields = excluded.fields,
        input = excluded.input, queue = excluded.queue, priority = excluded.priority,
        max_attempts = excluded.max_attempts, tenant_id = excluded.tenant_id,
        concurrency_key = excluded.concurrency_key, concurrency_limit = excluded.concurrency_limit,
        dead_letter = excluded.dead_letter, backoff_base = excluded.backoff_base,
        backoff_max = excluded.backoff_max, keep_done = excluded.keep_done,
        catchup = excluded.catchup, catchup_max = excluded.catchup_max,
        overlap = excluded.overlap, grace = excluded.grace,
        paused = coalesce(set_schedule.paused, s.paused),
        -- The same instants (the fields and zone unchanged) and no resume: the fire to come
        -- stays, even one that is due now.
        next_fire_at = CASE
            WHEN s.fields = excluded.fields AND s.tz = excluded.tz
                AND NOT (s.paused AND set_schedule.paused IS FALSE) THEN s.next_fire_at
            ELSE excluded.next_fire_at
        END,
        origin = excluded.origin, declared_by = excluded.declared_by, updated_at = excluded.updated_at
    RETURNING s.* INTO v_row;
    RETURN x_jobs._schedule_info(v_row);
END
$$;

-- Delete the schedule `name`; false if there was none. Jobs it enqueued are left as they are.
CREATE FUNCTION x_jobs.drop_schedule(name text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    DELETE FROM x_jobs.schedule AS s WHERE s.name = drop_schedule.name;
    RETURN FOUND;
END
$$;

-- Stop the schedule `name` from firing (XJ050 if there is none); a paused schedule stays paused
-- when its app declares it again. Answers the row.
CREATE FUNCTION x_jobs.pause_schedule(name text)
RETURNS x_jobs.schedule_info
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row x_jobs.schedule;
BEGIN
    UPDATE x_jobs.schedule AS s
    SET paused = TRUE, updated_at = x_jobs.now()
    WHERE s.name = pause_schedule.name
    RETURNING s.* INTO v_row;
    IF NOT FOUND THEN
        PERFORM x_jobs._schedule_not_found(pause_schedule.name);
    END IF;
    RETURN x_jobs._schedule_info(v_row);
END
$$;

-- Let the paused schedule `name` fire again (XJ050 if there is none), from its next instant
-- after now: what it would have fired while paused is not caught up, a pause being meant.
-- Answers the row; a schedule that was not paused is left as it is.
CREATE FUNCTION x_jobs.resume_schedule(name text)
RETURNS x_jobs.schedule_info
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.schedule;
BEGIN
    SELECT s.* INTO v_row FROM x_jobs.schedule AS s WHERE s.name = resume_schedule.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM x_jobs._schedule_not_found(resume_schedule.name);
    END IF;
    IF v_row.paused THEN
        UPDATE x_jobs.schedule AS s
        SET paused = FALSE,
            next_fire_at = coalesce(x_jobs._cron_next(s.fields, s.tz, v_now), 'infinity'),
            updated_at = v_now
        WHERE s.name = v_row.name
        RETURNING s.* INTO v_row;
    END IF;
    RETURN x_jobs._schedule_info(v_row);
END
$$;

-- The schedules, by name; with `name`, that one only (no row if there is none).
-- SECURITY DEFINER: workers read the schedules their app keeps, with no right on the table.
CREATE FUNCTION x_jobs.list_schedules(name text DEFAULT NULL)
RETURNS SETOF x_jobs.schedule_info
LANGUAGE sql
STABLE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT i.*
    FROM x_jobs.schedule AS s
    CROSS JOIN LATERAL x_jobs._schedule_info(s) AS i
    WHERE list_schedules.name IS NULL OR s.name = list_schedules.name
    ORDER BY s.name
$$;

-- Enqueue the job of schedule `name` now, once, paused or not, as a run asked by hand
-- (`_schedule.manual`); its next instant stays. overlap 'skip' applies: with a run of the
-- schedule live, this answers that one (deduped). XJ050 if there is no such schedule.
-- SECURITY DEFINER: it enqueues, as enqueue does (see Grants).
CREATE FUNCTION x_jobs.run_schedule_now(name text)
RETURNS x_jobs.enqueue_result
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := x_jobs.now();
    v_row x_jobs.schedule;
    v_result x_jobs.enqueue_result;
BEGIN
    SELECT s.* INTO v_row FROM x_jobs.schedule AS s WHERE s.name = run_schedule_now.name FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM x_jobs._schedule_not_found(run_schedule_now.name);
    END IF;
    SELECT e.id, e.run_id, e.deduped INTO v_result
    FROM x_jobs._enqueue(ARRAY[x_jobs._schedule_request(v_row, v_now, v_now, TRUE)]) AS e;
    UPDATE x_jobs.schedule AS s
    SET fires = s.fires + (NOT v_result.deduped)::integer,
        skips = s.skips + v_result.deduped::integer,
        last_job_id = CASE WHEN v_result.deduped THEN s.last_job_id ELSE v_result.id END,
        last_fire_at = CASE WHEN v_result.deduped THEN s.last_fire_at ELSE v_now END,
        last_enqueued_at = CASE WHEN v_result.deduped THEN s.last_enqueued_at ELSE v_now END
    WHERE s.name = v_row.name;
    RETURN v_result;
END
$$;

-- What a tick fires of the due schedule p_schedule at p_now, by its catchup: ats, the instants
-- it enqueues a job for, oldest first (none: its catch-up fires none); next_at, the instant it
-- fires next (infinity: none in 30 years); dropped, 1 if it passed over an instant that came
-- without a job for it (a catch-up that passes over several counts one: counting them would
-- mean stepping over each, 20,160 for two weeks of a schedule every minute).
--   latest: one run, for the last instant that came; all: one run each, oldest first, at most
--   catchup_max, then on from the next instant after p_now; none: one run for the last instant
--   if it came within grace, else none.
CREATE FUNCTION x_jobs._schedule_due(
    p_schedule x_jobs.schedule, p_now timestamptz,
    OUT ats timestamptz[], OUT next_at timestamptz, OUT dropped integer
)
RETURNS record
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields x_jobs.cron_fields := p_schedule.fields;
    v_tz text := p_schedule.tz;
    v_at timestamptz := p_schedule.next_fire_at;
    v_next timestamptz := x_jobs._cron_next(v_fields, v_tz, v_at);
BEGIN
    dropped := 0;
    IF v_next IS NULL OR v_next > p_now THEN
        -- The usual case: one instant has come.
        IF p_schedule.catchup = 'none' AND p_now - v_at > p_schedule.grace THEN
            ats := ARRAY[]::timestamptz[];
            dropped := 1;
        ELSE
            ats := ARRAY[v_at];
        END IF;
    ELSIF p_schedule.catchup = 'all' THEN
        ats := ARRAY[v_at];
        WHILE v_next <= p_now AND pg_catalog.cardinality(ats) < p_schedule.catchup_max LOOP
            ats := ats || v_next;
            v_next := x_jobs._cron_next(v_fields, v_tz, v_next);
        END LOOP;
        IF v_next <= p_now THEN
            dropped := 1;
            v_next := x_jobs._cron_next(v_fields, v_tz, p_now);
        END IF;
    ELSE
        v_at := x_jobs._cron_last(v_fields, v_tz, v_next, p_now);
        dropped := 1;
        IF p_schedule.catchup = 'latest' OR p_now - v_at <= p_schedule.grace THEN
            ats := ARRAY[v_at];
        ELSE
            ats := ARRAY[]::timestamptz[];
        END IF;
        v_next := x_jobs._cron_next(v_fields, v_tz, v_at);
    END IF;
    next_at := coalesce(v_next, 'infinity');
END
$$;

-- Fire every due schedule, at most `max_rows` of them (1 to 100000) per call, in this one
-- transaction: lock the due rows (SKIP LOCKED: a row another ticker holds is its to fire),
-- enqueue their jobs, advance next_fire_at. Any number of callers at once and none a leader:
-- each worker calls it on its own timer, pg_cron may call it every minute. A row a ticker has
-- advanced no longer qualifies when another one gets to lock it (READ COMMITTED rechecks the
-- condition on the newest version), so no instant fires twice; and the enqueue and the
-- advance commit together, so a crash between them cannot lose or repeat one.
-- Which instants fire: those come since next_fire_at, by the schedule's catchup
-- (x_jobs._schedule_due). A job that enqueue refuses (its input grew past
-- x_jobs.max_payload_bytes, its declaration changed) does not stop the others: its schedule
-- records the error in last_error, counts the instant skipped, and moves on. Any other error
-- (a race, a malformed x_jobs.max_payload_bytes, the server's) ends the tick with nothing
-- fired, for the next tick to fire.
-- Answers how many schedules it advanced (a caller ticks again while that is max_rows), how
-- many jobs it enqueued, how many instants it skipped (overlap, catch-up, a refused job; a
-- catch-up that skipped instants counts one), and the next instant any schedule is due at.
-- Set-based: one statement locks the due rows and builds every request, one enqueue takes
-- them all, one statement advances the rows (per row, only the cron arithmetic).
-- SECURITY DEFINER: workers and pg_cron's jobs tick with no right on the tables.
CREATE FUNCTION x_jobs.tick_schedules(max_rows integer DEFAULT 1000)
RETURNS TABLE (schedules integer, enqueued integer, skipped integer, next_fire_at timestamptz)
LANGUAGE plpgsql
VOLATILE
SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := x_jobs.now();
    -- One entry per due schedule, in the order of owner (1, 2, ...).
    v_names text[];
    v_nexts timestamptz[];
    v_drops integer[];
    v_errors text[];
    -- One entry per instant to fire, its schedule's owner number beside it, ascending.
    v_requests x_jobs.enqueue_request[];
    v_owners integer[];
    v_ats timestamptz[];
    v_ids bigint[];
    v_deduped boolean[];
    v_first integer;
    v_last integer;
    v_part_ids bigint[];
    v_part_deduped boolean[];
    v_enqueued integer;
    v_skipped integer;
BEGIN
    IF tick_schedules.max_rows IS NULL OR tick_schedules.max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: max_rows %s is outside 1..100000',
                coalesce(tick_schedules.max_rows::text, 'NULL')),
            HINT = 'Tick at most 1 to 100000 schedules a call (default 1000), and again while it answers that many.';
    END IF;
    IF pg_catalog.current_setting('transaction_isolation') IN ('repeatable read', 'serializable') THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ022',
            MESSAGE = pg_catalog.format('X_ISOLATION_UNSUPPORTED: tick_schedules cannot run at isolation level %s',
                pg_catalog.current_setting('transaction_isolation')),
            HINT = 'Call tick_schedules in its own READ COMMITTED transaction (autocommit).';
    END IF;

    -- The due rows, locked, first due first, and what each fires. An instant's row joins its
    -- schedule's (a schedule that fires none joins a row of NULLs, k NULL): the schedule's
    -- entries are read from its first row, the instants' from every row that has one.
    WITH due AS (
        SELECT s AS schedule
        FROM x_jobs.schedule AS s
        WHERE NOT s.paused AND s.next_fire_at <= v_now
        ORDER BY s.next_fire_at
        LIMIT tick_schedules.max_rows
        FOR UPDATE SKIP LOCKED
    ),
    planned AS (
        SELECT
            pg_catalog.row_number() OVER ()::integer AS owner,
            d.schedule,
            p.ats,
            p.next_at,
            p.dropped
        FROM due AS d
        CROSS JOIN LATERAL x_jobs._schedule_due(d.schedule, v_now) AS p
    )
    SELECT
        pg_catalog.array_agg((p.schedule).name ORDER BY p.owner) FILTER (WHERE coalesce(a.k, 1) = 1),
        pg_catalog.array_agg(p.next_at ORDER BY p.owner) FILTER (WHERE coalesce(a.k, 1) = 1),
        pg_catalog.array_agg(p.dropped ORDER BY p.owner) FILTER (WHERE coalesce(a.k, 1) = 1),
        pg_catalog.array_agg(x_jobs._schedule_request(p.schedule, a.at, v_now, FALSE) ORDER BY p.owner, a.k)
            FILTER (WHERE a.k IS NOT NULL),
        pg_catalog.array_agg(p.owner ORDER BY p.owner, a.k) FILTER (WHERE a.k IS NOT NULL),
        pg_catalog.array_agg(a.at ORDER BY p.owner, a.k) FILTER (WHERE a.k IS NOT NULL)
    INTO v_names, v_nexts, v_drops, v_requests, v_owners, v_ats
    FROM planned AS p
    LEFT JOIN LATERAL unnest(p.ats) WITH ORDINALITY AS a (at, k) ON TRUE;

    IF v_names IS NULL THEN
        RETURN QUERY SELECT 0, 0, 0, (
            SELECT min(s.next_fire_at) FROM x_jobs.schedule AS s WHERE NOT s.paused
        );
        RETURN;
    END IF;

    v_errors := pg_catalog.array_fill(NULL::text, ARRAY[pg_catalog.cardinality(v_names)]);
    IF v_requests IS NOT NULL THEN
        BEGIN
            SELECT pg_catalog.array_agg(e.id ORDER BY e.ord), pg_catalog.array_agg(e.deduped ORDER BY e.ord)
            INTO v_ids, v_deduped
            FROM x_jobs._enqueue(v_requests) AS e;
        EXCEPTION WHEN OTHERS THEN
            -- A refusal of a request (an XJ code) is its schedule's; anything else ends the tick.
            IF SQLSTATE NOT LIKE 'XJ%' OR SQLSTATE IN ('XJ038', 'XJ040') THEN
                RAISE;
            END IF;
            -- Each schedule's jobs again, on their own, so that only the refused ones are left
            -- out. A schedule's requests are side by side (v_owners ascends).
            v_ids := pg_catalog.array_fill(NULL::bigint, ARRAY[pg_catalog.cardinality(v_requests)]);
            v_deduped := pg_catalog.array_fill(FALSE, ARRAY[pg_catalog.cardinality(v_requests)]);
            v_first := 1;
            WHILE v_first <= pg_catalog.cardinality(v_requests) LOOP
                v_last := v_first;
                WHILE v_last < pg_catalog.cardinality(v_requests) AND v_owners[v_last + 1] = v_owners[v_first] LOOP
                    v_last := v_last + 1;
                END LOOP;
                BEGIN
                    SELECT pg_catalog.array_agg(e.id ORDER BY e.ord), pg_catalog.array_agg(e.deduped ORDER BY e.ord)
                    INTO v_part_ids, v_part_deduped
                    FROM x_jobs._enqueue(v_requests[v_first:v_last]) AS e;
                    v_ids[v_first:v_last] := v_part_ids;
                    v_deduped[v_first:v_last] := v_part_deduped;
                EXCEPTION WHEN OTHERS THEN
                    IF SQLSTATE NOT LIKE 'XJ%' OR SQLSTATE IN ('XJ038', 'XJ040') THEN
                        RAISE;
                    END IF;
                    v_errors[v_owners[v_first]] := SQLERRM;
                END;
                v_first := v_last + 1;
            END LOOP;
        END;
    END IF;

    -- Each schedule advanced, with what it fired: the jobs it enqueued (not deduped onto a live
    -- run), the instants it missed (deduped, refused, passed over), its last job and instant.
    WITH fired AS (
        SELECT
            f.owner,
            pg_catalog.count(*) FILTER (WHERE f.id IS NOT NULL AND NOT f.deduped) AS fires,
            pg_catalog.count(*) FILTER (WHERE f.id IS NULL OR f.deduped) AS misses,
            (pg_catalog.array_agg(f.id ORDER BY f.k DESC) FILTER (WHERE f.id IS NOT NULL AND NOT f.deduped))[1] AS last_id,
            max(f.at) FILTER (WHERE f.id IS NOT NULL AND NOT f.deduped) AS last_at
        FROM unnest(v_owners, v_ids, v_deduped, v_ats) WITH ORDINALITY AS f (owner, id, deduped, at, k)
        GROUP BY f.owner
    ),
    advanced AS (
        UPDATE x_jobs.schedule AS s
        SET next_fire_at = n.next,
            last_fire_at = coalesce(f.last_at, s.last_fire_at),
            last_enqueued_at = CASE WHEN f.fires > 0 THEN v_now ELSE s.last_enqueued_at END,
            last_job_id = coalesce(f.last_id, s.last_job_id),
            fires = s.fires + coalesce(f.fires, 0),
            skips = s.skips + coalesce(f.misses, 0) + n.dropped,
            last_error = n.error
        FROM unnest(v_names, v_nexts, v_drops, v_errors) WITH ORDINALITY AS n (name, next, dropped, error, owner)
        LEFT JOIN fired AS f ON f.owner = n.owner
        WHERE s.name = n.name
        RETURNING coalesce(f.fires, 0) AS fires, coalesce(f.misses, 0) + n.dropped AS skips
    )
    SELECT coalesce(sum(a.fires), 0)::integer, coalesce(sum(a.skips), 0)::integer
    INTO v_enqueued, v_skipped
    FROM advanced AS a;

    RETURN QUERY SELECT pg_catalog.cardinality(v_names), v_enqueued, v_skipped, (
        SELECT min(s.next_fire_at) FROM x_jobs.schedule AS s WHERE NOT s.paused
    );
END
$$;

-- Tests: tests/pgtap/45-schedules.sql, tests/pgtap/00-schema.sql, tests/pgtap/80-privileges.sql
