------------------------------------------------------------------------------------------------
-- Health
------------------------------------------------------------------------------------------------

-- What a deployment should fix about this installation, one row per check: its name, whether it
-- holds, what was found, and the fix (NULL when it holds). Workers log the failing checks when
-- they start, and `x-jobs install` prints them. Catalog reads only, no x_jobs table, so it is
-- cheap and a monitor may call it. It runs as the caller: every catalog it reads is open to
-- every role, and pg_has_role(owner, 'pg_read_all_stats', 'USAGE') is the very rule by which
-- pg_stat_activity shows other sessions' start times to claim's owner, so the caller needs no
-- right to see them itself.
--
--   version         the installed version, and how: an extension (and whose) or x-jobs install;
--                   fails when the extension's recorded version and x_jobs.version() differ.
--   roles           x_jobs_producer < x_jobs_worker < x_jobs_admin and x_jobs_webhook exist, the
--                   first three linked, and no x_jobs role has more than x_jobs made it with
--                   (x_jobs._role_problems).
--   function_owner  the functions that run as their owner have one owner: x_jobs_owner, or the
--                   role that ran `x-jobs install` without being a superuser.
--   restart_grace   that owner may read the WAL writer's start (pg_read_all_stats). If not,
--                   claim's restart grace counts from the postmaster's start (x_jobs._ready_since),
--                   which can be long before a crash recovery ended: the first claims after it
--                   may take jobs whose workers had no time to renew their leases.
CREATE FUNCTION x_jobs.health()
RETURNS TABLE (check_name text, ok boolean, detail text, hint text)
LANGUAGE sql
STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH ext AS (
        SELECT e.extversion, pg_catalog.pg_get_userbyid(e.extowner) AS owner
        FROM pg_catalog.pg_extension AS e
        WHERE e.extname = 'x_jobs'
    ),
    definer AS (
        SELECT
            pg_catalog.array_agg(o.owner ORDER BY o.owner) AS owners,
            pg_catalog.string_agg(pg_catalog.quote_ident(o.owner), ', ' ORDER BY o.owner) AS named
        FROM (
            SELECT DISTINCT pg_catalog.pg_get_userbyid(p.proowner)::text AS owner
            FROM pg_catalog.pg_proc AS p
            WHERE p.pronamespace = 'x_jobs'::regnamespace AND p.prosecdef
        ) AS o
    ),
    blind AS (
        SELECT
            pg_catalog.array_agg(o.owner ORDER BY o.owner) AS owners,
            pg_catalog.string_agg(pg_catalog.quote_ident(o.owner), ', ' ORDER BY o.owner) AS named
        FROM definer AS d
        CROSS JOIN LATERAL pg_catalog.unnest(d.owners) AS o (owner)
        WHERE NOT pg_catalog.pg_has_role(o.owner::name, 'pg_read_all_stats', 'USAGE')
    ),
    missing AS (
        SELECT pg_catalog.array_agg(m.statement ORDER BY m.n) AS statements
        FROM (
            SELECT g.n, pg_catalog.format('CREATE ROLE %I NOLOGIN', g.role_name) AS statement
            FROM pg_catalog.unnest(ARRAY['x_jobs_producer', 'x_jobs_worker', 'x_jobs_admin', 'x_jobs_webhook']::name [])
                WITH ORDINALITY AS g (role_name, n)
            WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.rolname = g.role_name)
            UNION ALL
            SELECT l.n, pg_catalog.format('GRANT %I TO %I', l.granted, l.member)
            FROM (
                VALUES
                    (5, 'x_jobs_producer'::name, 'x_jobs_worker'::name),
                    (6, 'x_jobs_worker'::name, 'x_jobs_admin'::name)
            ) AS l (n, granted, member)
            WHERE NOT EXISTS (
                SELECT FROM pg_catalog.pg_auth_members AS a
                JOIN pg_catalog.pg_roles AS g ON g.oid = a.roleid
                JOIN pg_catalog.pg_roles AS u ON u.oid = a.member
                WHERE g.rolname = l.granted AND u.rolname = l.member
            )
        ) AS m
    ),
    unsafe AS (
        SELECT pg_catalog.string_agg(pg_catalog.format('%I %s', p.role_name, p.problem), ', ') AS problems
        FROM x_jobs._role_problems() AS p
    )
    -- In this order, whatever plan the UNION gets.
    SELECT c.check_name, c.ok, c.detail, c.hint
    FROM (
        SELECT
            1,
            'version',
            e.extversion IS NULL OR e.extversion = x_jobs.version(),
            CASE
                WHEN NOT EXISTS (SELECT FROM ext) THEN
                    pg_catalog.format('x_jobs %s, installed by x-jobs install (no extension)', x_jobs.version())
                WHEN e.extversion = x_jobs.version() THEN
                    pg_catalog.format('x_jobs %s, the extension owned by %I', x_jobs.version(), e.owner)
                ELSE pg_catalog.format('the extension says x_jobs %s, its functions say %s', e.extversion, x_jobs.version())
            END,
            CASE WHEN e.extversion <> x_jobs.version() THEN 'Run ALTER EXTENSION x_jobs UPDATE.' END
        FROM (SELECT) AS one
        LEFT JOIN ext AS e ON TRUE
        UNION ALL
        SELECT
            2,
            'roles',
            m.statements IS NULL AND u.problems IS NULL,
            CASE
                WHEN m.statements IS NULL AND u.problems IS NULL THEN
                    'x_jobs_producer, x_jobs_worker and x_jobs_admin exist, each a member of the one before, '
                    'and x_jobs_webhook'
                ELSE pg_catalog.concat_ws('; ',
                    CASE WHEN m.statements IS NOT NULL THEN 'the x_jobs roles are missing or unlinked' END,
                    u.problems)
            END,
            NULLIF(pg_catalog.concat_ws(' ',
                CASE WHEN m.statements IS NOT NULL THEN
                    pg_catalog.format('An administrator runs: %s;', pg_catalog.array_to_string(m.statements, '; '))
                END,
                CASE WHEN u.problems IS NOT NULL THEN
                    'An administrator makes each x_jobs role NOLOGIN with no other attribute and a member of none but '
                    'the x_jobs role below it (x_jobs_owner: of pg_read_all_stats), grants x_jobs_owner to nobody, '
                    'and grants other rights to the logins instead.'
                END
            ), '')
        FROM missing AS m, unsafe AS u
        UNION ALL
        SELECT
            3,
            'function_owner',
            pg_catalog.cardinality(d.owners) = 1,
            pg_catalog.format('the functions that run as their owner run as %s', d.named),
            CASE WHEN pg_catalog.cardinality(d.owners) <> 1 THEN
                'A superuser runs: SELECT x_jobs._adopt(); (it hands every x_jobs object to x_jobs_owner)'
            END
        FROM definer AS d
        UNION ALL
        SELECT
            4,
            'restart_grace',
            b.owners IS NULL,
            CASE
                WHEN b.owners IS NULL THEN
                    pg_catalog.format('claim runs as %s, which may read the WAL writer''s start: the restart grace '
                        'counts from when the server last began to take connections', d.named)
                ELSE pg_catalog.format('claim runs as %s, which may not read other sessions'' start times '
                    '(pg_read_all_stats): the restart grace counts from the postmaster''s start instead, and after a '
                    'crash recovery a claim may take jobs whose workers had no time to renew their leases', b.named)
            END,
            CASE WHEN b.owners IS NOT NULL THEN
                pg_catalog.format('An administrator runs: GRANT pg_read_all_stats TO %s;', b.named)
            END
        FROM definer AS d, blind AS b
    ) AS c (n, check_name, ok, detail, hint)
    ORDER BY c.n
$$;

-- Tests: tests/pgtap/52-health.sql, tests/python/test_nonsuperuser_install.py,
--        tests/python/test_failover.py
