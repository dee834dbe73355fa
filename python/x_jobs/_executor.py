"""The default executor of the worker's event loop: ``asyncio.to_thread`` and
``loop.run_in_executor(None, ...)`` calls run on daemon threads, which end with the process."""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

logger = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

#: A call waiting for a thread: its future, the function and its arguments.
_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonExecutor(ThreadPoolExecutor):
    """Runs each call on a daemon thread, started as calls need one (at most ``max_workers``,
    the stdlib's default: ``min(32, cpu count + 4)``), kept for the next call.

    The interpreter joins a ThreadPoolExecutor's threads when it exits: an async handler
    awaiting a blocking call in one (``await asyncio.to_thread(...)``, the async steps' own
    database calls) would keep ``x-jobs worker`` alive past its drain for as long as the call
    ran, its job handed back meanwhile and free to run again elsewhere. The process must end
    its handlers when it ends, the async ones' threads as the sync ones' executor threads.

    A ThreadPoolExecutor by type only (asyncio takes nothing else as a loop's default
    executor): it runs its calls on threads of its own, not on the base class's."""

    def __init__(self, max_workers: int | None = None, thread_name_prefix: str = "") -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self._most = max_workers or min(32, (os.cpu_count() or 1) + 4)
        self._prefix = thread_name_prefix or "x_jobs-to-thread"
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._serving: list[threading.Thread] = []
        #: Threads waiting for a call, and calls not yet taken by a thread.
        self._idle = 0
        self._queued = 0
        self._closed = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._calls.put((future, fn, args, kwargs))
            self._queued += 1
            if self._queued > self._idle and len(self._serving) < self._most:
                thread = threading.Thread(
                    target=self._serve,
                    name=f"{self._prefix}_{len(self._serving)}",
                    daemon=True,
                )
                thread.start()
                self._serving.append(thread)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._serving)
            if cancel_futures:
                while True:
                    try:
                        call = self._calls.get_nowait()
                    except queue.Empty:
                        break
                    if call is not None:
                        self._queued -= 1
                        call[0].cancel()
            for _ in threads:
                self._calls.put(None)
        if wait:
            for thread in threads:
                thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            call = self._calls.get()
            with self._lock:
                self._idle -= 1
                if call is not None:
                    self._queued -= 1
            if call is None:
                return
            future, fn, args, kwargs = call
            del call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as err:
                future.set_exception(err)
                del err  # no cycle through the traceback's frames
            else:
                future.set_result(result)
            del future, fn, args, kwargs
