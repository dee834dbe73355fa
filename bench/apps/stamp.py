"""The wake-latency benchmark's app (bench/versus.py): a handler that notes when it started.

Each job's input holds its number `n`; the handler's first act is to read CLOCK_MONOTONIC, and it
appends a line "n seconds" to the file X_JOBS_BENCH_STAMPS names. The benchmark holds the
moment each enqueue's commit came back on the same clock (system-wide, so comparable across
processes; graphile-worker's task in bench/peers/wake_graphile.mjs reads it too) and subtracts.

A file rather than a table: a write to the database would put a second commit beside each job
on the server whose wake-up is measured.
"""

from __future__ import annotations

import os
import time
from typing import Any

import x_jobs

app = x_jobs.App()

# One descriptor per process, opened for appending: a write of one short line with O_APPEND
# lands whole, so the handler's threads need no lock.
_STAMPS = os.open(
    os.environ.get("X_JOBS_BENCH_STAMPS", os.devnull), os.O_WRONLY | os.O_APPEND | os.O_CREAT
)


@app.job(name="stamp", queue="bench")
def stamp(input: dict[str, Any]) -> None:
    """Notes the job's number and the moment the handler started."""
    started = time.monotonic()
    os.write(_STAMPS, f"{int(input['n'])} {started:.6f}\n".encode())
