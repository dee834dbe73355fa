"""What a job declares: :class:`Job` (its handler, input type and options), how a failed
attempt is retried (:class:`Retry`) and how many run at once (:class:`Concurrency`), the request
each enqueue of it sends (``Job.request``), and what an enqueue answers (:class:`Enqueued`).

A job knows its App only as :class:`JobsApp`, the little that jobs, the outbox's sinks and the
webhook receiver call on it: a protocol, so that none of them imports x_jobs.app, which makes the
outbox (x_jobs.app.App is the one implementation).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

import psycopg
from pydantic import SecretBytes, SecretStr, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from x_jobs.errors import InputInvalid

logger = logging.getLogger(__name__)

I = TypeVar("I")  # noqa: E741 - the input type, as in Job[I]

Seconds = float | int | timedelta


def seconds(value: Seconds) -> float:
    """A duration given as seconds (a number) or a ``timedelta``, in seconds."""
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def interval(value: Seconds | None) -> timedelta | None:
    """A duration as the ``timedelta`` psycopg sends as an SQL interval."""
    return None if value is None else timedelta(seconds=seconds(value))


@dataclass(frozen=True)
class Retry:
    """How a failed attempt is retried: ``x_jobs.fail`` waits ``min(max, base * 2^(n-1))`` with
    jitter. ``dead_letter=False`` settles a job that runs out of attempts as ``failed`` instead of
    keeping it as ``dead``."""

    base: Seconds = 1.0
    max: Seconds = 3600.0
    dead_letter: bool = True


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` jobs of one key run at once; the others wait unclaimed. ``key`` derives
    the key from the input; without it the key is the job's name (a limit for the whole job)."""

    limit: int = 1
    key: Callable[[Any], str] | None = None


