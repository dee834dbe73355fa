------------------------------------------------------------------------------------------------
-- Cron: reading an expression, and the instants it fires at in a time zone
------------------------------------------------------------------------------------------------

-- The values one field of a cron expression allows, sorted, or a refusal naming the field:
-- comma-separated terms, each '*', a value, or a range 'a-b', optionally stepped ('*/15',
-- '10-40/10', and '5/15' from 5 to the field's end). p_names spell the values from p_min up
-- (JAN for 1, SUN for 0), in any case. Day-of-week takes 7 for Sunday, as 0 (cron's two
-- spellings), so its ranges and a stepped lone value run up to 7 ('1/2': MON, WED, FRI, SUN).
-- A range of one value stepped ('5-5/2') is that value, as Vixie cron reads it.
CREATE FUNCTION x_jobs._cron_field(
    p_cron text, p_field text, p_text text, p_min integer, p_max integer, p_names text[],
    p_example text
)
RETURNS integer[]
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_top integer := p_max + (p_field = 'day-of-week')::integer;  -- the highest value taken
    v_term text;
    v_parts text[];
    v_bounds text[];
    v_low integer;
    v_high integer;
    v_step integer;
    v_values integer[] := ARRAY[]::integer[];
    v_value text;
    v_problem text;
    v_number integer;
BEGIN
    FOREACH v_term IN ARRAY pg_catalog.string_to_array(p_text, ',') LOOP
        v_problem := NULL;
        v_step := 1;
        v_parts := pg_catalog.string_to_array(v_term, '/');
        IF pg_catalog.cardinality(v_parts) > 2 OR v_term = '' THEN
            v_problem := 'is not a value, a range or a step';
        ELSIF pg_catalog.cardinality(v_parts) = 2 THEN
            -- Matched before the cast, so the cast cannot fail.
            IF v_parts[2] !~ '^[0-9]{1,4}$' OR v_parts[2]::integer < 1 OR v_parts[2]::integer > p_max - p_min + 1 THEN
                v_problem := pg_catalog.format('has step %L, not a whole number from 1 to %s',
                    v_parts[2], p_max - p_min + 1);
            ELSE
                v_step := v_parts[2]::integer;
            END IF;
        END IF;
        IF v_problem IS NULL THEN
            IF v_parts[1] = '*' THEN
                v_low := p_min;
                v_high := p_max;
            ELSE
                v_bounds := pg_catalog.string_to_array(v_parts[1], '-');
                IF pg_catalog.cardinality(v_bounds) > 2 OR '' = ANY (v_bounds) THEN
                    v_problem := 'is not a value, a range or a step';
                END IF;
                FOR i IN 1..least(pg_catalog.cardinality(v_bounds), 2) LOOP
                    EXIT WHEN v_problem IS NOT NULL;
                    v_value := v_bounds[i];
                    IF v_value ~ '^[0-9]+$' THEN
                        -- Past 9 digits, a number no field takes (and no cast to overflow).
                        v_number := CASE WHEN pg_catalog.length(pg_catalog.ltrim(v_value, '0')) <= 9
                            THEN v_value::integer ELSE 2147483647 END;
                    ELSIF pg_catalog.array_position(p_names, pg_catalog.upper(v_value)) IS NOT NULL THEN
                        v_number := p_min + pg_catalog.array_position(p_names, pg_catalog.upper(v_value)) - 1;
                    ELSE
                        v_problem := pg_catalog.format('has %L, which is not a value', v_value);
                        EXIT;
                    END IF;
                    IF v_number < p_min OR v_number > v_top THEN
                        v_problem := pg_catalog.format('has %s, outside %s-%s', v_value, p_min, v_top);
                    ELSIF i = 1 THEN
                        v_low := v_number;
                    ELSE
                        v_high := v_number;
                    END IF;
                END LOOP;
                IF v_problem IS NULL AND pg_catalog.cardinality(v_bounds) = 1 THEN
                    -- A lone value with a step runs to the field's end ('5/15': 5, 20, 35, 50).
                    v_high := CASE WHEN pg_catalog.cardinality(v_parts) = 2 THEN v_top ELSE v_low END;
                END IF;
                IF v_problem IS NULL AND v_low > v_high THEN
                    v_problem := pg_catalog.format('has the range %s, which runs backwards', v_parts[1]);
                END IF;
            END IF;
        END IF;
        IF v_problem IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = 'XJ043',
                MESSAGE = pg_catalog.format('X_CRON_INVALID: cron %L: the %s field %L %s',
                    p_cron, p_field, p_text, v_problem),
                HINT = pg_catalog.format('The %s field takes %s-%s%s, such as %s.', p_field, p_min, v_top,
                    CASE WHEN p_names IS NULL THEN ''
                         ELSE pg_catalog.format(' or %s-%s', p_names[1], p_names[pg_catalog.cardinality(p_names)])
                    END,
                    p_example);
        END IF;
        v_values := v_values || ARRAY(SELECT pg_catalog.generate_series(v_low, v_high, v_step));
    END LOOP;
    RETURN ARRAY(
        SELECT DISTINCT CASE WHEN p_field = 'day-of-week' THEN v.v % 7 ELSE v.v END
        FROM unnest(v_values) AS v (v) ORDER BY 1
    );
END
$$;

-- Read a cron expression: five fields (minute, hour, day of month, month, day of week) or one of
-- @hourly, @daily (@midnight), @weekly, @monthly, @yearly (@annually). Refused, with XJ043 and
-- the field named: a wrong number of fields, a bad term, and a day that no month has.
CREATE FUNCTION x_jobs._cron_parse(p_cron text)
RETURNS x_jobs.cron_fields
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_text text := pg_catalog.btrim(coalesce(p_cron, ''), E' \t\n\r');
    v_parts text[];
    v_fields x_jobs.cron_fields;
    v_hint text := 'Write five fields, minute hour day-of-month month day-of-week, such as '
        '''*/15 9-17 * * MON-FRI'' or ''30 2 1 * *'', or one of @hourly, @daily, @weekly, '
        '@monthly, @yearly.';
BEGIN
    v_text := CASE pg_catalog.lower(v_text)
        WHEN '@hourly' THEN '0 * * * *'
        WHEN '@daily' THEN '0 0 * * *'
        WHEN '@midnight' THEN '0 0 * * *'
        WHEN '@weekly' THEN '0 0 * * 0'
        WHEN '@monthly' THEN '0 0 1 * *'
        WHEN '@yearly' THEN '0 0 1 1 *'
        WHEN '@annually' THEN '0 0 1 1 *'
        ELSE v_text
    END;
    IF v_text LIKE '@%' THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ043',
            MESSAGE = pg_catalog.format('X_CRON_INVALID: cron %L is not a schedule x_jobs knows', p_cron),
            HINT = v_hint;
    END IF;
    v_parts := pg_catalog.regexp_split_to_array(v_text, '\s+');
    IF v_text = '' OR pg_catalog.cardinality(v_parts) <> 5 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ043',
            MESSAGE = pg_catalog.format('X_CRON_INVALID: cron %s has %s fields, not 5',
                coalesce(pg_catalog.quote_literal(p_cron), 'NULL'),
                CASE WHEN v_text = '' THEN 0 ELSE pg_catalog.cardinality(v_parts) END),
            DETAIL = CASE WHEN v_text <> '' AND pg_catalog.cardinality(v_parts) = 6
                THEN 'x_jobs fires at whole minutes: it takes no seconds field.'
                ELSE 'The fields are separated by spaces.' END,
            HINT = v_hint;
    END IF;
    v_fields.minutes := x_jobs._cron_field(p_cron, 'minute', v_parts[1], 0, 59, NULL,
        '0, */15, 0,30 or 10-50/20');
    v_fields.hours := x_jobs._cron_field(p_cron, 'hour', v_parts[2], 0, 23, NULL,
        '9, 9-17, */6 or 8,12,18');
    v_fields.days := x_jobs._cron_field(p_cron, 'day-of-month', v_parts[3], 1, 31, NULL,
        '1, 1,15, 10-20 or */2');
    v_fields.months := x_jobs._cron_field(p_cron, 'month', v_parts[4], 1, 12,
        ARRAY['JAN', 'FEB', 'MAR', 'APR', 'MAY', 'JUN', 'JUL', 'AUG', 'SEP', 'OCT', 'NOV', 'DEC'],
        '1, JAN-MAR, */3 or JUN,DEC');
    v_fields.weekdays := x_jobs._cron_field(p_cron, 'day-of-week', v_parts[5], 0, 6,
        ARRAY['SUN', 'MON', 'TUE', 'WED', 'THU', 'FRI', 'SAT'],
        'MON-FRI, 1-5, SAT,SUN or 0 (Sunday, as 7)');
    -- Vixie cron: when either day field starts with '*', both must match (the starred one
    -- matches every day it allows); when both are restricted, either one matching will do.
    v_fields.day_and := v_parts[3] LIKE '*%' OR v_parts[5] LIKE '*%';
    v_fields.fixed := v_parts[1] NOT LIKE '*%' AND v_parts[2] NOT LIKE '*%';
    -- Days that only months outside the field have ('30 2' is never): a schedule that would
    -- never fire. With both day fields restricted the weekdays still fire.
    IF v_fields.day_and AND v_parts[3] NOT LIKE '*%' AND v_fields.days[1] > (
        SELECT max(CASE m WHEN 2 THEN 29 WHEN 4 THEN 30 WHEN 6 THEN 30 WHEN 9 THEN 30 WHEN 11 THEN 30 ELSE 31 END)
        FROM unnest(v_fields.months) AS m
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ043',
            MESSAGE = pg_catalog.format('X_CRON_INVALID: cron %L never fires: no month of its month field has day %s',
                p_cron, v_fields.days[1]),
            HINT = 'Pick days that the months have (February has 29 at most, April, June, September and '
                'November 30), such as ''0 0 28 2 *''.';
    END IF;
    RETURN v_fields;
END
$$;

-- The first wall-clock minute after p_local that the fields match, or NULL when there is none
-- in the next 30 years. Walks field by field, from the month down, so that a step skips what
-- cannot match (the rest of a month, a day, an hour) rather than trying each minute. The first
-- value of a field at or after x is values[width_bucket(x - 1, values) + 1]: width_bucket counts
-- the values below x by a binary search of the sorted array (NULL past the last), in C.
CREATE FUNCTION x_jobs._cron_match_after(p_fields x_jobs.cron_fields, p_local timestamp)
RETURNS timestamp
LANGUAGE plpgsql
IMMUTABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_t timestamp := pg_catalog.date_trunc('minute', p_local) + interval '1 minute';
    v_year integer := pg_catalog.date_part('year', v_t)::integer;
    v_month integer := pg_catalog.date_part('month', v_t)::integer;
    v_day integer := pg_catalog.date_part('day', v_t)::integer;
    v_hour integer := pg_catalog.date_part('hour', v_t)::integer;
    v_minute integer := pg_catalog.date_part('minute', v_t)::integer;
    v_last_year integer := v_year + 30;
    v_minutes integer[] := p_fields.minutes;
    v_hours integer[] := p_fields.hours;
    v_days integer[] := p_fields.days;
    v_months integer[] := p_fields.months;
    v_weekdays integer[] := p_fields.weekdays;
    -- The days alone decide: both fields must match and every weekday does.
    v_days_only boolean := p_fields.day_and AND pg_catalog.cardinality(p_fields.weekdays) = 7;
    v_day_and boolean := p_fields.day_and;
    v_month_days integer;
    v_dow integer;
    v_next integer;
BEGIN
    LOOP
        IF v_month > 12 THEN
            v_year := v_year + 1;
            v_month := 1;
        END IF;
        IF v_year > v_last_year OR v_year > 9999 THEN
            RETURN NULL;
        END IF;
        v_next := v_months[pg_catalog.width_bucket(v_month - 1, v_months) + 1];
        IF v_next IS NULL THEN
            v_year := v_year + 1;
            v_month := v_months[1];
            v_day := 1;
            v_hour := 0;
            v_minute := 0;
            CONTINUE;
        ELSIF v_next > v_month THEN
            v_month := v_next;
            v_day := 1;
            v_hour := 0;
            v_minute := 0;
        END IF;
        v_month_days := pg_catalog.date_part('day',
            pg_catalog.make_date(v_year, v_month, 1) + interval '1 month - 1 day')::integer;
        IF v_days_only THEN
            v_next := v_days[pg_catalog.width_bucket(v_day - 1, v_days) + 1];
        ELSE
            -- Day by day, the weekday advancing with the day: AND, or Vixie's OR.
            v_next := v_day;
            v_dow := pg_catalog.date_part('dow', pg_catalog.make_date(v_year, v_month, v_day))::integer;
            WHILE v_next <= v_month_days LOOP
                EXIT WHEN CASE
                    WHEN v_day_and THEN v_next = ANY (v_days) AND v_dow = ANY (v_weekdays)
                    ELSE v_next = ANY (v_days) OR v_dow = ANY (v_weekdays)
                END;
                v_next := v_next + 1;
                v_dow := (v_dow + 1) % 7;
            END LOOP;
        END IF;
        IF v_next IS NULL OR v_next > v_month_days THEN
            v_month := v_month + 1;
            v_day := 1;
            v_hour := 0;
            v_minute := 0;
            CONTINUE;
        ELSIF v_next > v_day THEN
            v_day := v_next;
            v_hour := 0;
            v_minute := 0;
        END IF;
        v_next := v_hours[pg_catalog.width_bucket(v_hour - 1, v_hours) + 1];
        IF v_next IS NULL THEN
            v_day := v_day + 1;
            v_hour := 0;
            v_minute := 0;
            IF v_day > v_month_days THEN
                v_month := v_month + 1;
                v_day := 1;
            END IF;
            CONTINUE;
        ELSIF v_next > v_hour THEN
            v_hour := v_next;
            v_minute := 0;
        END IF;
        v_next := v_minutes[pg_catalog.width_bucket(v_minute - 1, v_minutes) + 1];
        IF v_next IS NULL THEN
            v_hour := v_hour + 1;
            v_minute := 0;
            IF v_hour > 23 THEN
                v_hour := 0;
                v_day := v_day + 1;
                IF v_day > v_month_days THEN
                    v_month := v_month + 1;
                    v_day := 1;
                END IF;
            END IF;
            CONTINUE;
        END IF;
        RETURN pg_catalog.make_timestamp(v_year, v_month, v_day, v_hour, v_next, 0);
    END LOOP;
END
$$;

-- The first instant from which the session's time zone has another UTC offset than at p_low,
-- found between p_low and p_high (which has that other offset) to the second: a change of
-- offset (daylight saving time, a zone's new rule) is on a whole second.
CREATE FUNCTION x_jobs._zone_change(p_low timestamptz, p_high timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_low bigint := pg_catalog.floor(pg_catalog.date_part('epoch', p_low))::bigint;
    v_high bigint := pg_catalog.ceil(pg_catalog.date_part('epoch', p_high))::bigint;
    v_offset interval := p_low::timestamp - (p_low AT TIME ZONE 'UTC');
    v_mid bigint;
    v_at timestamptz;
BEGIN
    WHILE v_high - v_low > 1 LOOP
        v_mid := (v_low + v_high) / 2;
        v_at := pg_catalog.to_timestamp(v_mid);
        IF v_at::timestamp - (v_at AT TIME ZONE 'UTC') = v_offset THEN
            v_low := v_mid;
        ELSE
            v_high := v_mid;
        END IF;
    END LOOP;
    RETURN pg_catalog.to_timestamp(v_high);
END
$$;

-- The first instant after p_after at which a schedule of p_fields in time zone p_tz fires (NULL:
-- none in 30 years). The fields match the wall clock of p_tz; where its UTC offset changes,
-- Vixie cron's rule: a fixed schedule (see x_jobs.cron_fields) fires once, at the first valid
-- instant after a time the clock skips, and only at the first occurrence of a time it repeats;
-- any other schedule fires at the instants whose local time matches, twice in a repeated hour
-- and never in a skipped one.
-- The session's TimeZone is the zone while this runs (the SET clause restores the caller's):
-- `AT TIME ZONE 'CET'` would read 'CET' as the abbreviation, one fixed offset all year, where
-- the zone CET has summer time.
CREATE FUNCTION x_jobs._cron_next(p_fields x_jobs.cron_fields, p_tz text, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
AS $$
DECLARE
    v_start timestamp;
    v_later timestamptz := p_after + interval '1 day';
    v_local timestamp;
    v_as_utc timestamptz;
    v_one timestamptz;
    v_other timestamptz;
    v_early timestamptz;
    v_late timestamptz;
    v_early_ok boolean;
    v_late_ok boolean;
    v_best timestamptz;
    v_change timestamptz;
BEGIN
    IF p_after IS NULL THEN
        RETURN NULL;
    END IF;
    IF p_tz <> 'UTC' THEN
        PERFORM pg_catalog.set_config('TimeZone', p_tz, TRUE);
    END IF;
    v_start := p_after::timestamp;
    -- The clock goes back within a day: the wall-clock times it repeats come again after
    -- p_after, so the search starts where the repeat does (the earlier of the two).
    IF v_later::timestamp - (v_later AT TIME ZONE 'UTC') < v_start - (p_after AT TIME ZONE 'UTC') THEN
        v_change := x_jobs._zone_change(p_after, v_later);
        v_start := least(v_start, v_change::timestamp - interval '1 minute');
    END IF;
    LOOP
        v_local := x_jobs._cron_match_after(p_fields, v_start);
        EXIT WHEN v_local IS NULL;
        -- The instants that show v_local: with the offsets of a day before and a day after it,
        -- each kept if it does show v_local. None: the clock skips it; two: it repeats it.
        v_as_utc := v_local AT TIME ZONE 'UTC';
        v_one := v_as_utc - ((v_as_utc - interval '1 day')::timestamp - ((v_as_utc - interval '1 day') AT TIME ZONE 'UTC'));
        v_other := v_as_utc - ((v_as_utc + interval '1 day')::timestamp - ((v_as_utc + interval '1 day') AT TIME ZONE 'UTC'));
        v_early := least(v_one, v_other);
        v_late := greatest(v_one, v_other);
        v_early_ok := v_early::timestamp = v_local;
        v_late_ok := v_late::timestamp = v_local;
        IF NOT v_early_ok AND NOT v_late_ok THEN
            -- Skipped: a fixed schedule fires when the clock jumps, the first valid instant.
            IF p_fields.fixed THEN
                v_change := x_jobs._zone_change(v_early, v_late);
                IF v_change > p_after THEN
                    RETURN least(v_best, v_change);
                END IF;
            END IF;
        ELSIF v_early_ok AND v_late_ok AND v_early <> v_late THEN
            -- Repeated: the first occurrence, if still to come, is the answer (every second
            -- occurrence is later). A schedule that is not fixed fires at the second too: keep
            -- it, and look on through the repeat for a first occurrence after p_after.
            IF v_early > p_after THEN
                RETURN least(v_best, v_early);
            END IF;
            IF NOT p_fields.fixed AND v_late > p_after THEN
                v_best := least(v_best, v_late);
            END IF;
        ELSE
            v_early := CASE WHEN v_early_ok THEN v_early ELSE v_late END;
            IF v_early > p_after THEN
                RETURN least(v_best, v_early);
            END IF;
        END IF;
        v_start := v_local;
    END LOOP;
    RETURN v_best;
END
$$;

-- The last instant in (p_after, p_until] at which the schedule fires, or NULL: how far a
-- schedule that missed instants has come. It looks back from p_until over growing windows, so
-- that it steps over the instants of the smallest window that holds one, not over all of them
-- since p_after (two weeks of a schedule every minute are 20,160).
CREATE FUNCTION x_jobs._cron_last(
    p_fields x_jobs.cron_fields, p_tz text, p_after timestamptz, p_until timestamptz
)
RETURNS timestamptz
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_window interval;
    v_from timestamptz;
    v_found timestamptz;
    v_next timestamptz;
BEGIN
    FOREACH v_window IN ARRAY ARRAY[
        interval '1 minute', interval '1 hour', interval '1 day', interval '32 days',
        interval '367 days', interval '31 years'
    ] LOOP
        v_from := greatest(p_after, p_until - v_window);
        v_found := x_jobs._cron_next(p_fields, p_tz, v_from);
        IF v_found <= p_until THEN
            LOOP
                v_next := x_jobs._cron_next(p_fields, p_tz, v_found);
                EXIT WHEN v_next IS NULL OR v_next > p_until;
                v_found := v_next;
            END LOOP;
            RETURN v_found;
        END IF;
        EXIT WHEN v_from = p_after;
    END LOOP;
    RETURN NULL;
END
$$;

-- p_tz as the name of a time zone in the IANA database, spelled as the database spells it
-- ('europe/berlin' is Europe/Berlin), or XJ046. POSIX zone strings are refused: 'UTC+3' means
-- three hours west of Greenwich, a classic trap; Etc/GMT-3 is the zone three hours east.
-- PostgreSQL reads a text it has no zone file for as a POSIX string where it can (an offset in
-- hours, 'GMT+3', even 'Europe/Berlin+1'), and answers it in capitals or as '<+03>-03'; a zone
-- file comes back named as the database spells it. Few zones have a digit in their name
-- (Etc/GMT-14 to Etc/GMT+12, GMT0 and the four US zones of 1970s rules): a name with a digit is
-- taken only as one of those, spelled as their files are.
CREATE FUNCTION x_jobs._require_time_zone(p_tz text)
RETURNS text
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
SET "TimeZone" = 'UTC'
AS $$
DECLARE
    v_name text;
BEGIN
    IF p_tz <> '' AND pg_catalog.length(p_tz) <= 100 THEN
        BEGIN
            -- A setting of this function's only (its SET clause restores the caller's).
            v_name := pg_catalog.set_config('TimeZone', p_tz, TRUE);
        EXCEPTION WHEN invalid_parameter_value THEN
            v_name := NULL;
        END;
    END IF;
    IF v_name ~ '[0-9]'
        AND v_name !~ '^(posix/)?(Etc/GMT[+-]?[0-9]{1,2}|Etc/GMT0|GMT[+-]?0|GMT0|CST6CDT|EST5EDT|MST7MDT|PST8PDT)$'
        OR pg_catalog.lower(v_name) = 'localtime'
    THEN
        v_name := NULL;
    END IF;
    IF v_name IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ046',
            MESSAGE = pg_catalog.format('X_TIME_ZONE_INVALID: %s is not a time zone name',
                coalesce(pg_catalog.quote_literal(pg_catalog.left(p_tz, 110)), 'NULL')),
            HINT = 'Name a zone of the IANA database, such as ''Europe/Berlin'', ''America/New_York'' or '
                '''UTC'' (SELECT name FROM pg_timezone_names); for a fixed offset, ''Etc/GMT-3'' is '
                'UTC+3.';
    END IF;
    RETURN v_name;
END
$$;

-- The next `count` instants (1 to 1000) after `after` (default: now) at which cron expression
-- `cron` fires in time zone `tz`: what a schedule would do, without one. Refusals as
-- set_schedule's: XJ043 for the expression, XJ046 for the zone.
CREATE FUNCTION x_jobs.cron_next(
    cron text,
    tz text DEFAULT 'UTC',
    after timestamptz DEFAULT NULL,
    count integer DEFAULT 1
)
RETURNS TABLE (fire_at timestamptz)
LANGUAGE plpgsql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields x_jobs.cron_fields := x_jobs._cron_parse(cron_next.cron);
    v_tz text := x_jobs._require_time_zone(cron_next.tz);
    v_at timestamptz := coalesce(cron_next.after, x_jobs.now());
BEGIN
    IF cron_next.count IS NULL OR cron_next.count < 1 OR cron_next.count > 1000 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'XJ013',
            MESSAGE = pg_catalog.format('X_QTY_INVALID: count %s is outside 1..1000',
                coalesce(cron_next.count::text, 'NULL')),
            HINT = 'Ask for 1 to 1000 instants at a time; pass the last one as after for more.';
    END IF;
    FOR i IN 1..cron_next.count LOOP
        v_at := x_jobs._cron_next(v_fields, v_tz, v_at);
        EXIT WHEN v_at IS NULL;
        fire_at := v_at;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Tests: tests/pgtap/44-cron.sql, tests/python/test_cron_oracle.py
