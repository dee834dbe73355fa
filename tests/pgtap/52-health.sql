-- x_jobs.health(): one row per check of the installation, each ok or with what is wrong and the
-- fix; and the role helpers the scripts run (_setup_roles, _adopt, _role_problems). Roles belong
-- to the whole server: every change here (a revoked link, an attribute) is rolled back with the
-- file's transaction.
BEGIN;
SELECT plan(25);

CREATE ROLE t52_owner LOGIN;
CREATE ROLE t52_stranger LOGIN;

------------------------------------------------------------------------------------------------
-- A fresh install holds every check
------------------------------------------------------------------------------------------------

SELECT results_eq(
    $$ SELECT h.check_name, h.ok, h.hint FROM x_jobs.health() AS h $$,
    $$
    VALUES
        ('version', TRUE, NULL::text),
        ('roles', TRUE, NULL),
        ('function_owner', TRUE, NULL),
        ('restart_grace', TRUE, NULL)
    $$,
    'A fresh install should hold every check of health(), in this order, with no fix to make'
);

SELECT is(
    (
        SELECT h.detail FROM x_jobs.health() AS h
        WHERE h.check_name = 'version'
    ),
    pg_catalog.format(
        'x_jobs %s, the extension owned by %I', x_jobs.version(),
        (
            SELECT pg_catalog.pg_get_userbyid(e.extowner) FROM pg_catalog.pg_extension AS e
            WHERE e.extname = 'x_jobs'
        )
    ),
    'health() should name the installed version and the extension''s owner'
);

SELECT is(
    (
        SELECT h.detail FROM x_jobs.health() AS h
        WHERE h.check_name = 'restart_grace'
    ),
    'claim runs as x_jobs_owner, which may read the WAL writer''s start: the restart grace counts from when the '
    'server last began to take connections',
    'health() should say the restart grace may read the WAL writer''s start, as x_jobs_owner'
);

SELECT is_empty(
    $$ SELECT * FROM x_jobs._role_problems() $$,
    'The roles a fresh install made should carry nothing beyond x_jobs''s rights'
);

------------------------------------------------------------------------------------------------
-- The restart grace without pg_read_all_stats
------------------------------------------------------------------------------------------------

REVOKE pg_read_all_stats FROM x_jobs_owner;

SELECT row_eq(
    $$ SELECT h.ok, h.hint FROM x_jobs.health() AS h WHERE h.check_name = 'restart_grace' $$,
    row(FALSE, 'An administrator runs: GRANT pg_read_all_stats TO x_jobs_owner;'::text),
    'Without pg_read_all_stats for the owner, health() should fail the restart grace and name the grant'
);

SELECT matches(
    (
        SELECT h.detail FROM x_jobs.health() AS h
        WHERE h.check_name = 'restart_grace'
    ),
    '^claim runs as x_jobs_owner, which may not read other sessions'' start times \(pg_read_all_stats\): the '
    'restart grace counts from the postmaster''s start instead',
    'health() should say that the grace then counts from the postmaster''s start'
);

SELECT is(
    (
        SELECT h.ok FROM x_jobs.health() AS h
        WHERE h.check_name = 'roles'
    ),
    TRUE,
    'The missing pg_read_all_stats should fail the restart grace only, not the roles'
);

-- What claim then sees: no WAL writer, so the postmaster's start stands in.
SET LOCAL ROLE x_jobs_owner;
SELECT is(
    x_jobs._ready_since(),
    pg_catalog.pg_postmaster_start_time(),
    'Without pg_read_all_stats, the owner should see no WAL writer, and the grace count from the postmaster''s start'
);
RESET ROLE;

GRANT pg_read_all_stats TO x_jobs_owner;

SELECT is(
    (
        SELECT h.ok FROM x_jobs.health() AS h
        WHERE h.check_name = 'restart_grace'
    ),
    TRUE,
    'Granted pg_read_all_stats again, the owner should pass the restart grace check'
);

------------------------------------------------------------------------------------------------
-- Roles unlinked or carrying more than x_jobs's rights
------------------------------------------------------------------------------------------------

REVOKE x_jobs_producer FROM x_jobs_worker;

SELECT row_eq(
    $$ SELECT h.ok, h.detail, h.hint FROM x_jobs.health() AS h WHERE h.check_name = 'roles' $$,
    row(
        FALSE, 'the x_jobs roles are missing or unlinked'::text,
        'An administrator runs: GRANT x_jobs_producer TO x_jobs_worker;'::text
    ),
    'An unlinked worker role should fail the roles check, with the GRANT that links it'
);

GRANT x_jobs_producer TO x_jobs_worker;
ALTER ROLE x_jobs_admin LOGIN;
GRANT pg_monitor TO x_jobs_admin;

SELECT set_eq(
    $$ SELECT p.role_name::text, p.problem FROM x_jobs._role_problems() AS p $$,
    $$ VALUES ('x_jobs_admin', 'can log in'), ('x_jobs_admin', 'is a member of pg_monitor') $$,
    '_role_problems() should list a login and a membership outside the chain'
);

