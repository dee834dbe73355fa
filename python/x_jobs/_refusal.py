"""What a failed settlement was refused for: the values it sent, or anything else.

A settlement (the worker's ``complete_many`` and ``fail``, the relay's ``outbox_nack``) can fail
for two kinds of reasons, which must not be taken for each other:

- the database refused a value it was sent: an output past ``x_jobs.max_payload_bytes``
  (X_PAYLOAD_TOO_LARGE) or another x_jobs refusal of an argument, JSON that jsonb cannot hold
  (NaN, a lone surrogate, ``\\u0000``: class 22, data_exception), a value past what PostgreSQL
  can hold (class 54, program_limit_exceeded); or psycopg could not send it at all (it raises
  before anything is sent). Sent again, it would be refused again: the job fails for its output,
  a message's failure is not recorded (its lease lapses);
- anything else, which says nothing of the values: a lost or refused connection (class 08,
  57P0x), a pooler's answer to a prepared statement that is not on the server connection it
  chose (26000 invalid_sql_statement_name, 42P05 duplicate_prepared_statement), a read-only
  transaction during a failover (25006), a serialization failure or a deadlock (40001, 40P01),
  a server short of resources (class 53), an internal error (XX000), psycopg's own protocol and
  interface errors. The settlement is sent again, on a new connection and with backoff, and the
  outcome is kept as it was: a job that succeeded is not failed for an error of the way to the
  database.

Decided by the SQLSTATE, in this one place, for the worker and the relay alike.
"""

from __future__ import annotations

import logging

import psycopg

from x_jobs.errors import InvalidArgument, translate

logger = logging.getLogger(__name__)

#: The SQLSTATE classes of a value the database refuses: data_exception, program_limit_exceeded.
_VALUE_CLASSES = frozenset({"22", "54"})

#: What a dumper raises for a value it cannot write (``json.dumps`` of an object, a number too
#: big): psycopg passes it on as it is, and nothing was sent.
_UNDUMPABLE = (TypeError, ValueError, OverflowError, RecursionError)


def refuses_value(err: BaseException) -> bool:
    """Whether ``err``, raised by a settlement, refuses one of the values it sent (see above):
    only then may the settlement be changed (a job failed for its output). Anything else is
    sent again as it was."""
    if isinstance(err, psycopg.Error):
        state = err.sqlstate
        if state is None:
            # Raised by psycopg itself, before anything is sent: a NUL in a text value
            # (DataError), a Python type it cannot adapt (ProgrammingError). Its other errors
            # without a SQLSTATE are the connection's or the protocol's.
            return isinstance(err, psycopg.DataError | psycopg.ProgrammingError)
        if state[:2] in _VALUE_CLASSES:
            return True
        return isinstance(translate(err), InvalidArgument)
    return isinstance(err, _UNDUMPABLE)


def described(err: BaseException) -> str:
    """``err`` for a log line: its first line, with the SQLSTATE when it has one."""
    text = str(err).strip().splitlines()
    head = text[0] if text else type(err).__name__
    state = getattr(err, "sqlstate", None)
    return f"{head} (SQLSTATE {state})" if state else head
