"""Starting and stopping the processes of managed engines: the seam between the swap manager and the OS.

`SubprocessLauncher` spawns an engine in a new session (its own process group, whose id is its PID) and
stops it by that group only: SIGTERM, then SIGKILL after a timeout. It never signals a process it did not
spawn: the group id is the PID of a child it started, signalled only while that child is not yet reaped.
Tests of the policy replace it with a fake (`Launcher` is the protocol).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, Protocol


class Process(Protocol):
    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


class Launcher(Protocol):
    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: Path | None) -> Process:
        """Start `argv` (the gateway's environment plus `env`); raises OSError when it cannot."""

    async def stop(self, proc: Process, timeout_s: float) -> None:
        """Stop it and everything in its process group; return once it has exited."""


def fill_placeholders(
    command: Sequence[str], env: Mapping[str, str], port: int | None, host: str | None, model: str
) -> tuple[list[str], dict[str, str]]:
    """`command` and `env` with `{port}`, `{host}` and `{model}` filled in (settings/managed.py)."""
    fill = {"{port}": str(port), "{host}": host or "", "{model}": model}

    def sub(s: str) -> str:
        for k, v in fill.items():
            s = s.replace(k, v)
        return s

    return [sub(a) for a in command], {k: sub(v) for k, v in env.items()}


class SubprocessLauncher:
    async def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: Path | None
    ) -> asyncio.subprocess.Process:
        full = {**os.environ, **env}
        f = _open_log(log) if log is not None else None
        out: int | object = f if f is not None else subprocess.DEVNULL
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                env=full,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,  # type: ignore[arg-type]
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped as a whole, and only it
            )
        finally:
            if f is not None:
                f.close()

    async def stop(self, proc: Process, timeout_s: float) -> None:
        if proc.returncode is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()


def _open_log(log: Path) -> BinaryIO:
    """The engine's log file, appended to (once per start, off the request path)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    return open(log, "ab")  # handed to the child; the caller closes it once the child has it


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
