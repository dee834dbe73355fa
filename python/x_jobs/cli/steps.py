"""``x-jobs steps resolve``: a waiting step of a workflow run resolved by hand."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, LiteralString

import typer
from psycopg.rows import class_row

from x_jobs.cli._database import database
from x_jobs.cli._options import BIGINT_MAX, BIGINT_MIN, AsJson, Dsn, _json_input
from x_jobs.cli._output import Output, _fields, _json_view, _or_dash, _when
from x_jobs.cli._rows import JOB_STATE, STEP_COLUMNS, StepRow

logger = logging.getLogger(__name__)


steps_cli = typer.Typer(help="Resolve the waiting steps of workflow runs.", no_args_is_help=True)

RESOLVE_STEP: LiteralString = (
    "SELECT "
    + STEP_COLUMNS
    + " FROM x_jobs.resolve_step(job => %(job)s, step => %(step)s, output => %(output)s::jsonb)"
)


@steps_cli.command("resolve")
def steps_resolve(
    job_id: Annotated[
        int, typer.Argument(metavar="JOB", min=BIGINT_MIN, max=BIGINT_MAX, help="The job's id.")
    ],
    step: Annotated[str, typer.Argument(metavar="STEP", help="The step's name.")],
    output_json: Annotated[
        str | None,
        typer.Option(
            "--output",
            metavar="JSON",
            help="The step's output, a JSON value: what the run's wait or sleep answers.",
            show_default=False,
        ),
    ] = None,
    dsn: Dsn = None,
    as_json: AsJson = False,
) -> None:
    """Resolve a waiting step by hand (x_jobs.resolve_step): a sleep ends now, a wait is done
    with --output, and the suspended run is due at once. Refused while a worker holds the job."""
    out = Output(as_json)
    output = None if output_json is None else _json_input(output_json, "--output")
    params = {"job": job_id, "step": step, "output": output}
    with database(dsn, out) as conn, conn.transaction():
        cur = conn.cursor(row_factory=class_row(StepRow))
        row = cur.execute(RESOLVE_STEP, params).fetchone()
        state = conn.execute(JOB_STATE, {"id": job_id}).fetchone()
    assert row is not None  # resolve_step answers the step or raises
    job_state = None if state is None else str(state[0])
    out.emit(
        {"step": dataclasses.asdict(row), "state": job_state},
        _fields(
            [
                ("job", str(row.job_id)),
                ("step", row.name),
                ("kind", row.kind),
                ("status", row.status),
                ("output", "-" if row.output is None else _json_view(row.output)),
                ("resolved by", _or_dash(row.resolved_by)),
                ("resolved at", _when(row.resolved_at)),
            ]
        ),
        f"job {row.job_id} is {job_state}",
    )
