"""What a relay delivers and to what: :class:`OutboxMessage`, the sink protocols (one message
per call, or a claim's messages of a topic in one call), a function as a sink
(:class:`FunctionSink`), and :class:`JobSink`, which enqueues a job per message. The webhook sink
is x_jobs.webhooks'; the outbox (x_jobs.outbox.Outbox) registers them by topic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from x_jobs.errors import DeliveryError, InputInvalid, InvalidArgument
from x_jobs.jobs import Job, JobsApp


@dataclass(frozen=True)
class OutboxMessage:
    """A message as a relay hands it to a sink."""

    id: int
    topic: str
    key: str | None
    payload: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Which delivery this is, from 1: a sink sees a message again after a failure or a crash.
    attempt: int = 1
    #: The payload as jsonb wrote it, every number with all its digits (``payload`` reads them
    #: as floats); set by the relay, None for a message made by hand.
    payload_json: str | None = None


class Sink(Protocol):
    """Delivers one message; returns when it was delivered, raises when it was not."""

    def deliver(self, message: OutboxMessage) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class BatchSink(Protocol):
    """A sink that delivers many messages in one call (one round trip, one commit): answers,
    per message and in order, None when it was delivered or the exception it failed with."""

    def deliver_batch(self, messages: Sequence[OutboxMessage]) -> list[Exception | None]: ...

    def deliver(self, message: OutboxMessage) -> None: ...

    def close(self) -> None: ...


class FunctionSink:
    """A plain function as a sink."""

    def __init__(self, fn: Callable[[OutboxMessage], Any]) -> None:
        self.fn = fn

    def deliver(self, message: OutboxMessage) -> None:
        self.fn(message)

    def close(self) -> None:
        pass


class JobSink:
    """Enqueues ``job`` with the message's payload as input. The idempotency key is the message
    id, so a redelivery while the job is live answers the same job instead of a second one."""

    def __init__(self, app: JobsApp, job: Job[Any] | str, *, queue: str | None = None) -> None:
        self.app = app
        self.job = job
        self.queue = queue

    def deliver(self, message: OutboxMessage) -> None:
        error = self.deliver_batch([message])[0]
        if error is not None:
            raise error

    def deliver_batch(self, messages: Sequence[OutboxMessage]) -> list[Exception | None]:
        """All the messages in one ``enqueue_many`` (one commit). A message whose job cannot be
        made fails alone, for good: a payload that is not a valid input, a tenant or key function
        that raises on it, or a job the database refuses (an empty tenant derived from it, say).
        Any other failure (the database away) fails the messages not enqueued, to be retried."""
        job = self.app.lookup(self.job) if isinstance(self.job, str) else self.job
        errors: list[Exception | None] = []
        requests: list[tuple[int, dict[str, Any]]] = []
        for message in messages:
            options: dict[str, Any] = {"idempotency_key": f"outbox:{message.id}"}
            if self.queue is not None:
                options["queue"] = self.queue
            try:
                requests.append((len(errors), job.request(message.payload, **options)))
                errors.append(None)
            except InputInvalid as err:
                errors.append(DeliveryError(str(err), retryable=False))
            except Exception as err:  # the job's own tenant/key/dump functions, on this payload
                errors.append(
                    DeliveryError(
                        f"the job's request could not be made: {self._described(err)}",
                        retryable=False,
                    )
                )
        if not requests:
            return errors
        try:
            self.app.enqueue_requests([request for _, request in requests])
        except InvalidArgument as err:
            if len(requests) == 1:
                errors[requests[0][0]] = self._refused(err)
                return errors
            # enqueue_many is one statement: one job the database refuses fails them all. One
            # by one, so that only the refused ones fail (each with its idempotency key, so a
            # job enqueued twice is one job).
            for index, request in requests:
                try:
                    self.app.enqueue_requests([request])
                except InvalidArgument as refusal:
                    errors[index] = self._refused(refusal)
                except Exception as failure:  # retried, as any sink failure
                    errors[index] = failure
        return errors

    @staticmethod
    def _refused(err: InvalidArgument) -> DeliveryError:
        """A job the database (or the client) refused for what it holds: enqueueing it again
        would be refused again, so its message fails for good, naming the refusal."""
        return DeliveryError(f"its job was refused: {err}", retryable=False)

    @staticmethod
    def _described(err: BaseException) -> str:
        try:
            text = str(err)
        except Exception:  # an exception's own __str__ may fail: its type still says something
            text = ""
        return f"{type(err).__name__}: {text}" if text else type(err).__name__

    def close(self) -> None:
        pass


#: What a payload jsonb refuses (NaN, infinity, a NUL character) is called, and the fix.
