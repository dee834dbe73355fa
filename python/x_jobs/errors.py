"""Typed exceptions for the refusals of the x_jobs SQL API.

Every refusal raised by an ``x_jobs.*`` function carries a stable SQLSTATE (class ``XJ``, or
``40001`` for a race the caller should retry) and a message that starts with its ``X_`` code.
:func:`translate` turns such a :class:`psycopg.Error` into the matching exception below, keeping
the original as ``__cause__``; anything else is returned unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

import psycopg

logger = logging.getLogger(__name__)


class XJobsError(Exception):
    """Base of every x_jobs error. ``code`` is the stable ``X_...`` name."""

    code: str = "X_UNKNOWN"
    sqlstate: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class InvalidArgument(XJobsError):
    """A call's argument breaks a rule of the API; the hint says which value works."""


class NameInvalid(InvalidArgument):
    code, sqlstate = "X_NAME_INVALID", "XJ001"


class QueueInvalid(InvalidArgument):
    code, sqlstate = "X_QUEUE_INVALID", "XJ002"


class PayloadTooLarge(InvalidArgument):
    code, sqlstate = "X_PAYLOAD_TOO_LARGE", "XJ003"


class MaxAttemptsInvalid(InvalidArgument):
    code, sqlstate = "X_MAX_ATTEMPTS_INVALID", "XJ004"


class PriorityInvalid(InvalidArgument):
    code, sqlstate = "X_PRIORITY_INVALID", "XJ005"


class TenantInvalid(InvalidArgument):
    code, sqlstate = "X_TENANT_INVALID", "XJ006"


class ConcurrencyInvalid(InvalidArgument):
    code, sqlstate = "X_CONCURRENCY_INVALID", "XJ007"


class BackoffInvalid(InvalidArgument):
    code, sqlstate = "X_BACKOFF_INVALID", "XJ008"


class JobsInvalid(InvalidArgument):
    code, sqlstate = "X_JOBS_INVALID", "XJ009"


class QueuesInvalid(InvalidArgument):
    code, sqlstate = "X_QUEUES_INVALID", "XJ010"


class WorkerInvalid(InvalidArgument):
    code, sqlstate = "X_WORKER_INVALID", "XJ011"


class LeaseInvalid(InvalidArgument):
    code, sqlstate = "X_LEASE_INVALID", "XJ012"


class QtyInvalid(InvalidArgument):
    code, sqlstate = "X_QTY_INVALID", "XJ013"


class JobNotFound(XJobsError):
    code, sqlstate = "X_JOB_NOT_FOUND", "XJ014"


class JobNotRetryable(XJobsError):
    code, sqlstate = "X_JOB_NOT_RETRYABLE", "XJ015"


class StateUnknown(InvalidArgument):
    code, sqlstate = "X_STATE_UNKNOWN", "XJ016"


class IdempotencyConflict(XJobsError):
    code, sqlstate = "X_IDEMPOTENCY_CONFLICT", "XJ017"


class DelayInvalid(InvalidArgument):
    code, sqlstate = "X_DELAY_INVALID", "XJ018"


class TtlInvalid(InvalidArgument):
    code, sqlstate = "X_TTL_INVALID", "XJ019"


class RetentionInvalid(InvalidArgument):
    code, sqlstate = "X_RETENTION_INVALID", "XJ020"


class OutputsInvalid(InvalidArgument):
    code, sqlstate = "X_OUTPUTS_INVALID", "XJ021"


class IsolationUnsupported(XJobsError):
    code, sqlstate = "X_ISOLATION_UNSUPPORTED", "XJ022"


class ErrorMissing(InvalidArgument):
    code, sqlstate = "X_ERROR_MISSING", "XJ023"


class StepInvalid(InvalidArgument):
    code, sqlstate = "X_STEP_INVALID", "XJ024"


class TimeoutInvalid(InvalidArgument):
    code, sqlstate = "X_TIMEOUT_INVALID", "XJ025"


class JobNotHeld(XJobsError):
    """A step call for a job this worker no longer holds (cancelled, or its lease lapsed and
    another worker took it): the body should stop."""

    code, sqlstate = "X_JOB_NOT_HELD", "XJ026"


class StepConflict(InvalidArgument):
    code, sqlstate = "X_STEP_CONFLICT", "XJ027"


class EventInvalid(InvalidArgument):
    code, sqlstate = "X_EVENT_INVALID", "XJ028"


class MatchInvalid(InvalidArgument):
    code, sqlstate = "X_MATCH_INVALID", "XJ029"


