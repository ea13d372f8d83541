"""The usage ledger's crash spool: what a `kill -9` would otherwise lose, on local disk, replayed at start.

One spool per process, two files in `<server.data_dir>/ledger-spool/` named after the process:
`<pid>-<tag>.rows` holds the finished rows that may not be in the database yet (JSON lines after a
header line naming the columns; appended, emptied once the database has them all), and
`<pid>-<tag>.open` the requests in flight at the last checkpoint, as the rows they would leave if the
process died now (`outcome: interrupted`), replaced whole at each checkpoint. The ledger's background
writer (observability/ledger.py) writes both once per flush, in a worker thread: nothing here runs on
the request path or on the event loop. Files are 0600 in a 0700 directory, as the database is.

The `.rows` file is held under an exclusive `flock` for the life of the process, so a spool whose lock
can be taken belongs to a process that is gone: `recover` takes those (several replicas may share a
data_dir, and only dead ones' spools are taken), and the caller deletes them (`Recovered.remove`) once
their rows are in the database. A line cut by the crash is skipped. No fsync: a killed process's writes
are in the kernel's page cache and survive it; a power cut may still lose the last flush's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from llm_gateway.background import yield_cpu

log = logging.getLogger("gateway.usage")

ROWS, OPEN = ".rows", ".open"


def _private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


#: rows encoded between two hand-overs of the core to the event loop (`yield_cpu`): ~0.1 ms of work
CHUNK_ROWS = 128


def _rows(rows: Sequence[Sequence[Any]]) -> bytes:
    """One JSON line per row, `CHUNK_ROWS` at a time with the core handed to the loop after each chunk (a
    request arriving meanwhile waits for one chunk, not the batch). Each `orjson.dumps` result is dropped as
    soon as its line is made: holding them all for one join (`b"\n".join(map(orjson.dumps, rows))`, fewer
    instructions) page-faults ~0.8 times a row in the kernel as the allocator gives the memory back and takes it
    again, 8x the wall time for 500 rows."""
    lines: list[bytes] = []
    for i in range(0, len(rows), CHUNK_ROWS):
        lines += [orjson.dumps(r) + b"\n" for r in rows[i : i + CHUNK_ROWS]]
        yield_cpu()
    return b"".join(lines)


def _lines(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    return orjson.dumps({"columns": list(columns)}) + b"\n" + _rows(rows)


class Spool:
    """This process's spool (see the module's docstring). Every method does file I/O: call it off the loop."""

    def __init__(self, directory: Path, columns: Sequence[str]) -> None:
        _private_dir(directory)
        self.columns = tuple(columns)
        stem = f"{os.getpid()}-{secrets.token_hex(4)}"
        self.rows_path = directory / (stem + ROWS)
        self.open_path = directory / (stem + OPEN)
        self._fd = os.open(self.rows_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise
        self._header = orjson.dumps({"columns": list(self.columns)}) + b"\n"
        self._size = 0  # bytes of rows in the file (0: empty, its header not written yet)

    @property
    def holds_rows(self) -> bool:
        return self._size > 0

    def write(self, rows: Sequence[Sequence[Any]], open_rows: Sequence[Sequence[Any]] | None) -> None:
        """Append finished rows, then (when given) replace the snapshot of the requests in flight. In this
        order: a request that ended between two checkpoints is in the rows before it leaves the snapshot."""
        if rows:
            data = _rows(rows)
            if self._size == 0:
                data = self._header + data
            os.write(self._fd, data)
            self._size += len(data)
        if open_rows is not None:
            if not open_rows:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.open_path)
                return
            tmp = self.open_path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, _lines(self.columns, open_rows))
            finally:
                os.close(fd)
            os.replace(tmp, self.open_path)

    def clear(self) -> None:
        """The database has every row this file held."""
        os.ftruncate(self._fd, 0)
        self._size = 0

    def close(self, *, keep_rows: bool) -> None:
        """At a clean shutdown: nothing is in flight any more; the rows file stays only when it holds rows
        the database could not take (the next start writes them)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.open_path)
        if not keep_rows:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.rows_path)
        os.close(self._fd)


@dataclass
class Recovered:
    """The spools of processes that are gone: their finished rows and their requests that were in flight,
    each as a dict of the columns it was written with. Their files stay locked until `remove`."""

    finished: list[dict[str, Any]] = field(default_factory=list)
    interrupted: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    _fds: list[int] = field(default_factory=list)

    def remove(self) -> None:
        """Their rows are in the database: delete the files (then let the locks go)."""
        for path in self.files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self.release()

    def release(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def recover(directory: Path) -> Recovered:
    """Read (and lock) every spool in `directory` whose process is gone."""
    found = Recovered()
    if not directory.is_dir():
        return found
    for rows_path in sorted(directory.glob("*" + ROWS)):
        try:
            fd = os.open(rows_path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # a live process's spool
            os.close(fd)
            continue
        found._fds.append(fd)
        open_path = rows_path.with_suffix(OPEN)
        found.files += [rows_path, open_path]
        found.finished += _read(rows_path)
        found.interrupted += _read(open_path)
    for orphan in directory.glob("*" + OPEN):  # a snapshot whose rows file is gone (never the case alive)
        if orphan.with_suffix(ROWS).exists():
            continue
        found.interrupted += _read(orphan)
        found.files.append(orphan)
    return found


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    columns: list[str] | None = None
    out: list[dict[str, Any]] = []
    skipped = 0
    for line in data.splitlines():
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:  # the line the crash cut
            skipped += 1
            continue
        if isinstance(value, dict) and isinstance(value.get("columns"), list):
            columns = [str(c) for c in value["columns"]]
        elif isinstance(value, list) and columns is not None and len(value) == len(columns):
            out.append(dict(zip(columns, value, strict=True)))
        else:
            skipped += 1
    if skipped:
        log.warning("usage ledger spool %s: %d unreadable lines skipped", path.name, skipped)
    return out
