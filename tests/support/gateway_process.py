"""Run the gateway as a real process (`python -m llm_gateway serve`) for end-to-end tests.

Writes the config to a file, starts the process on a free port, waits for `/healthz` (and, when
asked, `/readyz`), keeps its log, and stops it by PID with SIGTERM (then SIGKILL). Only processes
it started are touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Self

from tests.support.real_engines import REPO_ROOT, free_port


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return None


class GatewayProcess:
    def __init__(
        self,
        config: str,
        workdir: Path,
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        startup_timeout: float = 30.0,
        name: str = "gateway",
    ) -> None:
        self.workdir = workdir
        self.config_path = workdir / f"{name}.yaml"
        self.config_path.write_text(textwrap.dedent(config))
        self.log_path = workdir / f"{name}.log"
        self.port = port or free_port()
        self.env = env or {}
        self.wait_ready = wait_ready
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def write_config(self, text: str) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(textwrap.dedent(text))
        tmp.replace(self.config_path)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llm_gateway", "serve", "--config", str(self.config_path), "--port", str(self.port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout
        path = "/readyz" if self.wait_ready else "/healthz"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
            if http_status(self.url + path, 1.0) == 200:
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"gateway not ready within {self.startup_timeout}s:\n{self.log_text()[-3000:]}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
