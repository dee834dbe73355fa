"""The CPU time the PostgreSQL server's processes have used, read from /proc, so that a benchmark
can say how much of the server one job costs: with workers on other hosts, the database is the
one shared resource.

Works only when the server runs on this host (in this PID namespace) and its processes can be
read (the same user, or root); `ServerCpu.find` answers None otherwise, and callers print n/a.

The server is the postmaster and its children (backends, autovacuum, the WAL writer, the
checkpointer...). A live process is read from /proc/PID/schedstat, in nanoseconds; a child that
has exited is counted in the postmaster's cutime and cstime (clock ticks) once it is reaped. A
sample is the sum of both, so a backend that disconnects between two samples is not lost, only
rounded to a tick.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psycopg

_TICK = 1.0 / os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces), so that
    field N of proc(5) is at index N - 3."""
    text = (_PROC / str(pid) / "stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def backend_seconds(pid: int) -> float:
    """CPU seconds one single-threaded process (a server backend) used, from schedstat
    (nanoseconds). schedstat counts one thread only: for the workers, processes_seconds."""
    return int((_PROC / str(pid) / "schedstat").read_text().split()[0]) / 1e9


def processes_seconds(pids: list[int]) -> float:
    """CPU seconds (user and system, every thread, reaped children included) the processes used
    so far: proc(5) fields 14 to 17 of /proc/PID/stat, in clock ticks."""
    return sum(sum(int(f) for f in _stat_fields(pid)[11:15]) * _TICK for pid in pids)


@dataclass(frozen=True)
class ServerCpu:
    postmaster: int

    @classmethod
    def find(cls, conn: psycopg.Connection) -> ServerCpu | None:
        """The server `conn` is connected to, if its processes are readable here."""
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        try:
            status = (_PROC / str(row[0]) / "status").read_text()
            ppid = int(next(x for x in status.splitlines() if x.startswith("PPid:")).split()[1])
            cmdline = (_PROC / str(ppid) / "cmdline").read_bytes()
            backend_seconds(ppid)
        except (OSError, StopIteration, ValueError):
            return None
        if b"postgres" not in cmdline:
            return None
        return cls(ppid)

    def seconds(self, excluding: frozenset[int] = frozenset()) -> float:
        """CPU seconds (user and system) of the server's processes so far, exited ones
        included, but for the live backends ``excluding`` names (a benchmark's own sessions)."""
        fields = _stat_fields(self.postmaster)
        # cutime and cstime, proc(5) fields 16 and 17: the children reaped so far.
        total = backend_seconds(self.postmaster) + (int(fields[13]) + int(fields[14])) * _TICK
        for entry in _PROC.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                pid = int(entry.name)
                if pid not in excluding and int(_stat_fields(pid)[1]) == self.postmaster:
                    total += backend_seconds(pid)
            except (OSError, ValueError):
                continue  # gone meanwhile: counted in cutime once reaped
        return total
