-- Helpers shared by the pgTAP files, installed once into the test database by scripts/run-pgtap
-- (schema tap_helpers), before the files run.
CREATE SCHEMA tap_helpers;

-- Runs a statement and answers what it raised (no row when it raised nothing), read with GET
-- STACKED DIAGNOSTICS, so a test can check the DETAIL and HINT that throws_ok does not see.
CREATE FUNCTION tap_helpers.caught(p_sql text)
RETURNS TABLE (err_state text, err_message text, err_detail text, err_hint text)
LANGUAGE plpgsql
AS $$
BEGIN
    EXECUTE p_sql;
EXCEPTION
    WHEN OTHERS THEN
        GET STACKED DIAGNOSTICS
            err_state = RETURNED_SQLSTATE,
            err_message = MESSAGE_TEXT,
            err_detail = PG_EXCEPTION_DETAIL,
            err_hint = PG_EXCEPTION_HINT;
        RETURN NEXT;
END
$$;

-- The id of the job a file tagged. A file that names its jobs by tag keeps them in a temporary
-- table of its own, j (tag, id); the body is checked when it runs, once that table exists.
SET check_function_bodies = off;
CREATE FUNCTION tap_helpers.jid(p_tag text)
RETURNS bigint
LANGUAGE sql
STABLE
AS $$ SELECT j.id FROM pg_temp.j AS j WHERE j.tag = p_tag $$;
RESET check_function_bodies;
