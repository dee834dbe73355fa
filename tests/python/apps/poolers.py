"""The app the pooler tests run through pgbouncer: ``x-jobs worker apps.poolers:app``.

Its handlers record their runs as ``apps.basic``'s do (``run_log``, over a connection of their
own that goes to the server directly when the test says so), and return an output: a
completion that carries a value, which a settle error must not take for a refusal of it.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel

import x_jobs
from apps.basic import Gate, Run, _sleep, _wait_for_gate

logger = logging.getLogger(__name__)

app = x_jobs.App()


class Numbered(BaseModel):
    n: int = 0
    #: How long the body takes.
    seconds: float = 0.0


@app.job(name="echo")
def echo(input: Numbered, ctx: x_jobs.JobContext) -> dict[str, int]:
    with Run(ctx) as run:
        _sleep(run, input.seconds)
    return {"n": input.n}


@app.job(name="gated_echo")
def gated_echo(input: Gate, ctx: x_jobs.JobContext) -> dict[str, str]:
    with Run(ctx) as run:
        _wait_for_gate(run, input.gate)
    return {"gate": input.gate}
