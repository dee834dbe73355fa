"""An input that does not fit the job's declaration, enqueued past App.enqueue (``x-jobs
enqueue``, SQL, another language): the worker fails it for good on its first attempt, where each
of its attempts failed alike (25 by default, a day of backoff). A ValidationError the handler
raises itself is the handler's failure, retried as any other."""

from __future__ import annotations

import pytest
from conftest import Conn, serving
from pydantic import BaseModel

import x_jobs

#: How long a test waits for what a sound worker does in well under a second.
SETTLE_SECONDS = 15.0


class Email(BaseModel):
    to: str
    subject: str


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_input_that_does_not_fit_its_declaration_fails_for_good_at_once(
    dsn: str, conn: Conn, kind: str
) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="send", queue="inputs", max_attempts=5)
    def send(input: Email) -> str:
        return input.to

    @app.job(name="send_async", queue="inputs", max_attempts=5)
    async def send_async(input: Email) -> str:
        return input.to

    name = "send" if kind == "sync" else "send_async"
    row = conn.execute(
        "SELECT id FROM x_jobs.enqueue(%s, '{\"to\": 5}', queue => 'inputs', max_attempts => 5,"
        " backoff_base => '0 seconds')",
        [name],
    ).fetchone()
    assert row is not None
    with serving(app), pytest.raises(x_jobs.JobFailed) as failed:
        app.result(int(row[0]), timeout=SETTLE_SECONDS)
    assert failed.value.state == "dead"
    assert "X_INPUT_INVALID" in str(failed.value.error)
    assert "Email" in str(failed.value.error)
    attempts = conn.execute("SELECT attempt FROM x_jobs.job WHERE id = %s", [row[0]]).fetchone()
    assert attempts == (1,)


def test_a_validation_error_the_handler_raises_is_retried(dsn: str, conn: Conn) -> None:
    app = x_jobs.App(dsn)

    @app.job(name="strict", queue="inputs-own", max_attempts=2, retry=x_jobs.Retry(base=0.01))
    def strict(input: dict[str, int]) -> None:
        Email.model_validate(input)  # raises: the handler's own check, not the declaration's

    job_id = app.enqueue(strict, {"n": 1}).id
    with serving(app), pytest.raises(x_jobs.JobFailed) as failed:
        app.result(job_id, timeout=SETTLE_SECONDS)
    assert "ValidationError" in str(failed.value.error)
    attempts = conn.execute("SELECT attempt FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert attempts == (2,)
