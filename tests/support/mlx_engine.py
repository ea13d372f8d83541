"""A real MLX-LM server (`mlx_lm.server`) for the contract suite: the venv and tiny model of scripts/install_mlx.sh.

MLX-LM reports no load (no `/metrics`), so what it is doing is read from its process, as for Ollama: it
burns CPU while it generates and none when idle (`cpu_seconds`), and it logs one line per request it
answered (`BaseHTTPRequestHandler.log_request`: `"POST /v1/chat/completions HTTP/1.1" 200 -`), which counts
the generations it was asked for. It is HTTP/1.0 and closes every connection after its answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.real_engines import (
    EngineInstallError,
    RealEngine,
    _http_status,
    _script_check,
    cpu_seconds,
)


def mlx_install(install: bool | None = None) -> tuple[Path, Path]:
    """Return ``(python, tiny_model_dir)`` of the cached MLX-LM venv (``scripts/install_mlx.sh``)."""
    lines = _script_check("install_mlx.sh", install, "MLX-LM (mlx-lm[cpu])", timeout=900)
    if len(lines) < 2:
        raise EngineInstallError(f"install_mlx.sh printed {lines!r}, expected model dir and python")
    return Path(lines[-1]), Path(lines[-2])


class MlxServer(RealEngine):
    """``PY -m mlx_lm server --model DIR --host 127.0.0.1 --port N``; ready when ``/health`` is 200.

    The served model's name is its directory (``model`` after start). ``HF_HUB_CACHE`` points at an empty
    folder of the work dir: without an existing cache folder its ``/v1/models`` is a 200 with an empty body.
    """

    name = "mlx"
    default_startup_timeout = 60.0

    def __init__(
        self,
        *,
        workdir: Path | str | None = None,
        port: int | None = None,
        startup_timeout: float | None = None,
        install: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            model="",
            port=port,
            workdir=workdir,
            startup_timeout=startup_timeout,
            install=install,
            extra_args=extra_args,
            env=env,
        )
        self.python: Path | None = None
        self.parallel = 1

    def _prepare(self) -> None:
        self.python, model_dir = mlx_install(self.install)
        self.model = str(model_dir)

    def _env(self) -> dict[str, str]:
        env = super()._env()
        cache = self.workdir / "hf-cache"
        cache.mkdir(exist_ok=True)
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_CACHE=str(cache))
        return env

    def _command(self) -> list[str]:
        assert self.python is not None
        cmd = [str(self.python), "-m", "mlx_lm", "server", "--model", self.model]
        return [*cmd, "--host", "127.0.0.1", "--port", str(self.port), *self.extra_args]

    def _ready(self) -> bool:
        return _http_status(self.url + "/health") == 200

    def cpu_seconds(self) -> float:
        """CPU seconds its process has used (it generates on its own threads)."""
        return cpu_seconds(self.pid)

    def requests_logged(self, path: str) -> int:
        """The requests to `path` it has answered, by its own log."""
        return self.log_text().count(f'"POST {path} HTTP/1.1"')