class JobHeld(XJobsError):
    code, sqlstate = "X_JOB_HELD", "XJ030"


class StepNotFound(XJobsError):
    code, sqlstate = "X_STEP_NOT_FOUND", "XJ031"


class StepNotWaiting(XJobsError):
    code, sqlstate = "X_STEP_NOT_WAITING", "XJ032"


class ProgressInvalid(InvalidArgument):
    code, sqlstate = "X_PROGRESS_INVALID", "XJ033"


class TopicInvalid(InvalidArgument):
    code, sqlstate = "X_TOPIC_INVALID", "XJ034"


class MessageInvalid(InvalidArgument):
    code, sqlstate = "X_MESSAGE_INVALID", "XJ035"


class RelayInvalid(InvalidArgument):
    code, sqlstate = "X_RELAY_INVALID", "XJ036"


class WebhookInvalid(InvalidArgument):
    code, sqlstate = "X_WEBHOOK_INVALID", "XJ037"


class TimeInvalid(InvalidArgument):
    """A run_at or retry_at that is infinite or outside the years 1 to 9999 (UTC)."""

    code, sqlstate = "X_TIME_INVALID", "XJ039"


class ClockRefused(XJobsError):
    """``x_jobs.fake_now`` (the test clock) is set in a session that is not a superuser's."""

    code, sqlstate = "X_CLOCK_REFUSED", "XJ038"


class SettingInvalid(XJobsError):
    """``x_jobs.max_payload_bytes`` is set to something other than a whole number of bytes.

    Not an :class:`InvalidArgument`: the deployment's setting is wrong, not the call, so what
    refuses a call's values for good (a relay's job, a webhook's 4xx) retries this one instead."""

    code, sqlstate = "X_SETTING_INVALID", "XJ040"


class RoleUnsafe(XJobsError):
    """An install or update found an x_jobs role with more than x_jobs's rights (a login, an
    attribute, a membership outside the chain; x_jobs_owner: a member), which it would grant to
    the installer or let own the objects. Nothing was changed."""

    code, sqlstate = "X_ROLE_UNSAFE", "XJ041"


class RolesMissing(XJobsError):
    """``x-jobs install`` by a role that may not create or link the missing x_jobs roles; the
    hint lists the statements an administrator runs first. Nothing was changed."""

    code, sqlstate = "X_ROLES_MISSING", "XJ042"


class StateNotAllowed(InvalidArgument):
    """cancel_jobs was asked for a state that is not live, retry_jobs for one that is not dead,
    failed or cancelled: a state the call can change nothing of."""

    code, sqlstate = "X_STATE_NOT_ALLOWED", "XJ044"


class RangeEmpty(InvalidArgument):
    """cancel_jobs or retry_jobs got a created_after at or after its created_before."""

    code, sqlstate = "X_RANGE_EMPTY", "XJ045"


class MaxAgeInvalid(InvalidArgument):
    """A ``queue_gauges`` max_age that is missing, negative, or longer than a day."""

    code, sqlstate = "X_MAX_AGE_INVALID", "XJ051"


class WorkerNotYours(XJobsError):
    """A claim or announce with a worker id that another login claimed or announced with first:
    an id belongs to one login (the fence), so that no other can act on the runs it holds. Give
    each worker process an id of its own."""

    code, sqlstate = "X_WORKER_NOT_YOURS", "XJ052"


class AttemptsInvalid(InvalidArgument):
    """A settle, heartbeat, release or hand-back got a list of attempts that does not pair with
    its ids (one attempt per id, in the same order)."""

    code, sqlstate = "X_ATTEMPTS_INVALID", "XJ053"


class CronInvalid(InvalidArgument):
    """A cron expression x_jobs cannot read: a wrong number of fields, a bad term, a value out of
    its field's range, or a day no month of it has. The message names the field."""

    code, sqlstate = "X_CRON_INVALID", "XJ043"


class TimeZoneInvalid(InvalidArgument):
    """A time zone that is not the name of a zone of the IANA database (``Europe/Berlin``);
    POSIX strings such as ``UTC+3`` are refused too."""

    code, sqlstate = "X_TIME_ZONE_INVALID", "XJ046"


class ScheduleInvalid(InvalidArgument):
    """``set_schedule`` got a bad name, an input that is not an object (or holds ``_schedule``),
    or a catchup, catchup_max, overlap or grace out of range."""

    code, sqlstate = "X_SCHEDULE_INVALID", "XJ049"