@dataclass(frozen=True)
class RateLimit:
    """At most ``max`` starts (claims) of the jobs naming ``key`` in each window of ``per``
    seconds (fixed windows, aligned to the epoch: see ``x_jobs.set_rate_limit``); the others wait
    unclaimed. ``key`` is any text (a tenant, an API's name): jobs of several types may share it.
    Declaring a job with one (``@app.job(rate_limit=...)``) sets the limit when a worker starts
    and gives every enqueue of the job the key."""

    key: str
    max: int
    per: Seconds = 60.0


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue answered: the row, and whether a live row with the same idempotency key
    answered instead of a new one."""

    id: int
    run_id: str
    deduped: bool


@dataclass
class Job(Generic[I]):
    """A declared job: its handler and the options every enqueue of it carries."""

    app: JobsApp
    name: str
    fn: Callable[..., Any]
    queue: str = "default"
    max_attempts: int = 25
    retry: Retry = field(default_factory=Retry)
    timeout: float | None = None
    concurrency: Concurrency | None = None
    rate_limit: RateLimit | None = None
    idempotency_key: Callable[[I], str | None] | None = None
    tenant: str | Callable[[I], str] | None = None
    priority: int = 0
    #: False: completing the job deletes its row (no output, steps or errors kept), for jobs
    #: whose result nobody reads. Half the database's work of keeping it as ``done``.
    keep_done: bool = True

    def __post_init__(self) -> None:
        params = list(inspect.signature(self.fn).parameters.values())
        if not params or len(params) > 2:
            raise TypeError(
                f"job {self.name!r}: the handler takes (input) or (input, ctx), "
                f"not {len(params)} parameters"
            )
        self.takes_ctx = len(params) == 2
        self.is_async = inspect.iscoroutinefunction(self.fn)
        annotation = params[0].annotation
        if isinstance(annotation, str):
            # `from __future__ import annotations`: resolve in the handler's own module. The
            # input's annotation only: ctx's and the return's may name what the module imports
            # under TYPE_CHECKING alone (as linters arrange it), and are never needed.
            annotation = eval(annotation, getattr(inspect.unwrap(self.fn), "__globals__", {}))
        self.input_type: Any = Any if annotation is inspect.Parameter.empty else annotation
        self.adapter: TypeAdapter[Any] = TypeAdapter(self.input_type)

    def validate(self, value: Any) -> Any:
        """The handler's input from a JSON value already parsed."""
        return self.adapter.validate_python(value)

    def validate_json(self, text: str | bytes) -> Any:
        """The handler's input from the JSON text of the row's input, parsed and validated in
        one step."""
        return self.adapter.validate_json(text)

    def dump(self, value: Any) -> Any:
        """Validate an input and answer it as the JSON the worker validates again, refusing
        with InputInvalid a bad one, and one that JSON would not carry to the handler as it is.
        By alias, as validation reads it: by field name, a field with an alias was stored under
        the name and every attempt failed to validate."""
        try:
            valid = self.adapter.validate_python(value)
            as_python = self.adapter.dump_python(valid, by_alias=True)
            self._refuse_lossy(as_python)
            return self.adapter.dump_python(valid, mode="json", by_alias=True)
        except ValidationError as err:
            raise InputInvalid(
                f"X_INPUT_INVALID: input of job {self.name!r} is not a {self.type_name}: "
                f"{err.errors(include_url=False)}",
                hint=f"Pass an input that validates as {self.type_name}.",
            ) from err
        except (PydanticSerializationError, ValueError) as err:
            # ValueError: a list or dict that holds itself ("Circular reference detected").
            raise InputInvalid(
                f"X_INPUT_INVALID: input of job {self.name!r} is not JSON: {err}",
                hint="Pass JSON values (dicts, lists, strings, numbers, booleans, None), or "
                f"type the input ({self.type_name}) so that it says how to write them.",
            ) from err

    def _refuse_lossy(self, value: Any) -> None:
        """Refuse what the JSON dump would silently change: NaN and infinities (written as
        null) and pydantic's secrets (written masked, as '**********'). Each container is
        walked once: one that holds itself would be walked for ever (the JSON dump refuses it)."""
        stack = [value]
        walked: set[int] = set()
        while stack:
            item = stack.pop()
            if isinstance(item, dict | list | tuple | set | frozenset):
                if id(item) in walked:
                    continue
                walked.add(id(item))
                stack.extend(item.values() if isinstance(item, dict) else item)
            elif isinstance(item, float) and not math.isfinite(item):
                raise InputInvalid(
                    f"X_INPUT_INVALID: input of job {self.name!r} holds {item}, which JSON "
                    "cannot carry (the handler would get None)",
                    hint="Pass finite numbers; send NaN or infinity as a string or as None.",
                )
            elif isinstance(item, SecretStr | SecretBytes):
                raise InputInvalid(
                    f"X_INPUT_INVALID: input of job {self.name!r} holds a secret, which would be "
                    "stored masked ('**********') and reach the handler so",
                    hint="Pass a reference to the secret (a vault path, an id) and let the "
                    "handler fetch it; jobs' inputs are stored in the clear.",
                )

    @property
    def type_name(self) -> str:
        return getattr(self.input_type, "__name__", str(self.input_type))

    @property
    def fixed_concurrency_key(self) -> str | None:
        """The concurrency key every enqueue of the job shares: the job-wide ``job:NAME`` of a
        limit without a key function. None without a limit, or when the input gives the key."""
        if self.concurrency is None or self.concurrency.key is not None:
            return None
        return f"job:{self.name}"

    def enqueue(self, input: I | None = None, **options: Any) -> Enqueued:
        return self.app.enqueue(self, input, **options)

    def enqueue_many(self, inputs: Iterable[I], **options: Any) -> list[Enqueued]:
        return self.app.enqueue_many(self, inputs, **options)

    def request(self, input: Any, **options: Any) -> dict[str, Any]:
        """One request for ``x_jobs.enqueue_many``: the job's options, then the call's."""
        payload = self.dump(input)
        req: dict[str, Any] = {
            "name": self.name,
            "input": payload,
            "queue": self.queue,
            "max_attempts": self.max_attempts,
            "priority": self.priority,
            "dead_letter": self.retry.dead_letter,
            # Fixed-point: "1e-05 seconds" is no SQL interval.
            "backoff_base": f"{seconds(self.retry.base):f} seconds",
            "backoff_max": f"{seconds(self.retry.max):f} seconds",
            "keep_done": self.keep_done,
        }
        if self.idempotency_key is not None:
            req["idempotency_key"] = self.idempotency_key(payload)
        if self.tenant is not None:
            req["tenant_id"] = self.tenant(payload) if callable(self.tenant) else self.tenant
        if self.concurrency is not None:
            key = self.concurrency.key
            req["concurrency_key"] = key(payload) if key is not None else self.fixed_concurrency_key
            req["concurrency_limit"] = self.concurrency.limit
        if self.rate_limit is not None:
            req["rate_limit_key"] = self.rate_limit.key
        if unknown := options.keys() - ENQUEUE_OPTIONS:
            raise TypeError(
                f"unknown enqueue option {min(unknown)!r}; known: {sorted(ENQUEUE_OPTIONS)}"
            )
        if options.get("delay") is not None and options.get("run_at") is not None:
            # Either would decide the due time; taking one silently loses the other.
            raise TypeError("pass delay or run_at, not both")
        for name, value in options.items():
            if value is None:
                continue
            if name == "delay":
                if not isinstance(value, int | float | timedelta) or isinstance(value, bool):
                    raise TypeError(f"delay is seconds or a timedelta, not {type(value).__name__}")
                req["_delay"] = seconds(value)  # counted from the database's clock, below
            elif name == "run_at":
                if not isinstance(value, datetime):
                    raise TypeError(f"run_at is a datetime, not {type(value).__name__}")
                req["run_at"] = value.isoformat()
            else:
                req[name] = value
        return req


#: Options an enqueue may set per call (the SQL arguments, plus `delay` in seconds).
ENQUEUE_OPTIONS = frozenset(
    {
        "queue",
        "run_at",
        "delay",
        "idempotency_key",
        "max_attempts",
        "priority",
        "tenant_id",
        "traceparent",
        "enqueued_by",
        "keep_done",
    }
)


class JobsApp(Protocol):
    """What a job, a sink and the webhook receiver call on their App (see the module's doc)."""

    @property
    def jobs(self) -> Mapping[str, Job[Any]]: ...

    def lookup(self, name: str) -> Job[Any]: ...

    def for_tenant(self, tenant: str) -> JobsApp: ...

    def connection(
        self, conn: psycopg.Connection[Any] | None = None
    ) -> AbstractContextManager[psycopg.Connection[Any]]: ...

    def enqueue(
        self,
        job: Job[Any] | str,
        input: Any = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> Enqueued: ...

    def enqueue_many(
        self,
        job: Job[Any] | str,
        inputs: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Any,
    ) -> list[Enqueued]: ...

    def enqueue_requests(
        self,
        requests: Sequence[Mapping[str, Any]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[Enqueued]: ...
