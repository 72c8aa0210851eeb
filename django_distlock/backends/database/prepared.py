"""Statements that session mode runs on PostgreSQL straight through libpq.

Session mode's acquire and release are one statement each, and the point of the mode
is to cost what the raw advisory-lock calls cost. psycopg's cursor spends about 50 µs
of Python per statement around libpq's own call (its query conversion, its generators,
its result loaders: some 50 calls), as much as the statement's round trip on a local
server. So the mode prepares its statements on each of its sessions by name, once, and
runs them with ``PGconn.exec_prepared`` (libpq's ``PQexecPrepared``, which lets go of
the GIL while it waits): text parameters in, text values out, no cursor. The sessions
are the backend's own (never Django's connections), in autocommit; the statements off
the hot path (the session's setup, a name's row made once, ``extend()``'s check, the
listings) still go through the session's psycopg cursor, each run to its end, so the
two never interleave.

A failure is psycopg's own exception, as its cursor would raise it (``errors.py`` maps
it): the server's error by its SQLSTATE; a connection that broke under the call (the
server gone, the watchdog's cut) :class:`psycopg.OperationalError`.
"""

from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psycopg.pq.abc import PGconn

#: A value as libpq gives it: text, or None for NULL.
Text = bytes | None

_TUPLES_OK = 2  # psycopg.pq.ExecStatus.TUPLES_OK, not imported: psycopg 3 is optional
_COMMAND_OK = 1
_CONNECTION_OK = 0


class Prepared:
    """One statement, prepared on a session at its first use there (under ``name``) and
    run by name after."""

    __slots__ = ("name", "sql")

    def __init__(self, name: str, sql: str) -> None:
        """:param name: the statement's name, unique among the mode's statements.
        :param sql: the statement, ``%s`` for each parameter (as a cursor takes it)."""
        numbers = itertools.count(1)
        #: The server's name for it (psycopg's own are ``_pg3_<n>``: no clash).
        self.name = f"django_distlock_{name}".encode()
        #: The statement as libpq prepares it (``$1``, ``$2``...).
        self.sql = re.sub("%s", lambda _: f"${next(numbers)}", sql).encode()


def fetch(pgconn: PGconn, prepared: set[bytes], statement: Prepared,
          params: list[bytes]) -> tuple[Text, ...] | None:
    """Run ``statement`` on ``pgconn`` (preparing it first if its name is not in
    ``prepared``, the session's set, which this adds it to) and return its first row,
    or None when it has none.

    :raises psycopg.Error: the server refused it, or the connection failed.
    """
    name = statement.name
    if name not in prepared:
        result = pgconn.prepare(name, statement.sql)
        if result.status != _COMMAND_OK:
            raise _error(pgconn, result)
        prepared.add(name)
    result = pgconn.exec_prepared(name, params)
    if result.status != _TUPLES_OK:
        raise _error(pgconn, result)
    if not result.ntuples:
        return None
    fields = result.nfields
    if fields == 1:  # the mode's statements give one or two values: no loop for them
        return (result.get_value(0, 0),)
    if fields == 2:
        return result.get_value(0, 0), result.get_value(0, 1)
    return tuple(result.get_value(0, i) for i in range(fields))


def _error(pgconn: PGconn, result: object) -> Exception:
    """The exception for a failed ``result``: the server's error by its SQLSTATE, as
    psycopg's cursor raises it; a connection that broke, :class:`psycopg.OperationalError`
    with libpq's message (which carries the server's last words, "terminating connection
    due to administrator command" for a session it ended)."""
    import psycopg
    from psycopg import errors

    error = errors.error_from_result(result, encoding="utf-8")  # type: ignore[arg-type]
    if pgconn.status != _CONNECTION_OK and getattr(error, "sqlstate", None) is None:
        message = pgconn.error_message.decode("utf-8", "replace").strip()
        return psycopg.OperationalError(message or "the connection to the server was lost")
    return error