SELECT row_eq(
    $$ SELECT h.ok, h.detail FROM x_jobs.health() AS h WHERE h.check_name = 'roles' $$,
    row(FALSE, 'x_jobs_admin can log in, x_jobs_admin is a member of pg_monitor'::text),
    'health() should fail the roles check with each problem'
);

ALTER ROLE x_jobs_admin NOLOGIN;
REVOKE pg_monitor FROM x_jobs_admin;
GRANT x_jobs_owner TO t52_stranger;

SELECT set_eq(
    $$ SELECT p.role_name::text, p.problem FROM x_jobs._role_problems() AS p $$,
    $$ VALUES ('x_jobs_owner', 'has the member t52_stranger') $$,
    '_role_problems() should list a member of x_jobs_owner, which owns the x_jobs objects of every database'
);

-- A script run by a superuser refuses to hand objects to an x_jobs_owner someone may become.
SELECT throws_ok(
    $$ SELECT x_jobs._setup_roles() $$,
    'XJ041',
    'X_ROLE_UNSAFE: x_jobs will not use roles with more than its rights: x_jobs_owner has the member t52_stranger',
    'An install or update should refuse an x_jobs_owner that has a member'
);

REVOKE x_jobs_owner FROM t52_stranger;

SELECT lives_ok(
    $$ SELECT x_jobs._setup_roles() $$,
    'An install or update should accept the roles as x_jobs made them, and change nothing'
);

------------------------------------------------------------------------------------------------
-- A caller that may not create or link the roles
------------------------------------------------------------------------------------------------

REVOKE x_jobs_worker FROM x_jobs_admin;
GRANT USAGE ON SCHEMA x_jobs TO t52_owner;
GRANT EXECUTE ON FUNCTION x_jobs._setup_roles(), x_jobs._role_problems(), x_jobs._adopt() TO t52_owner;

SET LOCAL ROLE t52_owner;
SELECT throws_ok(
    $$ SELECT x_jobs._setup_roles() $$,
    'XJ042',
    'X_ROLES_MISSING: role t52_owner may not create or link the x_jobs roles',
    'A caller that may not link the roles should be refused'
);
RESET ROLE;

-- The hint lists what an administrator runs. The installer is the extension's owner, a superuser
-- here, so nothing is to be granted to it: only the link is missing.
CREATE FUNCTION pg_temp.hint_of(p_sql text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    v_hint text;
BEGIN
    EXECUTE p_sql;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS v_hint = PG_EXCEPTION_HINT;
    RETURN v_hint;
END
$fn$;

SET LOCAL ROLE t52_owner;
SELECT is(
    pg_temp.hint_of('SELECT x_jobs._setup_roles()'),
    'An administrator runs first: GRANT x_jobs_worker TO x_jobs_admin; then install again.',
    'The refusal should name the statement an administrator runs first'
);
RESET ROLE;

SELECT lives_ok(
    $$ SELECT x_jobs._setup_roles() $$,
    'A superuser should link the roles itself'
);

SELECT is(
    (
        SELECT h.ok FROM x_jobs.health() AS h
        WHERE h.check_name = 'roles'
    ),
    TRUE,
    'Linked again by _setup_roles(), the roles should pass the check'
);


------------------------------------------------------------------------------------------------
-- Ownership
------------------------------------------------------------------------------------------------

ALTER FUNCTION x_jobs.claim(text[], text, interval, integer) OWNER TO t52_owner;

SELECT row_eq(
    $$ SELECT h.ok, h.detail FROM x_jobs.health() AS h WHERE h.check_name = 'function_owner' $$,
    row(FALSE, 'the functions that run as their owner run as t52_owner, x_jobs_owner'::text),
    'Functions that run as their owner with two owners should fail the function_owner check'
);

SELECT row_eq(
    $$ SELECT h.ok, h.hint FROM x_jobs.health() AS h WHERE h.check_name = 'restart_grace' $$,
    row(FALSE, 'An administrator runs: GRANT pg_read_all_stats TO t52_owner;'::text),
    'The restart grace check should name the owner that may not read the WAL writer''s start'
);

SET LOCAL ROLE t52_owner;
SELECT x_jobs._adopt();
RESET ROLE;

SELECT is(
    (
        SELECT pg_catalog.pg_get_userbyid(p.proowner)::text FROM pg_catalog.pg_proc AS p
        WHERE p.oid = 'x_jobs.claim(text[], text, interval, integer)'::regprocedure
    ),
    't52_owner',
    '_adopt() run by a role that is not a superuser should change no owner'
);

SELECT lives_ok(
    $$ SELECT x_jobs._adopt() $$,
    '_adopt() should run for a superuser'
);

SELECT is(
    (
        SELECT pg_catalog.pg_get_userbyid(p.proowner)::text FROM pg_catalog.pg_proc AS p
        WHERE p.oid = 'x_jobs.claim(text[], text, interval, integer)'::regprocedure
    ),
    'x_jobs_owner',
    '_adopt() should hand a function back to x_jobs_owner'
);

SELECT is(
    (
        SELECT pg_catalog.count(*)::integer FROM x_jobs.health() AS h
        WHERE NOT h.ok
    ),
    0,
    'After _adopt() every check of health() should hold again'
);

SELECT * FROM finish();
ROLLBACK;
