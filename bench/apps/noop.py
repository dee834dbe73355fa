"""The benchmark's app: no-op jobs, so that a drain measures x_jobs and nothing else."""

from __future__ import annotations

from typing import Any

import x_jobs

app = x_jobs.App()


@app.job(name="noop", queue="bench")
def noop(input: dict[str, Any]) -> None:
    """Does nothing."""


@app.job(name="noop_async", queue="bench")
async def noop_async(input: dict[str, Any]) -> None:
    """Does nothing, on the worker's event loop."""
