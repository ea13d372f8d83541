"""A real throwaway Postgres for tests: initdb into a fresh directory, one server on a free 127.0.0.1 port,
password auth, a fresh database per test, stop / kill / pause by PID.

Postgres refuses to run as root, and tests here run as root: the data directory is then handed to an
unprivileged user (`postgres` where the Debian package created it, else `nobody`) and the server runs as
that user. The data directory lives in its own directory under the system temp dir, not in pytest's
`tmp_path` (pytest makes those 0700 for root, so that user could not reach them); `stop()` removes it.
The binaries come from PATH or from /usr/lib/postgresql/<version>/bin (the Debian layout);
`running_postgres()` turns their absence into a skip, or a failure where the suite must be complete
(LLM_GATEWAY_REQUIRE_TOOLS=1), as the Redis fixtures do.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import Self

import pytest

from tests.support.real_engines import free_port

USER = "gw"
START_DEADLINE_S = 60.0  # a healthy start takes well under a second; a loaded machine still fits


class PostgresNotInstalled(RuntimeError):
    pass


def _bin_dir() -> Path:
    found = shutil.which("initdb")
    if found is not None:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    raise PostgresNotInstalled(
        "Postgres is not installed (apt-get install postgresql): no initdb on PATH or in /usr/lib"
    )


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user the server runs as when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresNotInstalled("running as root and neither a 'postgres' nor a 'nobody' user exists")


class PostgresServer:
    """One Postgres server. `url()` names a database on it; `new_database()` makes a fresh one."""

    def __init__(self, port: int | None = None) -> None:
        self.bin = _bin_dir()
        self.user = _run_as()
        self.port = port or free_port()
        self.password = "pw-" + secrets.token_hex(12)
        self.root = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.log = self.root / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._databases = 0

    def url(self, database: str = "postgres", password: str | None = None) -> str:
        pw = self.password if password is None else password
        return f"postgresql+asyncpg://{USER}:{pw}@127.0.0.1:{self.port}/{database}"

    def _as_user(self) -> dict[str, object]:
        """subprocess arguments that run a child as the unprivileged user (nothing when not root)."""
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "HOME": str(self.root)}

    def _initdb(self) -> None:
        self.sockets.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.user is not None:
            for path in (self.root, self.sockets, pwfile):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        out = subprocess.run(
            [
                str(self.bin / "initdb"),
                "--pgdata",
                str(self.data),
                "--username",
                USER,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            capture_output=True,
            env=self._env(),
            timeout=120,
            check=False,
            **self._as_user(),
        )
        if out.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.stderr.decode(errors='replace')[-2000:]}")

    def start(self) -> Self:
        if not self.data.exists():
            self._initdb()
        log = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                str(self.bin / "postgres"),
                "-D",
                str(self.data),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-k",
                str(self.sockets),
                # a test database: durability off, small footprint
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "shared_buffers=16MB",
                "-c",
                "max_connections=60",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self._env(),
            start_new_session=True,
            **self._as_user(),
        )
        log.close()
        self._wait_ready("start")
        return self

    def _wait_ready(self, what: str) -> None:
        """Until the postmaster accepts connections (`pg_isready`), or fail after START_DEADLINE_S."""
        assert self.proc is not None
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                check=False,
                timeout=10,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postgres did not {what}: {self.log.read_text()[-2000:]}")

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-At", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER],
            input=sql.encode(),
            capture_output=True,
            env={**self._env(), "PGPASSWORD": self.password, "PGDATABASE": database},
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"psql failed: {out.stderr.decode(errors='replace')}")
        return out.stdout.decode()

    def new_database(self) -> str:
        """A fresh, empty database on this server; its URL."""
        self._databases += 1
        name = f"test_{self._databases}"
        self.psql(f"CREATE DATABASE {name}")
        return self.url(name)

    def _pids(self) -> list[int]:
        """The postmaster and its children (each backend runs in a session of its own, so a process
        group signal would miss them)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        pids = [self.proc.pid]
        for status in Path("/proc").glob("[0-9]*/status"):
            try:
                ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
            except (OSError, StopIteration):
                continue  # gone meanwhile
            if int(ppid.split()[1]) == self.proc.pid:
                pids.append(int(status.parent.name))
        return pids

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self._pids():
            with suppress(ProcessLookupError):  # exited meanwhile
                os.kill(pid, sig)

    def stop(self) -> None:
        """Fast shutdown (SIGINT: clients are disconnected, as a restart would do); the data stays."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGCONT)  # a paused server cannot shut down
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """Sudden death of the whole server (postmaster and backends), as a crash would do it."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)

    def pause(self) -> None:
        """Freeze every process of the server (SIGSTOP): connections stay open, nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw every process (SIGCONT) and wait until the postmaster accepts connections again: it
        first works through what queued while it was frozen, which on a loaded machine takes a while."""
        self._signal(signal.SIGCONT)
        self._wait_ready("resume")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def _require(exc: Exception) -> None:
    if os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
        pytest.fail(str(exc))
    pytest.skip(str(exc))


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A started server for a fixture's lifetime; a missing Postgres skips (or fails, where required)."""
    try:
        server = PostgresServer()
    except PostgresNotInstalled as e:
        _require(e)
        raise
    with server:
        yield server
