"""A database that cannot serve now, told apart from everything else: driver and pool failures become
`DatabaseUnavailable` (503) naming the kind of failure, never the URL or the statement's parameters, and
chained to the driver's own exception (SQLAlchemy's wrapper carries the parameters: user content).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc

from llm_gateway.errors import DatabaseUnavailable

_UNAVAILABLE_SQLSTATE_CLASSES = frozenset({"08", "28", "3D", "53", "57"})
_LOCK_NOT_AVAILABLE = "55P03"
_QUERY_CANCELED = "57014"
#: query parameters whose value is a secret (asyncpg/libpq `password`, `sslpassword`; any `*secret*`, `*token*`)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise a database that cannot serve now as `DatabaseUnavailable`; anything else (a bug, a
    duplicate id) passes unchanged."""
    try:
        yield
    except DatabaseUnavailable:
        raise
    except Exception as e:
        reason = _unavailable_reason(e)
        if reason is None:
            raise
        raise DatabaseUnavailable(f"the gateway's database is unavailable ({reason}); try again later") from (
            _driver_error(e)
        )


def _driver_error(e: BaseException) -> BaseException:
    """The driver's own exception under SQLAlchemy's wrappers (asyncpg's is the adapter's cause)."""
    if not isinstance(e, exc.DBAPIError) or e.orig is None:
        return e
    return e.orig.__cause__ if e.orig.__cause__ is not None else e.orig


def _unavailable_reason(e: Exception) -> str | None:
    """Why the database cannot serve, in words that name no secret; None when that is not the failure."""
    if isinstance(e, exc.TimeoutError):  # SQLAlchemy's: the pool had no free connection in time
        return "no free connection in time"
    if isinstance(e, exc.DBAPIError):
        driver = _driver_error(e)
        sqlstate = getattr(driver, "sqlstate", None) or getattr(e.orig, "sqlstate", None)
        if isinstance(sqlstate, str) and (
            sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or sqlstate == _LOCK_NOT_AVAILABLE
        ):
            return _describe(driver)
        if e.connection_invalidated or isinstance(e, exc.OperationalError | exc.InterfaceError):
            return _describe(driver)
        return None
    if isinstance(e, OSError | TimeoutError):  # raised by the drivers unwrapped: refused, unreachable, slow
        return _describe(e)
    if isinstance(e, sqlite3.OperationalError):  # the writer thread's own connection: locked, cannot open
        return _describe(e)
    sqlstate = getattr(e, "sqlstate", None)  # asyncpg's own, from insert_rows
    if isinstance(sqlstate, str) and (sqlstate[:2] in _UNAVAILABLE_SQLSTATE_CLASSES or sqlstate == _LOCK_NOT_AVAILABLE):
        return _describe(e)
    return None


def _describe(driver: BaseException) -> str:
    if isinstance(driver, TimeoutError) or getattr(driver, "sqlstate", None) == _QUERY_CANCELED:
        return "timed out"
    if isinstance(driver, sqlite3.Error):  # "database is locked", "unable to open database file"
        return str(driver)[:200]
    return type(driver).__name__
