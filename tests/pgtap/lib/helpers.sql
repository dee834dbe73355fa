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