class ScheduleNotFound(XJobsError):
    """No schedule has the name a call was given."""

    code, sqlstate = "X_SCHEDULE_NOT_FOUND", "XJ050"


class DeclarationsInvalid(InvalidArgument):
    """``x_jobs.declare_jobs`` got something other than an array of declaration objects."""

    code, sqlstate = "X_DECLARATIONS_INVALID", "XJ047"


class JobTimeoutInvalid(InvalidArgument):
    """A declared job timeout is not above zero, or longer than 1000 years."""

    code, sqlstate = "X_JOB_TIMEOUT_INVALID", "XJ048"


class RoleUnknown(InvalidArgument):
    """``bind_tenant`` or ``unbind_tenant`` named a role that does not exist."""

    code, sqlstate = "X_ROLE_UNKNOWN", "XJ058"


class TenantNotBound(XJobsError):
    """The role a call acts for and its login are bound to tenants they do not share, so the
    call acts for no tenant and may write no tenant row."""

    code, sqlstate = "X_TENANT_NOT_BOUND", "XJ059"


class TenantOutOfScope(XJobsError):
    """A bound role named a tenant it is not bound to, as ``tenant_id`` or in the
    ``x_jobs.tenant`` setting."""

    code, sqlstate = "X_TENANT_OUT_OF_SCOPE", "XJ060"


class TenantAmbiguous(XJobsError):
    """A role bound to several tenants wrote a row naming none, with ``x_jobs.tenant`` unset."""

    code, sqlstate = "X_TENANT_AMBIGUOUS", "XJ061"


class CrossTenant(XJobsError):
    """A bound role filtered by a tenant outside its scope, or paused, resumed or set the policy
    of a queue (an act on every tenant's jobs of it)."""

    code, sqlstate = "X_CROSS_TENANT", "XJ062"


class RateLimitInvalid(InvalidArgument):
    """A rate limit key is empty or longer than 400 characters, max_starts is below 1, or per is
    not a positive interval up to 366 days."""

    code, sqlstate = "X_RATE_LIMIT_INVALID", "XJ063"


class RateLimitUnknown(XJobsError):
    """No rate limit has the key: an enqueue or a declaration named a key that
    ``x_jobs.set_rate_limit`` never declared, or ``drop_rate_limit`` a key without a limit."""

    code, sqlstate = "X_RATE_LIMIT_UNKNOWN", "XJ064"


class RateLimitConflict(InvalidArgument):
    """A job named both a rate_limit_key and a concurrency_key."""

    code, sqlstate = "X_RATE_LIMIT_CONFLICT", "XJ065"


class QueuePolicyInvalid(InvalidArgument):
    """``set_queue_policy`` got weights that are not a JSON object of tenant ids (1 to 200
    characters) to whole numbers of rows a turn from 1 to 1000."""

    code, sqlstate = "X_QUEUE_POLICY_INVALID", "XJ066"


class StreamInvalid(InvalidArgument):
    """A stream name is missing, empty or longer than 200 characters, an entry's key longer than
    400, an entry has no payload, or ``stream_append_many`` got something other than an array of
    objects of a payload and a key."""

    code, sqlstate = "X_STREAM_INVALID", "XJ067"


class PositionInvalid(InvalidArgument):
    """``stream_read`` got an ``after`` that is not a position it answered (``xid/id``)."""

    code, sqlstate = "X_POSITION_INVALID", "XJ068"


class CursorInvalid(InvalidArgument):
    """``save_cursor`` got no consumer name (or one over 200 characters), no key (or one over
    400), or no cursor."""

    code, sqlstate = "X_CURSOR_INVALID", "XJ069"


class EnqueueRace(XJobsError):
    """The call lost a race it cannot settle by itself; calling it again succeeds."""

    code, sqlstate = "X_ENQUEUE_RACE", "40001"


class ClientError(XJobsError):
    """A refusal of the Python client itself, before anything reaches the database."""


class InputInvalid(ClientError, InvalidArgument):
    """An input does not validate against the job's input type; nothing was enqueued."""

    code = "X_INPUT_INVALID"


class JobUnknown(ClientError):
    """A job name that no ``@app.job`` declared."""

    code = "X_JOB_UNKNOWN"


class VersionUnsupported(ClientError):
    """The database has no x_jobs, or a version this client cannot speak to."""

    code = "X_VERSION_UNSUPPORTED"


class NotInstalled(VersionUnsupported):
    """The database has no x_jobs schema at all."""

    code = "X_NOT_INSTALLED"


class OutputInvalid(ClientError):
    """A handler returned something that is not JSON."""

    code = "X_OUTPUT_INVALID"


