"""A primary with a synchronous streaming standby, for the failover tests.

:class:`Pair` starts two servers of its own beside the test server (``initdb``, then
``pg_basebackup -R`` of it), each on a loopback port and a Unix socket in one temporary
directory, with this checkout's x_jobs staged as the test server has it (its
``extension_destdir``). The primary waits for the standby to flush every commit
(``synchronous_standby_names``, ``synchronous_commit = on``), so a commit a client was told of is
on the standby too: what a failover promises to keep. :meth:`Pair.dsn` is the multi-host DSN a
client gives to follow the primary (``target_session_attrs=read-write``).

fsync stays off, as in every test server: the servers are killed, never the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

import psycopg
from conftest import Conn, free_port, wait_for
from psycopg.conninfo import make_conninfo

#: The application_name the standby streams under, which synchronous_standby_names names.
STANDBY_NAME = "x_jobs_standby"


def _bindir() -> Path:
    """The server binaries (Debian's pg_config points at wrappers in /usr/bin)."""
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    bindir = Path(out.stdout.strip())
    if (bindir / "initdb").exists():
        return bindir
    version = subprocess.run(
        ["pg_config", "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    return Path(f"/usr/lib/postgresql/{version.split('.')[0]}/bin")


class Server:
    """One server of the pair: its data directory, port and postmaster."""

    def __init__(self, pair: Pair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.data = pair.root / name
        self.port = free_port()

    def conninfo(self, dbname: str = "postgres") -> str:
        return make_conninfo("", host="127.0.0.1", port=self.port, dbname=dbname, user="postgres")

    def connect(self, dbname: str = "postgres") -> Conn:
        return psycopg.connect(self.conninfo(dbname), autocommit=True, connect_timeout=5)

    def pg_ctl(self, *args: str) -> None:
        log = str(self.pair.root / f"{self.name}.log")
        self.pair.run(str(self.pair.bindir / "pg_ctl"), "-D", str(self.data), "-l", log, *args)

    def start(self) -> None:
        self.pg_ctl("-w", "start")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """kill -9 of the postmaster and every process it started: the host is gone."""
        pid = self.postmaster_pid()
        children = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        for victim in [pid, *map(int, children)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, f"the {self.name}'s postmaster to die")

    def log(self) -> str:
        path = self.pair.root / f"{self.name}.log"
        return path.read_text(errors="replace") if path.exists() else ""


class Pair:
    """A primary and its synchronous standby, stopped and removed on exit."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        # Under /tmp and world-traversable: the servers run as postgres when the tests are root.
        self.root = Path(tempfile.mkdtemp(prefix="xjfo.", dir="/tmp"))
        self.root.chmod(0o755)
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        self.primary = Server(self, "primary")
        self.standby = Server(self, "standby")

    def run(self, *command: str) -> None:
        done = subprocess.run(
            [*self.as_owner, *command], cwd="/", capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"

    def __enter__(self) -> Pair:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _start(self) -> None:
        if self.as_owner:
            shutil.chown(self.root, "postgres")
        with psycopg.connect(autocommit=True) as test_server:
            row = test_server.execute("SHOW extension_destdir").fetchone()
        stage = row[0] if row else ""
        primary = self.primary
        self.run(
            str(self.bindir / "initdb"), "--no-sync", "-A", "trust", "-U", "postgres",
            "-D", str(primary.data),
        )  # fmt: skip
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {primary.port}\n"
                f"unix_socket_directories = '{self.root}'\nextension_destdir = '{stage}'\n"
                "wal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n"
                f"synchronous_standby_names = '{STANDBY_NAME}'\nsynchronous_commit = on\n"
                "fsync = off\nfull_page_writes = off\nmax_connections = 100\n"
            )
        primary.start()
        standby = self.standby
        self.run(
            str(self.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port),
            "-U", "postgres", "-D", str(standby.data), "-X", "stream", "-R",
        )  # fmt: skip
        with (standby.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary.port} user=postgres"
                f" application_name={STANDBY_NAME}'\n"
            )
        with (standby.data / "postgresql.conf").open("a") as conf:
            # Once promoted it has no standby of its own to wait for (an HA manager rewrites
            # this at the promotion; here it is set beforehand, as a standby ignores it).
            conf.write(f"port = {standby.port}\nsynchronous_standby_names = ''\n")
        standby.start()

        def streaming_in_sync() -> bool:
            with primary.connect() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM pg_catalog.pg_stat_replication"
                    " WHERE application_name = %s AND sync_state = 'sync'",
                    [STANDBY_NAME],
                ).fetchone()
            return bool(row and row[0] == 1)

        wait_for(streaming_in_sync, "the standby to stream in sync")

    def close(self) -> None:
        for server in (self.primary, self.standby):
            if (server.data / "postmaster.pid").exists():
                with contextlib.suppress(OSError, ValueError, AssertionError):
                    server.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, dbname: str) -> str:
        """The multi-host DSN that follows the primary, whichever server it is."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port}"
            f" dbname={dbname} user=postgres target_session_attrs=read-write"
        )

    def promote(self) -> None:
        """Promote the standby and wait until it takes writes."""
        self.standby.pg_ctl("-w", "promote")

        def writable() -> bool:
            with self.standby.connect() as conn:
                row = conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone()
            return bool(row and not row[0])

        wait_for(writable, "the promoted standby to take writes")

    def replayed(self, dbname: str) -> None:
        """Wait until the standby has replayed everything the primary committed, and can be
        read (a database created on the primary, say)."""
        with self.primary.connect() as conn:
            row = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        target = row[0]

        def caught_up() -> bool:
            try:
                with self.standby.connect(dbname) as conn:
                    got = conn.execute(
                        "SELECT pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn", [target]
                    ).fetchone()
                return bool(got and got[0])
            except psycopg.OperationalError:
                return False  # the database's creation not replayed yet

        wait_for(caught_up, "the standby to replay the primary's commits")
