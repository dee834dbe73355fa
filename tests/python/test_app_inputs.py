"""What ``app.enqueue`` stores is what the handler gets: inputs that JSON would change are
refused at enqueue, options of the wrong kind are typed errors, and the call works on any
connection the caller hands it. Everything is read back from a real database."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import textwrap
import uuid
import warnings
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, cast

import psycopg
import pytest
from conftest import Conn, fresh_database
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, SecretStr

import x_jobs
from x_jobs.errors import InputInvalid, NotInstalled, TimeInvalid


class Order(BaseModel):
    order_id: int = Field(alias="orderId")


class Login(BaseModel):
    account: str
    api_token: SecretStr


class Reading(BaseModel):
    model_config = ConfigDict(allow_inf_nan=True)
    threshold: float


class Samples(BaseModel):
    name: str
    values: list[float] | None = None  # a float only deep inside


class Setting(BaseModel):
    value: int | float | str


class Vault(BaseModel):
    token: SecretStr | None = None


class Service(BaseModel):
    name: str
    vault: Vault


class Limits(BaseModel):
    """Of str, int, bool and list[str] only: no NaN or secret fits a valid one."""

    account: str
    count: int
    strict: bool
    tags: list[str] = []


class Gauge(BaseModel):
    reading: Annotated[str, PlainSerializer(float, return_type=float)]  # written as a number


class Throttle(BaseModel):
    per_second: int = cast(int, math.nan)  # a default is not validated: stored as it is


@pytest.fixture
def app(dsn: str) -> Iterator[x_jobs.App]:
    app = x_jobs.App(dsn)

    @app.job(name="ship")
    def ship(input: Order) -> None: ...

    @app.job(name="login")
    def login(input: Login) -> None: ...

    @app.job(name="measure")
    def measure(input: Reading) -> None: ...

    @app.job(name="anything")
    def anything(input: Any) -> None: ...

    @app.job(name="remind", retry=x_jobs.Retry(base=0.00001, max=0.5))
    def remind(input: dict[str, str]) -> None: ...

    @app.job(name="bag")
    def bag(input: dict[str, Any]) -> None: ...

    @app.job(name="samples")
    def samples(input: Samples) -> None: ...

    @app.job(name="setting")
    def setting(input: Setting) -> None: ...

    @app.job(name="service")
    def service(input: Service) -> None: ...

    @app.job(name="limits")
    def limits(input: Limits) -> None: ...

    @app.job(name="gauge")
    def gauge(input: Gauge) -> None: ...

    @app.job(name="throttle")
    def throttle(input: Throttle) -> None: ...

    yield app
    app.close()


def stored_input(conn: Conn, job_id: int) -> str:
    row = conn.execute("SELECT input::text FROM x_jobs.job WHERE id = %s", [job_id]).fetchone()
    assert row is not None
    return str(row[0])


def test_an_aliased_field_is_stored_as_the_worker_validates_it(app: x_jobs.App, conn: Conn) -> None:
    """Stored by field name, {"order_id": 7} failed the handler's validation at every attempt:
    the model reads the alias."""
    job = app.enqueue("ship", {"orderId": 7})
    stored = stored_input(conn, job.id)
    assert app.jobs["ship"].validate_json(stored) == Order(orderId=7)


def test_inputs_json_would_change_are_refused_and_nothing_is_enqueued(
    app: x_jobs.App, conn: Conn
) -> None:
    # A secret is written masked: the handler got "**********".
    with pytest.raises(InputInvalid, match="holds a secret") as secret:
        app.enqueue("login", {"account": "acme", "api_token": "s3cret"})
    assert secret.value.hint and "reference" in secret.value.hint
    # NaN and infinity are written as null: the handler got None.
    with pytest.raises(InputInvalid, match="holds nan"):
        app.enqueue("anything", {"threshold": math.nan})
    with pytest.raises(InputInvalid, match="holds inf"):
        app.enqueue("measure", {"threshold": math.inf})
    # What pydantic cannot write at all was a PydanticSerializationError.
    with pytest.raises(InputInvalid, match="is not JSON"):
        app.enqueue("anything", {"handle": object()})
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


@pytest.mark.parametrize(
    ("name", "input", "refused"),
    [
        ("samples", {"name": "s", "values": [1.5, math.nan]}, "holds nan"),
        ("setting", {"value": math.inf}, "holds inf"),
        ("bag", {"a": "x", "b": {"c": [1, -math.inf]}}, "holds -inf"),
        ("bag", {"a": [SecretStr("s3cret")]}, "holds a secret"),
        ("service", {"name": "api", "vault": {"token": "s3cret"}}, "holds a secret"),
        ("service", Service(name="api", vault=Vault(token=SecretStr("s3cret"))), "holds a secret"),
        ("gauge", {"reading": "NaN"}, "holds nan"),
        ("throttle", {}, "holds nan"),
    ],
)
def test_what_json_would_change_is_refused_however_deep_the_type_hides_it(
    app: x_jobs.App, conn: Conn, name: str, input: Any, refused: str
) -> None:
    """A NaN, an infinity or a secret is refused wherever the input's type lets it in: an
    optional list, a union, Any, a nested model, what a serializer writes, a default that is
    never validated."""
    with warnings.catch_warnings():
        # The NaN default in an int field is also a pydantic serializer warning.
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(InputInvalid, match=refused):
            app.enqueue(name, input)
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_a_model_changed_after_its_validation_is_refused_as_it_stands(
    app: x_jobs.App, conn: Conn
) -> None:
    """A Limits cannot hold a NaN or a secret when validation builds it, but the caller's
    instance is taken as it is: changed since, or built by model_construct, it can, and is
    refused."""
    changed = Limits(account="acme", count=1, strict=True)
    changed.count = cast(int, math.nan)  # no validate_assignment: stored as it is
    constructed = Limits.model_construct(account=SecretStr("s3cret"), count=1, strict=True)
    for input, refused in [(changed, "holds nan"), (constructed, "holds a secret")]:
        with (
            pytest.warns(UserWarning, match="serialized value may not be as expected"),
            pytest.raises(InputInvalid, match=refused),
        ):
            app.enqueue("limits", input)
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_options_of_the_wrong_kind_are_typed_errors(app: x_jobs.App, conn: Conn) -> None:
    with pytest.raises(TypeError, match="run_at is a datetime, not str"):
        app.enqueue("remind", {"to": "ada"}, run_at="2031-01-01T00:00:00+00:00")
    with pytest.raises(TypeError, match="delay is seconds or a timedelta, not str"):
        app.enqueue("remind", {"to": "ada"}, delay="60")
    # Past the year 9999 was an OverflowError from datetime.
    with pytest.raises(TimeInvalid, match="ends past the year 9999"):
        app.enqueue("remind", {"to": "ada"}, delay=1e12)
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)


def test_a_backoff_below_a_millisecond_is_sent_as_an_interval(app: x_jobs.App, conn: Conn) -> None:
    """str(0.00001) is '1e-05', which is no SQL interval: every enqueue of the job failed."""
    job = app.enqueue("remind", {"to": "ada"})
    row = conn.execute(
        "SELECT backoff_base, backoff_max FROM x_jobs.job WHERE id = %s", [job.id]
    ).fetchone()
    assert row == (timedelta(microseconds=10), timedelta(milliseconds=500))


def test_enqueue_and_put_work_on_a_callers_connection_with_dict_rows(
    app: x_jobs.App, dsn: str, conn: Conn
) -> None:
    """Rows were read by position: KeyError on a dict_row connection, after the insert ran."""
    with psycopg.connect(dsn, row_factory=dict_row) as caller:
        job = app.enqueue("remind", {"to": "ada"}, conn=caller)
        later = app.enqueue("remind", {"to": "bob"}, delay=60, conn=caller)
        message = app.outbox.put("t.dict_row", {"n": 1}, conn=caller)
        many = app.outbox.put_many([{"topic": "t.dict_row", "payload": {}}], conn=caller)
    assert conn.execute(
        "SELECT count(*) FROM x_jobs.job WHERE id = ANY(%s)", [[job.id, later.id]]
    ).fetchone() == (2,)
    assert conn.execute(
        "SELECT count(*) FROM x_jobs.outbox WHERE id = ANY(%s)", [[message, *many]]
    ).fetchone() == (2,)


def test_a_delay_in_the_callers_transaction_counts_from_the_call(
    app: x_jobs.App, dsn: str, conn: Conn
) -> None:
    """It counted from the transaction's start (now()): in a transaction open longer than the
    delay, the job was due before the call."""
    with psycopg.connect(dsn) as caller:
        caller.execute("SELECT pg_sleep(0.5)")
        row = caller.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        called_at: datetime = row[0]
        job = app.enqueue("remind", {"to": "ada"}, delay=1, conn=caller)
    found = conn.execute("SELECT run_at FROM x_jobs.job WHERE id = %s", [job.id]).fetchone()
    assert found is not None
    assert found[0] >= called_at + timedelta(seconds=1)


def test_a_database_without_x_jobs_is_not_installed(admin: Conn) -> None:
    """It was a bare InvalidSchemaName from enqueue and from result."""
    with fresh_database(admin, "template1") as empty:
        app = x_jobs.App(empty)

        @app.job(name="remind")
        def remind(input: dict[str, str]) -> None: ...

        try:
            with pytest.raises(NotInstalled, match="not installed"):
                app.enqueue("remind", {"to": "ada"})
            with pytest.raises(NotInstalled):
                app.result(1, timeout=0.1)
        finally:
            app.close()


def test_a_database_that_cannot_be_reached_says_why(dsn: str) -> None:
    """The pool answered PoolTimeout, after 30 s, without the reason."""
    missing = psycopg.conninfo.make_conninfo(dsn, dbname=f"x_jobs_missing_{uuid.uuid4().hex}")
    app = x_jobs.App(missing)

    @app.job(name="remind")
    def remind(input: dict[str, str]) -> None: ...

    # A pool that gives up at once instead of after 30 s; the same code path answers.
    app._pools._pool = ConnectionPool(missing, min_size=1, timeout=0.5, open=True)
    try:
        with pytest.raises(psycopg.OperationalError, match="does not exist"):
            app.enqueue("remind", {"to": "ada"})
    finally:
        app.close()


def test_a_handler_may_annotate_ctx_with_a_type_imported_for_type_checking_only(
    tmp_path: Path, dsn: str
) -> None:
    """Declaring evaluated every annotation of the handler: a NameError at import for the
    layout linters arrange (JobContext imported under TYPE_CHECKING)."""
    module = tmp_path / "tc_jobs.py"
    module.write_text(
        textwrap.dedent(
            """
            from __future__ import annotations

            from typing import TYPE_CHECKING

            import x_jobs

            if TYPE_CHECKING:
                from x_jobs import JobContext

            app = x_jobs.App()

            @app.job(name="count")
            def count(input: dict[str, int], ctx: JobContext) -> None: ...
            """
        )
    )
    spec = importlib.util.spec_from_file_location("tc_jobs", module)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules["tc_jobs"] = loaded
    try:
        spec.loader.exec_module(loaded)
        job = loaded.app.jobs["count"]
        assert job.takes_ctx
        with pytest.raises(InputInvalid):
            job.dump({"n": "not a number"})
        assert job.dump({"n": 3}) == {"n": 3}
    finally:
        del sys.modules["tc_jobs"]


def test_an_int_outbox_key_is_stored_as_its_text(app: x_jobs.App, conn: Conn) -> None:
    """An int key went as a smallint: "function x_jobs.outbox_put(...) does not exist"."""
    message = app.outbox.put("t.int_key", {"n": 1}, key=42)
    row = conn.execute("SELECT key FROM x_jobs.outbox WHERE id = %s", [message]).fetchone()
    assert row == ("42",)


def test_an_input_that_holds_itself_is_refused_not_walked_for_ever(
    app: x_jobs.App, conn: Conn
) -> None:
    """A list that contains itself, under Any: the walk for NaN and secrets went round it for
    ever (15 GB in 16 minutes). Refused as not JSON; a list shared by two keys is no cycle."""
    circular: list[Any] = [1]
    circular.append(circular)
    with pytest.raises(InputInvalid, match="is not JSON: Circular reference"):
        app.enqueue("bag", {"a": circular})
    assert conn.execute("SELECT count(*) FROM x_jobs.job").fetchone() == (0,)
    shared = [1.5]
    stored = stored_input(conn, app.enqueue("bag", {"x": shared, "y": shared}).id)
    assert json.loads(stored) == {"x": [1.5], "y": [1.5]}
