"""A real NVIDIA Dynamo frontend with its simulated worker (`dynamo.mocker`), file discovery, no GPU: the venv and
model folder of scripts/install_dynamo.sh.

The frontend (`python -m dynamo.frontend --discovery-backend file`) answers `/live` at once; the mocker
registers the model through the discovery folder (`DYN_FILE_KV`), after which the frontend lists it in
`/v1/models`: the engine is ready then. The mocker simulates scheduling and timing and emits token ids that
decode to no text (its answers have `content: null`), so this target checks the frontend's surface (routes,
readiness, errors, metrics, usage), not text.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from tests.support.real_engines import EngineInstallError, RealEngine, _http_status, _script_check


def dynamo_install(install: bool | None = None) -> tuple[Path, Path]:
    """Return ``(python, model_dir)`` of the cached Dynamo venv (``scripts/install_dynamo.sh``)."""
    lines = _script_check("install_dynamo.sh", install, "NVIDIA Dynamo (ai-dynamo)", timeout=1800)
    if len(lines) < 2:
        raise EngineInstallError(f"install_dynamo.sh printed {lines!r}, expected model dir and python")
    return Path(lines[-1]), Path(lines[-2])


class DynamoServer(RealEngine):
    """The frontend on ``127.0.0.1:<port>`` and one mocker worker; ready once the model is listed."""

    name = "dynamo"
    default_startup_timeout = 120.0

    def __init__(self, *, workdir: Path | str | None = None, install: bool | None = None) -> None:
        super().__init__(model="", workdir=workdir, install=install)
        self.python: Path | None = None
        self.mocker: subprocess.Popen[bytes] | None = None

    def _prepare(self) -> None:
        self.python, model_dir = dynamo_install(self.install)
        self.model = str(model_dir)
        (self.workdir / "kv").mkdir(exist_ok=True)

    def _env(self) -> dict[str, str]:
        env = super()._env()
        env.update(DYN_FILE_KV=str(self.workdir / "kv"), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        return env

    def _command(self) -> list[str]:
        assert self.python is not None
        if self.mocker is None:  # the worker first: it registers through the folder whenever the frontend is up
            with open(self.workdir / "mocker.log", "ab") as log:
                self.mocker = subprocess.Popen(
                    [
                        str(self.python),
                        "-m",
                        "dynamo.mocker",
                        "--model-path",
                        self.model,
                        "--discovery-backend",
                        "file",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env(),
                    cwd=self.workdir,
                    start_new_session=True,
                )
        cmd = [str(self.python), "-m", "dynamo.frontend", "--discovery-backend", "file"]
        return [*cmd, "--http-host", "127.0.0.1", "--http-port", str(self.port)]

    def _ready(self) -> bool:
        if _http_status(self.url + "/live") != 200:
            return False
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                return any(m.get("id") == self.model for m in json.loads(r.read()).get("data", []))
        except (OSError, ValueError):
            return False

    def stop(self, timeout: float = 15.0) -> int | None:
        code = super().stop(timeout)
        mocker, self.mocker = self.mocker, None
        if mocker is not None and mocker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(mocker.pid, signal.SIGTERM)
            try:
                mocker.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(mocker.pid, signal.SIGKILL)
                mocker.wait(timeout=10)
        return code
