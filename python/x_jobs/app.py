"""The application object: the wiring of a database, its jobs and its outbox.

An :class:`App` knows the database (a DSN, or libpq's environment, and a pool of connections),
the jobs declared with ``@app.job(...)`` (:mod:`x_jobs.jobs`) and its outbox; it checks the
database's version, enqueues and reads results. Enqueueing validates the input against the
handler's type annotation first, so a bad input is refused here with
:class:`~x_jobs.errors.InputInvalid`, never discovered by a worker, and then sends it with
``x_jobs.enqueue_many`` (:mod:`x_jobs.enqueue`): deduplication, defaults and the wake-up all
happen in SQL.

Tenants: ``App(tenant="acme")`` (or ``app.for_tenant("acme")``, a view of an app with the same
declarations and pool) acts for one tenant. Every call it makes runs in a transaction that sets
``x_jobs.tenant`` locally first (``set_config(..., true)``), so the database shows and takes
only that tenant's rows, behind a pooler too (nothing outlives the transaction); its enqueues
are stamped with the tenant, and one that names another is refused here
(:class:`~x_jobs.errors.TenantScopeConflict`). ``App(tenants=True)`` requires every job to say
whose it is (``@app.job(tenant=lambda input: ...)``). ``app.cross_tenant(reason)`` leaves the
scope, for a reason it logs.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from typing import Any, LiteralString, overload

import psycopg
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from x_jobs import enqueue
from x_jobs._conn import connect, pool_kwargs

# Each name imported as itself is re-exported: the job declarations (x_jobs.jobs) and the
# enqueue's statements (x_jobs.enqueue) are importable from here as well.
from x_jobs.enqueue import DB_NOW as DB_NOW  # noqa: PLC0414
from x_jobs.enqueue import ENQUEUE_MANY as ENQUEUE_MANY  # noqa: PLC0414
from x_jobs.errors import (
    CrossTenantReasonMissing,
    JobFailed,
    JobNotFound,
    JobTenantMissing,
    JobUnknown,
    NotInstalled,
    PermissionDenied,
    ResultTimeout,
    TenantInvalid,
    TenantScopeConflict,
    VersionUnsupported,
    translate,
)
from x_jobs.jobs import ENQUEUE_OPTIONS as ENQUEUE_OPTIONS  # noqa: PLC0414
from x_jobs.jobs import Concurrency as Concurrency  # noqa: PLC0414
from x_jobs.jobs import Enqueued as Enqueued  # noqa: PLC0414
from x_jobs.jobs import I as I  # noqa: PLC0414
from x_jobs.jobs import Job as Job  # noqa: PLC0414
from x_jobs.jobs import RateLimit as RateLimit  # noqa: PLC0414
from x_jobs.jobs import Retry as Retry  # noqa: PLC0414
from x_jobs.jobs import Seconds as Seconds  # noqa: PLC0414
from x_jobs.jobs import interval as interval  # noqa: PLC0414
from x_jobs.jobs import seconds as seconds  # noqa: PLC0414
from x_jobs.maintenance import Retention, maintain
from x_jobs.outbox import Outbox
from x_jobs.schedules import Cron, Schedule

logger = logging.getLogger(__name__)

#: The SQL API versions this client speaks to (``x_jobs.version()``): it reads nothing of the
#: tables but through the reader functions (x_jobs.job_detail, job_states, held_jobs, ...),
#: which 0.4.1 brings. An older database is refused with a hint to update it (ALTER EXTENSION
#: x_jobs UPDATE). 0.4.2 adds schedules: on 0.4.1 the worker neither syncs nor ticks them, and
#: refuses to start for an app that declares any (x_jobs.worker._ticker).
SUPPORTED_VERSIONS = frozenset({"0.4.1", "0.4.2"})

RESULT: LiteralString = "SELECT state, output, last_error FROM x_jobs.result(%s)"
PUBLISH: LiteralString = (
    "SELECT event_id, woken FROM x_jobs.publish(event => %s, payload => %s, key => %s)"
)
#: Narrows the transaction to one tenant: transaction-local (``true``), so that a pooled
#: connection handed on to another caller, or a pooler's server connection, keeps nothing of it.
SCOPE: LiteralString = "SELECT pg_catalog.set_config('x_jobs.tenant', %s, true)"
#: The role a scope's calls act for, for cross_tenant's log line.
ROLE: LiteralString = "SELECT current_user::text, session_user::text"
#: The longest tenant id the database stores (X_TENANT_INVALID past it).
TENANT_MAX = 200

NOT_INSTALLED_HINT = (
    "Run CREATE EXTENSION x_jobs (or `x-jobs install` where extensions are not allowed), "
    "then start again."
)


class App:
    """Where the jobs live: a database and the jobs declared on it.

    ``App()`` with no DSN uses ``DATABASE_URL`` when it is set, else libpq's own environment
    (``PGHOST``, ``PGDATABASE``, ...), so a script finds the database the way psql does.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool_size: int = 4,
        tenant: str | None = None,
        tenants: bool = False,
    ) -> None:
        self.dsn = dsn if dsn is not None else os.environ.get("DATABASE_URL", "")
        #: The tenant every call of this app acts for (None: the login's whole scope).
        self.tenant = None if tenant is None else _checked_tenant(tenant)
        #: Every job must say whose it is (``@app.job(tenant=...)``), X_JOB_TENANT_MISSING else.
        self.tenants = bool(tenants)
        self.jobs: dict[str, Job[Any]] = {}
        #: The schedules declared here (``@app.job(schedule=...)``, ``app.schedule``), by name:
        #: what a worker writes at its start (x_jobs.schedules.sync_schedules).
        self.schedules: dict[str, Schedule] = {}
        self._pool_size = pool_size
        #: The pool, shared with the views of for_tenant and cross_tenant (one pool per App()).
        self._pools = _Pool()
        self._result_query: LiteralString | None = None  # once the version is checked
        #: Put messages in the outbox, and register the sinks a relay delivers them to.
        self.outbox = Outbox(self)

    # --- tenants ------------------------------------------------------------------------------

    def for_tenant(self, tenant: str) -> App:
        """A view of this app that acts for ``tenant``: the same declarations, schedules, outbox
        sinks and pool, every call scoped to ``tenant`` (see the module's doc). Cheap: a
        pooled SaaS backend makes one per request."""
        return self._view(_checked_tenant(tenant))

    def cross_tenant(self, reason: str, *, dsn: str | None = None) -> AbstractContextManager[App]:
        """Leave the tenant scope, for a reason: a context manager answering a view of this
        app that sets no tenant, and so sees what its login may see of every tenant (an
        unbound role's: all of them; a bound role is refused by the database as ever). With
        ``dsn=``, through that login instead (an unbound role's, say), on a connection pool of
        its own that closes at the end. ``reason`` is required (X_CROSS_TENANT_REASON_MISSING)
        and logged as a warning with the role the calls act for."""
        return _cross_tenant(self, reason, dsn)

    def _view(self, tenant: str | None) -> App:
        view = copy.copy(self)  # shares jobs, schedules and the pool (by reference)
        view.tenant = tenant
        view.outbox = Outbox(view)
        view.outbox.sinks = self.outbox.sinks
        return view

    def _stamp(self, requests: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """``requests`` stamped with the app's tenant; one that names another is refused."""
        if self.tenant is None:
            return requests
        stamped: list[Mapping[str, Any]] = []
        for req in requests:
            named = req.get("tenant_id")
            if named is None:
                stamped.append({**req, "tenant_id": self.tenant})
                continue
            if named != self.tenant:
                raise TenantScopeConflict(
                    f"X_TENANT_SCOPE_CONFLICT: job {req.get('name')!r} names tenant {named!r}, "
                    f"this app acts for {self.tenant!r}",
                    hint="Enqueue it through app.for_tenant(its tenant), or leave the scope with "
                    "app.cross_tenant(reason); nothing was enqueued.",
                )
            stamped.append(req)
        return stamped

    # --- declarations -------------------------------------------------------------------------

    @overload
    def job(self, fn: Callable[..., Any], /) -> Job[Any]: ...

    @overload
    def job(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 25,
        retry: Retry | None = None,
        timeout: Seconds | None = None,
        concurrency: int | Concurrency | None = None,
        idempotency_key: Callable[[Any], str | None] | None = None,
        tenant: str | Callable[[Any], str] | None = None,
        priority: int = 0,
        keep_done: bool = True,
        schedule: Cron | Sequence[Cron] | None = None,
        rate_limit: RateLimit | None = None,
    ) -> Callable[[Callable[..., Any]], Job[Any]]: ...

    def job(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        max_attempts: int = 25,
        retry: Retry | None = None,
        timeout: Seconds | None = None,
        concurrency: int | Concurrency | None = None,
        idempotency_key: Callable[[Any], str | None] | None = None,
        tenant: str | Callable[[Any], str] | None = None,
        priority: int = 0,
        keep_done: bool = True,
        schedule: Cron | Sequence[Cron] | None = None,
        rate_limit: RateLimit | None = None,
    ) -> Job[Any] | Callable[[Callable[..., Any]], Job[Any]]:
        """Declare a job over a plain function, sync or ``async``:
        ``def handle(input)`` or ``def handle(input, ctx)``. The input's type annotation (a
        pydantic model, a dataclass, a TypedDict (``typing_extensions.TypedDict`` before Python
        3.12: pydantic refuses ``typing``'s), ``dict``...) is what enqueue validates.
        ``keep_done=False``: completing a job deletes its row, so ``result`` cannot read it.

        ``schedule``: a :class:`~x_jobs.Cron`, or several, on which the job is enqueued (see
        :meth:`schedule`). One is named as the job; of several, each is named
        ``JOB@EXPR`` (``JOB@EXPR TZ`` outside UTC), unless its ``Cron(name=...)`` says.

        ``rate_limit``: a :class:`~x_jobs.RateLimit`; every enqueue of the job names its key,
        and a worker's start declares the limit (``x_jobs.set_rate_limit``). Not with
        ``concurrency``."""
        crons = _crons(schedule)
        if rate_limit is not None and not isinstance(rate_limit, RateLimit):
            raise TypeError(f"rate_limit is a RateLimit, not {type(rate_limit).__name__}")
        if rate_limit is not None and concurrency is not None:
            raise TypeError("a job takes a rate_limit or a concurrency limit, not both")

        def declare(handler: Callable[..., Any]) -> Job[Any]:
            job_name = name or f"{handler.__module__}.{handler.__qualname__}"
            if self.tenants and tenant is None:
                raise JobTenantMissing(
                    f"X_JOB_TENANT_MISSING: job {job_name!r} does not say its tenant, and this "
                    "app requires one of every job (App(tenants=True))",
                    hint="Declare it with @app.job(tenant=lambda input: ...), the tenant from "
                    "its input (or a fixed tenant as a str).",
                )
            if job_name in self.jobs:
                raise ValueError(f"a job named {job_name!r} is declared already")
            limit = Concurrency(limit=concurrency) if isinstance(concurrency, int) else concurrency
            declared: Job[Any] = Job(
                app=self,
                name=job_name,
                fn=handler,
                queue=queue,
                max_attempts=max_attempts,
                retry=retry or Retry(),
                timeout=None if timeout is None else seconds(timeout),
                concurrency=limit,
                rate_limit=rate_limit,
                idempotency_key=idempotency_key,
                tenant=tenant,
                priority=priority,
                keep_done=keep_done,
            )
            names = [
                c.name or (job_name if len(crons) == 1 else _schedule_name(job_name, c))
                for c in crons
            ]
            for taken in names:
                self._check_schedule_name(taken)
            if len(set(names)) < len(names):
                raise ValueError(
                    f"job {job_name!r} has two schedules of one name: give each Cron a name="
                )
            self.jobs[job_name] = declared
            for taken, cron in zip(names, crons, strict=True):
                self.schedules[taken] = Schedule(taken, job_name, replace(cron, name=taken))
            return declared

        return declare(fn) if fn is not None else declare

    def lookup(self, name: str) -> Job[Any]:
        try:
            return self.jobs[name]
        except KeyError:
            raise JobUnknown(
                f"X_JOB_UNKNOWN: no job named {name!r} is declared on this app",
                hint=f"Declare it with @app.job(name={name!r}); declared: {sorted(self.jobs)}.",
            ) from None

    def schedule(
        self,
        name: str,
        job: Job[Any] | str,
        cron: str,
        *,
        tz: str = "UTC",
        input: Mapping[str, Any] | None = None,
        catchup: str = "latest",
        catchup_max: int = 100,
        overlap: str = "allow",
        grace: Seconds = 60,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        tenant_id: str | None = None,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        dead_letter: bool | None = None,
        backoff_base: Seconds | None = None,
        backoff_max: Seconds | None = None,
        keep_done: bool | None = None,
    ) -> Schedule:
        """Declare the schedule ``name``: enqueue ``job`` (one of this app's, or the name of a
        job another service runs) at every instant of the cron expression ``cron`` in the IANA
        zone ``tz``, with ``input`` (for the policies, see :class:`~x_jobs.Cron`). One job may
        have several. An enqueue option left None is the job's own, as ``job.enqueue`` sends
        it. A worker writes the app's schedules when it starts; ``x-jobs schedules sync`` does
        from a deploy step. The database checks the expression and the zone then."""
        self._check_schedule_name(name)
        if isinstance(cron, Cron):
            raise TypeError(
                "app.schedule takes the cron expression as a str and its policies as keywords "
                "(a Cron goes to @app.job(schedule=...))"
            )
        job_name = job.name if isinstance(job, Job) else job
        if not isinstance(job_name, str):
            raise TypeError(f"a schedule's job is a Job or a name, not {type(job).__name__}")
        when = Cron(
            cron,
            tz,
            catchup=catchup,
            catchup_max=catchup_max,
            overlap=overlap,
            grace=grace,
            input=input,
            name=name,
        )
        declared = Schedule(
            name,
            job_name,
            when,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            tenant_id=tenant_id,
            concurrency_key=concurrency_key,
            concurrency_limit=concurrency_limit,
            dead_letter=dead_letter,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            keep_done=keep_done,
        )
        self.schedules[name] = declared
        return declared

    def schedule_maintenance(
        self,
        cron: str = "17 * * * *",
        *,
        tz: str = "UTC",
        retention: Retention | None = None,
        batch_size: int = 10_000,
        queue: str = "default",
    ) -> Job[Any]:
        """Run maintenance (``x-jobs maintain``: purge what is past ``retention``, fold old
        counters; :func:`x_jobs.maintenance.maintain`) as a scheduled job, so that a deployment
        needs no cron outside: declares the job ``x_jobs.maintain`` on ``queue`` and the
        schedule ``x_jobs.maintain`` (hourly at minute 17 by default; overlap skip, so that no
        pass starts while one runs). Its handler connects to this app's database, whose login
        needs the x_jobs_admin role (the purges are the operator's): a worker running as
        x_jobs_worker alone fails the job with X_PERMISSION_DENIED."""
        kept = retention or Retention()

        def handler(_input: dict[str, Any]) -> dict[str, Any]:
            with self.connection() as conn:
                done = maintain(conn, kept, batch_size)
            return {"deleted": done.deleted, "counters_folded": done.counters_folded}

        name = "x_jobs.maintain"
        # The operator's job, no tenant's: stamped 'none', the default, on a tenants=True app too.
        job = self.job(name=name, queue=queue, max_attempts=3, tenant="none")(handler)
        self.schedule(name, job, cron, tz=tz, overlap="skip")
        return job

    def _check_schedule_name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"a schedule's name is a str, not {type(name).__name__}")
        if name in self.schedules:
            raise ValueError(f"a schedule named {name!r} is declared already")

    # --- connections --------------------------------------------------------------------------

    @property
    def pool(self) -> ConnectionPool:
        return self._pools.get(self.dsn, self._pool_size)

    @contextmanager
    def connection(
        self, conn: psycopg.Connection[Any] | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """The caller's connection when given (its transaction is the enqueue's), else one of
        the pool's, in autocommit. SQL refusals come out as typed x_jobs errors."""
        try:
            if conn is not None:
                with self.scope(conn) as db:
                    yield db
            else:
                with self.pool.connection() as pooled, self.scope(pooled) as db:
                    yield db
        except PoolTimeout as err:
            # The pool only says that it waited; one connection of its own says why.
            try:
                connect(self.dsn, "x_jobs").close()  # its error without the DSN's password
            except psycopg.Error as reason:
                raise reason from err
            raise
        except (
            psycopg.errors.UndefinedFunction,
            psycopg.errors.UndefinedTable,
            psycopg.errors.InvalidSchemaName,
        ) as err:
            if "x_jobs." not in str(err) and '"x_jobs"' not in str(err):
                raise
            raise NotInstalled(
                f"X_NOT_INSTALLED: x_jobs is not installed in this database ({err})",
                hint=NOT_INSTALLED_HINT,
            ) from err
        except psycopg.errors.InsufficientPrivilege as err:
            raise PermissionDenied.of(err) from err
        except psycopg.Error as err:
            typed = translate(err)
            if typed is err:
                raise
            raise typed from err

    @contextmanager
    def scope(self, db: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        """``db`` with the transaction scoped to the app's tenant (nothing without one). An
        autocommit connection outside a transaction gets one of its own, committed at the end;
        in a transaction already (the caller's), the setting joins it and stays until it ends:
        not a transaction block of psycopg's, which on a connection that is not in autocommit
        and idle would commit the caller's work early."""
        if self.tenant is None:
            yield db
            return
        idle = db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if db.autocommit and idle:
            with db.transaction():
                db.execute(SCOPE, [self.tenant])
                yield db
        else:
            db.execute(SCOPE, [self.tenant])
            yield db

    def close(self) -> None:
        self._pools.close()

    def check_version(self, conn: psycopg.Connection[Any]) -> str:
        """The installed SQL API version, or VersionUnsupported when this client cannot speak
        to it (or finds no x_jobs at all)."""
        try:
            row = conn.execute("SELECT x_jobs.version()").fetchone()
        except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName) as err:
            if not conn.autocommit:
                conn.rollback()
            raise NotInstalled(
                "X_NOT_INSTALLED: x_jobs is not installed in this database", hint=NOT_INSTALLED_HINT
            ) from err
        except psycopg.errors.InsufficientPrivilege as err:
            # A login granted none of the x_jobs roles may not even use the schema.
            if not conn.autocommit:
                conn.rollback()
            raise PermissionDenied.of(err) from err
        version = str(row[0]) if row else "?"
        if version not in SUPPORTED_VERSIONS:
            raise VersionUnsupported(
                f"X_VERSION_UNSUPPORTED: this client speaks x_jobs {sorted(SUPPORTED_VERSIONS)}, "
                f"the database has {version}",
                hint="Upgrade the client, or the database (ALTER EXTENSION x_jobs UPDATE, or "
                "x-jobs install where it was installed that way), so that they match.",
            )
        return version

    # --- enqueue ------------------------------------------------------------------------------

    def enqueue(
        self,
        job: Job[Any] | str,
        input: Any = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> Enqueued:
        """Enqueue one job (validated first). With ``conn=`` it joins the caller's transaction:
        a rollback leaves no job. Options: queue, run_at or delay (seconds), idempotency_key,
        max_attempts, priority, tenant_id, traceparent, enqueued_by, keep_done. A naive run_at
        is read in the database session's TimeZone, as psycopg sends it."""
        return self.enqueue_many(job, [input], conn=conn, **options)[0]

    def enqueue_many(
        self,
        job: Job[Any] | str,
        inputs: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> list[Enqueued]:
        """Enqueue many jobs of one kind in one round trip (``x_jobs.enqueue_many``), in order."""
        declared = self.lookup(job) if isinstance(job, str) else job
        requests = [declared.request(value, **options) for value in inputs]
        return self.enqueue_requests(requests, conn=conn)

    def enqueue_requests(
        self,
        requests: Sequence[Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[Enqueued]:
        """Enqueue prepared requests (``Job.request``), jobs of several kinds mixed."""
        if not requests:
            return []
        requests = self._stamp(requests)
        with self.connection(conn) as db:
            return enqueue.send(db, requests)

    # --- events -------------------------------------------------------------------------------

    def publish(
        self,
        event: str,
        payload: Any = None,
        *,
        key: str | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> Published:
        """Publish an event (``x_jobs.publish``): the waits that match it (``wait_for_event``)
        are done with ``payload`` and their runs are due at once; for a scoped app, only its
        tenant's. With ``conn=`` in the caller's transaction. Answers the event's id and how
        many runs it woke."""
        with self.connection(conn) as db:
            row = db.execute(PUBLISH, [event, Jsonb(payload), key]).fetchone()
        assert row is not None  # publish answers one row or raises
        return Published(event_id=int(row[0]), woken=int(row[1]))

    # --- results ------------------------------------------------------------------------------

    def _read_result(self, db: psycopg.Connection[Any], job_id: int) -> Any:
        """The job's (state, output, last_error), or None, through x_jobs.result; the first
        read checks the version (VersionUnsupported)."""
        if self._result_query is None:
            self.check_version(db)
            self._result_query = RESULT
        return db.execute(self._result_query, [job_id]).fetchone()

    def result(self, job_id: int, *, timeout: Seconds | None = None) -> Any:
        """Wait for the job to settle and answer its output; :class:`JobFailed` when it ended
        dead, failed or cancelled (its last error attached), :class:`ResultTimeout` when it is
        still live after ``timeout`` (None: wait for as long as it takes).

        It polls the row, from 20 ms between reads up to 1 s (settling sends no notification);
        a pooled connection is held only for each read."""
        deadline = None if timeout is None else time.monotonic() + seconds(timeout)
        pause = 0.02
        while True:
            with self.connection() as db:
                row = self._read_result(db, job_id)
            if row is None:
                raise JobNotFound(
                    f"X_JOB_NOT_FOUND: no job has id {job_id}",
                    hint="Check the id; finished jobs are removed by purge after their retention, "
                    "and that of a job declared keep_done=False when it completes.",
                )
            state, output, error = row
            if state == "done":
                return output
            if state in {"dead", "failed", "cancelled"}:
                raise JobFailed(job_id, state, error)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:  # read at or after the deadline: it is live now
                    raise ResultTimeout(
                        f"X_RESULT_TIMEOUT: job {job_id} is still {state} "
                        f"after {seconds(timeout or 0):g} s",
                        hint="Wait longer, or look at the job with `x-jobs jobs show`.",
                    )
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


@dataclass(frozen=True)
class Published:
    """What ``app.publish`` answered: the event's id, and how many suspended runs it woke."""

    event_id: int
    woken: int


class _Pool:
    """An app's connection pool, made on first use; shared by the views of one App."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None

    def get(self, dsn: str, size: int) -> ConnectionPool:
        with self._lock:
            if self._pool is None:
                self._pool = ConnectionPool(
                    dsn,
                    min_size=1,
                    max_size=size,
                    kwargs=pool_kwargs(dsn, "x_jobs"),
                    open=True,
                    name="x_jobs",
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


def _checked_tenant(tenant: object) -> str:
    """A tenant id as the database stores it: a str of 1 to 200 characters."""
    if not isinstance(tenant, str):
        raise TypeError(f"a tenant is a str, not {type(tenant).__name__}")
    if not tenant or len(tenant) > TENANT_MAX:
        raise TenantInvalid(
            f"X_TENANT_INVALID: tenant {tenant[:64]!r} is {len(tenant)} characters",
            hint=f"Name the tenant in 1 to {TENANT_MAX} characters.",
        )
    return tenant


@contextmanager
def _cross_tenant(app: App, reason: str, dsn: str | None) -> Iterator[App]:
    """App.cross_tenant (see there)."""
    if not isinstance(reason, str) or not reason.strip():
        raise CrossTenantReasonMissing(
            f"X_CROSS_TENANT_REASON_MISSING: leaving the tenant scope needs a reason, got "
            f"{reason!r}",
            hint="Say why this code must see other tenants' jobs: cross_tenant('support ticket "
            "4711: copy the export'); the reason is logged.",
        )
    view = app._view(None)
    if dsn is not None:
        view.dsn = dsn
        view._pools = _Pool()
    try:
        with view.connection() as db:
            row = db.execute(ROLE).fetchone()
        role, login = (str(row[0]), str(row[1])) if row else ("?", "?")
        logger.warning(
            "leaving the tenant scope: %s",
            reason,
            extra={"reason": reason, "role": role, "login": login, "tenant": app.tenant},
        )
        yield view
    finally:
        if dsn is not None:
            view.close()


def _crons(schedule: Cron | Sequence[Cron] | None) -> list[Cron]:
    """``@app.job``'s ``schedule`` as a list, each checked to be a Cron."""
    crons = [] if schedule is None else [schedule] if isinstance(schedule, Cron) else list(schedule)
    for cron in crons:
        if not isinstance(cron, Cron):
            raise TypeError(f"schedule takes x_jobs.Cron values, not {type(cron).__name__}")
    return crons


def _schedule_name(job: str, cron: Cron) -> str:
    """The name of one of a job's several schedules: ``JOB@EXPR``, and the zone outside UTC."""
    return f"{job}@{cron.expr}" if cron.tz == "UTC" else f"{job}@{cron.expr} {cron.tz}"
