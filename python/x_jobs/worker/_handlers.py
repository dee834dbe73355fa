"""Running the handlers: sync ones on a fixed set of executor threads, ``async`` ones on an
event loop in a thread of its own, each claimed job from the local queue (``inbox``) to its
outcome (``outbox``), which wakes the dispatcher. No SQL: the durable steps a handler reaches go
through its context (x_jobs.steps), and the outcome is settled by the settler (x_jobs.settle).

A run that waited in the local queue a while goes back to the dispatcher to be confirmed first
(see x_jobs.leases). On a final failure the run's compensations run here, before its outcome
is left.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError

from x_jobs._executor import DaemonExecutor
from x_jobs.app import App
from x_jobs.context import split_schedule
from x_jobs.errors import InputInvalid, JobNotHeld, OutputInvalid, PermanentError, Suspended
from x_jobs.steps import AsyncSteps
from x_jobs.worker._run import Outcome, Run
from x_jobs.worker.leases import Leases

# The worker's log, whichever part writes it: its records carry the package's name, as log
# filters and pipelines match them.
logger = logging.getLogger(__package__)


class Executors:
    """Where the worker's handlers run, ``concurrency`` at once."""

    def __init__(
        self,
        *,
        app: App,
        concurrency: int,
        settle_delay: float,
        grace: float,
        leases: Leases,
        wake: threading.Event,
    ) -> None:
        self.app = app
        self.concurrency = concurrency
        self.settle_delay = settle_delay
        self.grace = grace
        #: The held jobs that have a timeout: the only ones whose deadline is checked (by the
        #: dispatcher, on its thread).
        self.timed: dict[int, Run] = {}
        self._leases = leases
        self._wake = wake
        #: Claimed runs for the executor threads; None ends a thread.
        self.inbox: queue.SimpleQueue[Run | None] = queue.SimpleQueue()
        #: The outcomes the handlers left, for the dispatcher.
        self.outbox: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The async runs' tasks not yet done, at most `concurrency`, and the claimed runs
        #: waiting for a slot among them (no task yet); both touched on the event loop only.
        self._async_live: set[asyncio.Task[None]] = set()
        self._async_waiting: deque[Run] = deque()
        self._last_nudge = 0.0

    def dispatch(self, runs: list[Run]) -> None:
        """Put claimed runs in the local queue of their executors (threads, or the event loop)."""
        async_runs = [run for run in runs if run.job.is_async]
        for run in runs:
            if not run.job.is_async:
                self.inbox.put(run)
        if async_runs:
            assert self.loop is not None
            self.loop.call_soon_threadsafe(self.start_async, async_runs)

    def check_deadlines(self, now: float, held: dict[int, Run]) -> float | None:
        """Tell the handlers whose timeout passed to stop, and answer the next deadline (for
        the loop's wake-up). The attempt is settled as timed out when the handler returns, not
        now: a sync body cannot be killed, and a job failed (or handed back) while its body runs
        on could be claimed again and run twice at once. A handler still running a grace later
        is logged once; it keeps the job, and its slot."""
        upcoming: float | None = None
        for run in list(self.timed.values()):
            if run.done or run.ctx.id not in held:
                del self.timed[run.ctx.id]
                continue
            if run.deadline is None:
                continue
            if now < run.deadline:
                upcoming = run.deadline if upcoming is None else min(upcoming, run.deadline)
                continue
            assert run.job.timeout is not None
            if run.timed_out:
                del self.timed[run.ctx.id]
                logger.warning(
                    "job timed out and its handler did not stop within the grace; the job stays "
                    "held, and its slot taken, until the handler returns",
                    extra={"job_id": run.ctx.id, "job": run.job.name, "grace_s": self.grace},
                )
                continue
            run.timed_out = True
            # On the final attempt the failure is for good: see _final.
            run.undoing = run.ctx.attempt >= run.ctx.max_attempts
            run.deadline = now + self.grace
            upcoming = run.deadline if upcoming is None else min(upcoming, run.deadline)
            self.tell_stop(run, "timeout")
        return upcoming

    def tell_stop(self, run: Run, reason: str) -> None:
        run.ctx._stop(reason)
        # The task is made on the loop (start_async), which cancels it itself if the stop came
        # first; either it sees the stop or this sees the task.
        if run.task is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(run.task.cancel)

    def start(self) -> None:
        """The executor threads, if any job is sync, and the event loop's, if any is async."""
        if any(not job.is_async for job in self.app.jobs.values()):
            for n in range(self.concurrency):
                thread = threading.Thread(
                    target=self.execute_sync, name=f"x_jobs-exec-{n}", daemon=True
                )
                thread.start()
        if any(job.is_async for job in self.app.jobs.values()):
            loop = asyncio.new_event_loop()
            # Its threads end with the process, as the sync handlers' do (see DaemonExecutor).
            loop.set_default_executor(DaemonExecutor(thread_name_prefix="x_jobs-to-thread"))
            self.loop = loop
            thread = threading.Thread(target=self._run_loop, name="x_jobs-async", daemon=True)
            thread.start()

    def _run_loop(self) -> None:
        assert self.loop is not None
        try:
            self.loop.run_forever()
        finally:
            # A Worker.run() embedded in a process that lives on would leave the loop open, its
            # selector and self-pipe sockets leaked (ResourceWarnings at garbage collection).
            self.loop.close()

    def shutdown(self) -> None:
        for _ in range(self.concurrency):
            self.inbox.put(None)
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _nudge(self, queued: bool) -> None:
        """Wake the dispatcher for an outcome, but not for every one: waking it per job (a
        notify, a thread switch, the GIL) cost more than the job. It is woken when no work is
        left `queued`, when a batch's worth is waiting, or when the settle delay has passed."""
        if self._wake.is_set():
            return  # the dispatcher has yet to wake: setting it again is a contended no-op
        now = time.monotonic()
        if not queued or self.outbox.qsize() >= 64 or now - self._last_nudge >= self.settle_delay:
            self._last_nudge = now
            self._wake.set()

    def begin(self, run: Run) -> bool:
        """Mark a run started (its timeout starts now), unless it was dropped meanwhile, or it
        waited in the local queue so long that a cancel may have come unseen: then it goes back
        to the dispatcher, which starts it again once extend_lease answers that the worker still
        holds it (see Leases.confirm). A run started soon after its claim is not checked."""
        now = time.monotonic()
        with self._leases.start_lock:
            if run.done:
                return False
            # _fresh, inline: this runs once per job.
            if now - max(run.checked, self._leases.confirmed_at) > self._leases.confirm_after:
                self._leases.unconfirmed.put(run)
                stale = True
            else:
                run.started = now
                stale = False
        if stale:
            self._wake.set()
            return False
        if run.job.timeout is not None:
            run.deadline = now + run.job.timeout
        return True

    def execute_sync(self) -> None:
        while True:
            run = self.inbox.get()
            if run is None:
                return
            if not self.begin(run):
                continue
            try:
                outcome = self._call(run)
            except BaseException as err:
                # _call keeps what the handler raises; this is the worker's own failure around
                # it. The thread lives on, and the job fails with it rather than run on unsettled.
                logger.exception("running a job failed", extra={"job_id": run.ctx.id})
                outcome = self._failure(run, err)
            run.returned = True
            self.outbox.put(outcome)
            self._nudge(queued=not self.inbox.empty())

    def start_async(self, runs: list[Run]) -> None:
        """On the event loop: the runs of a claim wait their turn; a task is made for one only
        when a slot is free. A task each at once, waiting on a semaphore, cost a future and a
        wake-up per waiting run (the prefetched ones are most of a claim)."""
        self._async_waiting.extend(runs)
        self._fill_async()

    def _fill_async(self) -> None:
        assert self.loop is not None
        while self._async_waiting and len(self._async_live) < self.concurrency:
            run = self._async_waiting.popleft()
            if run.done:
                continue  # handed back or lost while it waited: nothing to start
            task = self.loop.create_task(self._run_async(run))
            self._async_live.add(task)
            task.add_done_callback(self._async_finished)
            run.task = task
            if run.ctx.is_cancelled():
                task.cancel()  # told to stop before its task was made: see tell_stop

    def _async_finished(self, task: asyncio.Task[None]) -> None:
        self._async_live.discard(task)
        self._fill_async()

    async def _run_async(self, run: Run) -> None:
        if not self.begin(run):
            return
        try:
            outcome = await self._call_async(run)
        except BaseException as err:
            # As in _execute_sync: the worker's own failure around the handler. The job fails
            # with it rather than stay held, unsettled, for as long as the worker runs.
            logger.exception("running a job failed", extra={"job_id": run.ctx.id})
            outcome = Outcome(run, ok=False, error=f"the worker failed running it: {err!r}")
        run.returned = True
        self.outbox.put(outcome)
        # This task is done: its slot goes to the next waiting run now, not when its done
        # callback runs (a loop iteration later), and counted among the live ones it made a
        # burst's last outcome look queued, so that the dispatcher slept through it.
        if (task := asyncio.current_task()) is not None:
            self._async_live.discard(task)
        self._fill_async()
        self._nudge(queued=bool(self._async_waiting) or len(self._async_live) >= self.concurrency)

    async def _call_async(self, run: Run) -> Outcome:
        try:
            output = await self._invoke_async(run)
            outcome = self._success(run, output)
        except Suspended:
            return Outcome(run, ok=False, suspended=True)
        except asyncio.CancelledError:
            outcome = Outcome(run, ok=False, error=f"stopped: {run.ctx.reason}")
        except BaseException as err:
            # Whatever a handler raises (SystemExit included) is its job's outcome, and never
            # stops the worker.
            outcome = self._failure(run, err)
        outcome = self._timed_out(run, outcome)
        if self._final(run, outcome):
            try:
                # Made here if this attempt reached no step: earlier ones may have.
                steps = run.ctx.step
                assert isinstance(steps, AsyncSteps)
                self._add_compensation_errors(outcome, await steps.compensate())
            except BaseException as err:
                outcome = self._compensations_stopped(outcome, err)
        return outcome

    def _invoke(self, run: Run) -> Any:
        value = self._input(run)
        return run.job.fn(value, run.ctx) if run.job.takes_ctx else run.job.fn(value)

    async def _invoke_async(self, run: Run) -> Any:
        value = self._input(run)
        call: Coroutine[Any, Any, Any] = (
            run.job.fn(value, run.ctx) if run.job.takes_ctx else run.job.fn(value)
        )
        return await call

    @staticmethod
    def _input(run: Run) -> Any:
        """The handler's input, validated against the job's declaration. A row enqueued past
        App.enqueue (x-jobs enqueue, SQL, another language) may not fit it: no attempt would
        run it, so it fails for good at once, where each of its 25 attempts failed alike.
        A fired job's ``_schedule`` is taken out first, for ``ctx.schedule``: the handler's
        input is the schedule's, as declared."""
        payload, scheduled = split_schedule(run.payload)
        if scheduled is not None:
            run.ctx.schedule = scheduled
        try:
            return run.job.validate_json(payload)
        except ValidationError as err:
            raise InputInvalid(
                f"X_INPUT_INVALID: the input of job {run.job.name!r} does not fit its "
                f"declared {run.job.type_name}: {err}",
                hint="Enqueue it again with an input that validates (App.enqueue checks it "
                "before it reaches the database).",
            ) from err

    def _call(self, run: Run) -> Outcome:
        try:
            outcome = self._success(run, self._invoke(run))
        except Suspended:
            return Outcome(run, ok=False, suspended=True)
        except BaseException as err:
            # As in _run_async: the job's outcome, never the worker's end.
            outcome = self._failure(run, err)
        outcome = self._timed_out(run, outcome)
        if self._final(run, outcome):
            try:
                # Made here if this attempt reached no step: earlier ones may have.
                self._add_compensation_errors(outcome, run.ctx.step.compensate())
            except BaseException as err:
                outcome = self._compensations_stopped(outcome, err)
        return outcome

    @staticmethod
    def _timed_out(run: Run, outcome: Outcome) -> Outcome:
        """A handler stopped by its timeout failed as timed out, whatever it answered: for good
        when it undoes its steps (its final attempt), else to be retried."""
        if not run.timed_out or outcome.lost:
            return outcome
        assert run.job.timeout is not None
        return Outcome(
            run,
            ok=False,
            error=f"timed out after {run.job.timeout:g} s",
            stack=outcome.stack,
            retryable=not run.undoing,
        )

    def _final(self, run: Run, outcome: Outcome) -> bool:
        """Does this failure end the run for good, so that its compensations run and the steps
        of earlier attempts it did not reach are named? Asked of every such failure, steps or
        none: a final attempt that failed before its first step reached none, and the step rows
        (one query) still say what earlier attempts completed. Not when the worker stopped the
        handler (cancel, lost, shutdown, a timeout with attempts left): the row's next claim (or
        its burial) decides. A final attempt that timed out does (it is undoing), unless the
        dispatcher dropped the run meanwhile (handed back in a drain, lost: checked under the
        lock that the dispatcher drops runs under)."""
        if outcome.ok or outcome.lost:
            return False
        if run.ctx.is_cancelled() and not (run.undoing and run.ctx.reason == "timeout"):
            return False
        if outcome.retryable and run.ctx.attempt < run.ctx.max_attempts:
            return False
        with self._leases.start_lock:
            return not run.done

    @staticmethod
    def _compensations_stopped(outcome: Outcome, err: BaseException) -> Outcome:
        """The compensations could not go on: the job was no longer held (nothing to settle
        here), or recording one failed (the job fails, saying so)."""
        if isinstance(err, JobNotHeld):
            outcome.lost = True
        stopped = f"compensations stopped: {type(err).__name__}: {err}"
        outcome.error = f"{outcome.error}; {stopped}" if outcome.error else stopped
        outcome.stack = "\n".join([outcome.stack or "", stopped])
        return outcome

    @staticmethod
    def _add_compensation_errors(outcome: Outcome, failures: list[str]) -> None:
        """Keep both: the run's error first, then each compensation that failed (and the steps
        of earlier attempts whose compensations could not run, see Steps.compensate)."""
        if failures:
            outcome.error = "; ".join([outcome.error, *failures])
            outcome.stack = "\n".join([outcome.stack or "", *failures])

    def _success(self, run: Run, output: Any) -> Outcome:
        # An int is checked too: one past Python's 4300 digits has no JSON text.
        if output is not None and not isinstance(output, str | bool):
            try:
                json.dumps(output)
            except (TypeError, ValueError) as err:
                return self._failure(
                    run,
                    OutputInvalid(
                        f"X_OUTPUT_INVALID: job {run.job.name!r} returned a "
                        f"{type(output).__name__}, which is not JSON: {err}",
                        hint="Return JSON values (dict, list, str, int, float, bool, None).",
                    ),
                )
        return Outcome(run, ok=True, output=output)

    @staticmethod
    def _failure(run: Run, err: BaseException) -> Outcome:
        # Whatever the exception's __str__ raises: describing it must not fail its job's outcome.
        try:
            error = f"{type(err).__name__}: {err}"
        except Exception:
            error = f"{type(err).__name__} (its message could not be read)"
        try:
            stack = "".join(traceback.format_exception(err))
        except Exception:
            stack = None
        return Outcome(
            run,
            ok=False,
            error=error,
            stack=stack,
            retryable=not isinstance(err, PermanentError | JobNotHeld | InputInvalid),
            lost=isinstance(err, JobNotHeld),
        )