class JobFailed(ClientError):
    """``app.result``: the job ended without an output (dead, failed or cancelled)."""

    code = "X_JOB_FAILED"

    def __init__(self, job_id: int, state: str, error: str | None) -> None:
        super().__init__(
            f"X_JOB_FAILED: job {job_id} ended {state}" + (f": {error}" if error else ""),
            hint="See its attempts and errors with `x-jobs jobs show ID`; "
            "`x-jobs jobs retry ID` runs it again.",
        )
        self.job_id = job_id
        self.state = state
        self.error = error


class ResultTimeout(ClientError, TimeoutError):
    """``app.result``: the job was still live when the timeout came."""

    code = "X_RESULT_TIMEOUT"


class TenantScopeConflict(ClientError, InvalidArgument):
    """A call of an app scoped to one tenant (``App(tenant=...)``, ``app.for_tenant``, a
    handler's ``ctx.enqueue``) names another tenant: nothing was sent. The database refuses the
    same for a bound role (X_TENANT_OUT_OF_SCOPE); the client says it before the round trip."""

    code = "X_TENANT_SCOPE_CONFLICT"


class JobTenantMissing(ClientError, InvalidArgument):
    """``@app.job`` on an ``App(tenants=True)`` without ``tenant=``: every job of such an app
    says whose it is, so that none is stamped the default tenant 'none' by omission."""

    code = "X_JOB_TENANT_MISSING"


class CrossTenantReasonMissing(ClientError, InvalidArgument):
    """``cross_tenant(reason)`` without a reason (empty or blank): leaving a tenant's scope is an
    act someone answers for, and its log line says why."""

    code = "X_CROSS_TENANT_REASON_MISSING"


#: What each of the three roles is for (docs/roles.md); the hint of a refused privilege.
PRIVILEGE_HINT = (
    "Grant this login the x_jobs role for the call: x_jobs_producer to enqueue, read results "
    "and write the outbox; x_jobs_worker to claim and settle jobs and relay the outbox; "
    "x_jobs_admin to operate (list, retry, cancel, pause, purge); x_jobs_webhook to receive "
    "webhooks (x_jobs.webhooks.Receiver)."
)


class PermissionDenied(XJobsError):
    """PostgreSQL refused the login a privilege the call needs (SQLSTATE 42501): it is not
    granted the x_jobs role for what it does. Its ``__cause__`` is the database's error."""

    code = "X_PERMISSION_DENIED"

    @classmethod
    def of(cls, err: psycopg.errors.InsufficientPrivilege) -> PermissionDenied:
        typed = cls(
            f"X_PERMISSION_DENIED: {err.diag.message_primary or str(err).strip()}",
            hint=err.diag.message_hint or PRIVILEGE_HINT,
        )
        typed.__cause__ = err
        typed.sqlstate = err.sqlstate  # the database's own, so the class is no x_jobs refusal
        return typed


# --- the client's own exceptions, raised by the modules named -------------------------------
# Each is re-exported from the module that raises it (x_jobs.worker, x_jobs.steps,
# x_jobs.outbox, x_jobs.install, x_jobs.metrics), where callers may import it.


class JobCancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()`` once the job was cancelled, timed out or lost."""


class PermanentError(Exception):
    """Raise it (or a subclass) from a handler to fail the job for good, with no retry."""


class StepTimeout(XJobsError):
    """``wait_for_event`` gave up: no matching event came before its timeout. Replayed as the
    same error, so a handler that catches it takes the same path on every run."""

    code = "X_STEP_TIMEOUT"


class Suspended(BaseException):
    """The run is suspended in SQL (a sleep, a wait): the handler unwinds and nothing is settled.

    A BaseException, so that a handler's ``except Exception`` does not swallow it."""


