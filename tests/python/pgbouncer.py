"""Debian's pgbouncer in front of the throwaway server, for the tests that run the client behind a
pooler (conftest-style: the fixtures below are imported by the test modules that use them).

Each fixture starts a pgbouncer of its own for one test module, as the server's owner (pgbouncer
refuses to run as root), in a temporary directory: its ini, an auth file naming the login, a log
and nothing else. It listens on 127.0.0.1 and a free port, and every database name goes to the
server's Unix socket (PGHOST, PGPORT), so a test's fresh database is reached through it by name.
``auth_type = trust``: loopback only. scripts/ensure-deps installs the package. A test module
binds the fixtures it needs (``bouncer_transaction = bouncer_fixture("transaction")``).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import DEADLINE_SECONDS, free_port
from psycopg.conninfo import conninfo_to_dict, make_conninfo

logger = logging.getLogger(__name__)

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


class Bouncer:
    """One pgbouncer process: ``dsn(conninfo)`` is the way to the same database through it."""

    def __init__(self, pool_mode: str) -> None:
        self.pool_mode = pool_mode
        self.user = os.environ.get("PGUSER") or pwd.getpwuid(os.geteuid()).pw_name
        # As root pgbouncer runs as the server's owner, which must read its files.
        self._as = "postgres" if os.geteuid() == 0 else None
        self.dir = Path(tempfile.mkdtemp(prefix="xjobs-bouncer."))
        self.dir.chmod(0o755)
        self.log = self.dir / "pgbouncer.log"
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def _write_config(self) -> Path:
        host = os.environ.get("PGHOST", "/var/run/postgresql")
        server_port = os.environ.get("PGPORT", "5432")
        users = self.dir / "users.txt"
        users.write_text(f'"{self.user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            f"""[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {users}
pool_mode = {self.pool_mode}
max_client_conn = 500
default_pool_size = 40
logfile = {self.log}
pidfile =
admin_users = {self.user}
; After a failed login to the server (a restart), new clients are refused this long (15 s by
; default): shorter here, so that a test's restart costs seconds.
server_login_retry = 2
"""
        )
        if self._as is not None:
            for path in (users, ini):
                shutil.chown(path, self._as)
            shutil.chown(self.dir, self._as)
        return ini

    def start(self) -> None:
        """Start it on a free port (another one if that port was taken meanwhile) and wait
        until it answers."""
        if not Path(PGBOUNCER).exists():
            pytest.fail("pgbouncer is not installed: scripts/ensure-deps (make test) installs it")
        for _ in range(5):
            self.port = free_port()
            ini = self._write_config()
            self.proc = subprocess.Popen(
                [PGBOUNCER, "-q", str(ini)],
                cwd="/",
                user=self._as,
                group=self._as,
                extra_groups=[] if self._as is not None else None,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return
            self.stop()
        pytest.fail(f"pgbouncer did not start; its log:\n{self.read_log()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
                    conn.execute("SHOW VERSION")
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        """End it (by its own pid) and wait for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(DEADLINE_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def read_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def dsn(self, conninfo: str) -> str:
        """``conninfo``'s database and user, reached through this pgbouncer over TCP."""
        given = conninfo_to_dict(conninfo)
        dbname = given.get("dbname") or os.environ.get("PGDATABASE") or self.user
        return make_conninfo(
            "", host="127.0.0.1", port=self.port, dbname=dbname, user=given.get("user", self.user)
        )

    def admin_dsn(self) -> str:
        """Its admin console (SHOW POOLS, SHOW SERVERS...)."""
        return make_conninfo(
            "", host="127.0.0.1", port=self.port, dbname="pgbouncer", user=self.user
        )

    def show(self, what: str) -> list[dict[str, object]]:
        """``SHOW <what>`` of the admin console, as dicts (``what`` is a word like POOLS)."""
        assert what.isalpha(), what
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            cur = conn.execute(f"SHOW {what}")  # a word, checked above
            names = [col.name for col in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def bouncer_fixture(pool_mode: str) -> Any:
    """A module-scoped fixture of a pgbouncer in ``pool_mode``, for a test module to bind to a
    name of its own: ``bouncer_transaction = bouncer_fixture("transaction")``. In transaction
    mode a client's transactions may each go to another server connection (no session state,
    no LISTEN, no protocol-level prepared statements in 1.18); in session mode a client keeps
    one server connection while it is connected."""

    @pytest.fixture(scope="module")
    def bouncer() -> Iterator[Bouncer]:
        running = Bouncer(pool_mode)
        running.start()
        try:
            yield running
        finally:
            running.close()

    return bouncer
