"""``app.enqueue``'s per-call options that decide when a job is due (``run_at``, ``delay``), and
the refusal of options that cannot both hold. The rows are read back from a real database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from conftest import Conn

import x_jobs


@pytest.fixture
def app(dsn: str) -> Iterator[x_jobs.App]:
    app = x_jobs.App(dsn)

    @app.job(name="remind")
    def remind(input: dict[str, str]) -> None: ...

    yield app
    app.close()


def run_at_of(conn: Conn, job_id: int) -> tuple[str, datetime]:
    row = conn.execute("SELECT state::text, run_at FROM x_jobs.job WHERE id = %s", [job_id])
    found = row.fetchone()
    assert found is not None
    return found[0], found[1]


def test_a_delay_counts_from_the_database_clock(app: x_jobs.App, conn: Conn) -> None:
    # The session's clock is years from this machine's: a delay added to the machine's time
    # would land nowhere near it.
    conn.execute("SET x_jobs.fake_now = '2031-01-01 00:00:00+00'")
    job = app.enqueue("remind", {"to": "ada"}, delay=90, conn=conn)
    assert run_at_of(conn, job.id) == ("delayed", datetime(2031, 1, 1, 0, 1, 30, tzinfo=UTC))


def test_a_run_at_with_a_zone_is_kept_and_a_naive_one_is_read_in_the_session_zone(
    app: x_jobs.App, conn: Conn
) -> None:
    conn.execute("SET TimeZone = 'Asia/Tokyo'")
    aware = app.enqueue("remind", {"to": "ada"}, run_at=datetime(2031, 5, 1, 12, tzinfo=UTC))
    naive = app.enqueue("remind", {"to": "bob"}, run_at=datetime(2031, 5, 1, 12), conn=conn)
    assert run_at_of(conn, aware.id)[1] == datetime(2031, 5, 1, 12, tzinfo=UTC)
    # 12:00 in Tokyo (UTC+9, no daylight saving) is 03:00 UTC.
    assert run_at_of(conn, naive.id)[1] == datetime(2031, 5, 1, 3, tzinfo=UTC)


def test_delay_and_run_at_together_are_refused_and_nothing_is_enqueued(
    app: x_jobs.App, conn: Conn
) -> None:
    """Either one decides the due time: taking one would silently drop the other."""
    when = datetime(2031, 5, 1, 12, tzinfo=UTC)
    with pytest.raises(TypeError, match="delay or run_at, not both"):
        app.enqueue("remind", {"to": "ada"}, delay=60, run_at=when)
    with pytest.raises(TypeError, match="unknown enqueue option 'run_after'"):
        app.enqueue("remind", {"to": "ada"}, run_after=when)
    # None means "not given", as for every option.
    job = app.enqueue("remind", {"to": "ada"}, delay=None, run_at=when)
    assert conn.execute("SELECT array_agg(id) FROM x_jobs.job").fetchone() == ([job.id],)