class DeliveryError(Exception):
    """A sink's failure. ``retryable=False`` sends the message to dead at once (kept for
    ``x-jobs outbox redrive``); ``retry_at`` asks for the next attempt no sooner than then
    (an HTTP Retry-After, say); else the outbox's backoff applies."""

    def __init__(
        self, message: str, *, retryable: bool = True, retry_at: datetime | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_at = retry_at


class MetricsPortUnavailable(ClientError):
    """The metrics host and port could not be bound (another process listens there, or the host
    is no address of this machine)."""

    code = "X_METRICS_PORT_UNAVAILABLE"


class InstallRefused(ClientError):
    """``x-jobs install`` will not run against this database; nothing was changed."""

    code = "X_INSTALL_REFUSED"


class ExtensionPresent(InstallRefused):
    """The database has x_jobs as an extension: ALTER EXTENSION updates it, not install."""

    code = "X_EXTENSION_PRESENT"


class SchemaConflict(InstallRefused):
    """A schema named x_jobs exists, but holds no x_jobs version to start from."""

    code = "X_SCHEMA_CONFLICT"


class RequirementMissing(InstallRefused):
    """An extension the control file requires (plpgsql) is not in the database."""

    code = "X_REQUIREMENT_MISSING"


class UpgradePathMissing(InstallRefused):
    """No chain of upgrade scripts leads from the installed version to the newest."""

    code = "X_UPGRADE_PATH_MISSING"


class InstallFailed(ClientError):
    """A script failed, or recorded another version than its own; the transaction rolled back."""

    code = "X_INSTALL_FAILED"


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: it refuses NUL, which an exception's message may
    hold, and no encoding takes a lone surrogate (what ``surrogateescape`` decoding leaves in a
    str): both escaped. A refused error text would leave its job or message unsettled."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def ascii_only(text: str) -> str:
    """``text`` with everything past ASCII escaped: what a database whose encoding cannot hold
    a character (LATIN1 and the euro sign) still stores."""
    return storable(text).encode("ascii", "backslashreplace").decode("ascii")


@contextmanager
def unstorable_as(cls: type[XJobsError], what: str, hint: str) -> Iterator[None]:
    """A value Python's JSON takes and jsonb refuses (NaN, infinity, a NUL character), raised by
    the database as a DataError, comes out as the refusal ``cls`` naming ``what``. Translated
    where the database says so: the common path checks nothing."""
    try:
        yield
    except psycopg.errors.DataError as err:
        why = (
            "it holds a NUL character (\\u0000)"
            if isinstance(err, psycopg.errors.UntranslatableCharacter)
            else (err.diag.message_primary or str(err))
        )
        raise cls(
            f"{cls.code}: {what} is not JSON that PostgreSQL can store: {why}", hint=hint
        ) from err


def _subclasses(cls: type[XJobsError]) -> list[type[XJobsError]]:
    found: list[type[XJobsError]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


#: Every concrete error by its ``X_`` code; the tests hold it equal to ``x_jobs.error_codes()``.
BY_CODE: dict[str, type[XJobsError]] = {
    cls.code: cls for cls in _subclasses(XJobsError) if cls.sqlstate is not None
}


def translate(err: psycopg.Error) -> XJobsError | psycopg.Error:
    """The typed x_jobs error for ``err``, or ``err`` itself when it is no x_jobs refusal.

    The ``X_`` code at the head of the message decides, so that two refusals sharing a standard
    SQLSTATE (``40001``) still map to their own class.
    """
    message = err.diag.message_primary or str(err)
    code = message.split(":", 1)[0]
    cls = BY_CODE.get(code)
    if cls is None or cls.sqlstate != err.sqlstate:
        return err
    typed = cls(message, hint=err.diag.message_hint, detail=err.diag.message_detail)
    typed.__cause__ = err
    return typed


@contextmanager
def typed_refusals() -> Iterator[None]:
    """Inside, an x_jobs refusal is raised as its typed error and a refused privilege as
    :class:`PermissionDenied`, each from the database's error; anything else as it is. For the
    calls on a caller's connection, which App.connection does not wrap."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as err:
        raise PermissionDenied.of(err) from err
    except psycopg.Error as err:
        typed = translate(err)
        if typed is err:
            raise
        raise typed from err


# The command line's errors


class DatabaseError(XJobsError):
    """Any other error the database answered a command with (a statement timeout, a read-only
    transaction): X_DATABASE_ERROR, carrying PostgreSQL's SQLSTATE, so that --json never prints
    a code of null."""

    code = "X_DATABASE_ERROR"

    @classmethod
    def of(cls, err: psycopg.Error) -> DatabaseError:
        said = err.diag.message_primary or first_line(str(err))
        state = f" (SQLSTATE {err.sqlstate})" if err.sqlstate else ""
        typed = cls(f"X_DATABASE_ERROR: {said}{state}", hint=err.diag.message_hint)
        typed.__cause__ = err
        typed.sqlstate = err.sqlstate
        return typed


class MessageNotFound(ClientError):
    """No outbox message has the id an outbox command was given."""

    code = "X_MESSAGE_NOT_FOUND"


def first_line(text: str) -> str:
    """The first line of ``text`` that is not blank, stripped (``text`` when it has none): an
    error is one line on the command line's stderr."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else text
