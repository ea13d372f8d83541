"""Coding-agent CLIs as gateway clients in tests: where Claude Code is installed, the environment that makes
it talk to the gateway and nothing else, and a network namespace with only loopback to prove it.

Claude Code is the npm package ``@anthropic-ai/claude-code`` (a native binary inside the registry package;
Node.js only runs its postinstall). ``scripts/setup_dev.sh`` installs the version it pins into
``$LLM_GATEWAY_CACHE/claude-code-<version>`` (default ``~/.cache/llm-gateway``); :func:`claude_code_binary`
reads the pin from that script, so the two never disagree. ``$CLAUDE_CODE_BIN`` points at another binary.

Codex is the npm package ``@openai/codex`` (a Node launcher, ``bin/codex.js``, that runs the native binary of
the platform package npm put beside it). ``scripts/setup_dev.sh`` installs its pin into
``$LLM_GATEWAY_CACHE/codex-<version>``; :func:`codex_binary` reads that pin the same way. ``$CODEX_BIN``
points at another binary. :func:`write_codex_home` writes the ``config.toml`` that makes it a gateway client
and nothing else, :func:`codex_env` the environment it runs in.

The Vercel AI SDK is the npm packages ``ai`` and ``@ai-sdk/openai`` (with ``zod``, its peer): a library, not a
CLI. ``scripts/setup_dev.sh`` installs its pins into ``$LLM_GATEWAY_CACHE/ai-sdk-<ai>-openai-<provider>``;
:func:`ai_sdk_node_modules` reads those pins the same way and finds the ``node_modules`` a test script imports
from. ``$AI_SDK_NODE_MODULES`` points at another.

No other traffic: :func:`loopback_only_argv` wraps a command in ``unshare -rn`` (a new user and network
namespace: the only interface is ``lo``, which :func:`bring_loopback_up` brings up from inside), so any
connection to anything but 127.0.0.1 fails at once, with nothing sent anywhere.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.real_engines import SCRIPTS_DIR, cache_dir

SETUP_SCRIPT = SCRIPTS_DIR / "setup_dev.sh"
CLAUDE_CODE_PACKAGE = "@anthropic-ai/claude-code"
BIN_ENV_VAR = "CLAUDE_CODE_BIN"
VERSION_ENV_VAR = "CLAUDE_CODE_VERSION"


class AgentCliMissing(RuntimeError):
    """The CLI (or what isolating it needs) is not available on this machine."""


def claude_code_version() -> str:
    """The pinned version: ``$CLAUDE_CODE_VERSION``, else the default in scripts/setup_dev.sh."""
    given = os.environ.get(VERSION_ENV_VAR)
    if given:
        return given
    m = re.search(r"CLAUDE_CODE_VERSION=\$\{CLAUDE_CODE_VERSION:-([^}]+)\}", SETUP_SCRIPT.read_text())
    if m is None:
        raise AgentCliMissing(f"no CLAUDE_CODE_VERSION=${{CLAUDE_CODE_VERSION:-...}} pin in {SETUP_SCRIPT}")
    return m.group(1)


def claude_code_dir() -> Path:
    """Where scripts/setup_dev.sh installs the pinned version (its npm --prefix)."""
    return cache_dir() / f"claude-code-{claude_code_version()}"


def claude_code_binary() -> Path:
    """The ``claude`` binary: ``$CLAUDE_CODE_BIN``, else the cached install; AgentCliMissing if neither."""
    given = os.environ.get(BIN_ENV_VAR)
    path = Path(given) if given else claude_code_dir() / "node_modules" / ".bin" / "claude"
    if not os.access(path, os.X_OK):
        raise AgentCliMissing(
            f"Claude Code is not installed (looked for {path}): run scripts/setup_dev.sh (npm install --prefix "
            f"{claude_code_dir()} {CLAUDE_CODE_PACKAGE}@{claude_code_version()}) or point {BIN_ENV_VAR} at a binary"
        )
    return path


def claude_code_env(*, base_url: str, api_key: str, model: str, home: Path, max_output_tokens: int) -> dict[str, str]:
    """The whole environment of a non-interactive ``claude -p`` run against the gateway (nothing inherited,
    so a developer's own ANTHROPIC_* variables or proxy settings cannot leak in).

    - ``ANTHROPIC_BASE_URL`` / ``ANTHROPIC_API_KEY``: the gateway and one of its keys (sent as x-api-key).
    - ``ANTHROPIC_MODEL`` and every small/background model variable: a public model of the gateway, so no
      call names a model the gateway does not know.
    - ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``, ``DISABLE_TELEMETRY``, ``DISABLE_AUTOUPDATER``,
      ``DISABLE_ERROR_REPORTING``: no telemetry, update checks or error reports (the namespace would refuse
      them anyway; this keeps the CLI from waiting on them).
    - not ``CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS``: Claude Code's default betas (``context_management``
      edits that clear earlier thinking, ``anthropic-beta`` headers) must work through the gateway as sent.
    - ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``: the ``max_tokens`` it asks for (default 32,000), kept small.
    - ``HOME`` (and the XDG dirs) a fresh directory: no login, settings, memory or history of the user's.
    """
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(max_output_tokens),
    }


# -- Codex CLI --------------------------------------------------------------------------------------------

CODEX_PACKAGE = "@openai/codex"
CODEX_BIN_ENV_VAR = "CODEX_BIN"
CODEX_VERSION_ENV_VAR = "CODEX_VERSION"
#: The variable Codex reads the gateway key from (the provider's ``env_key``), sent as ``Authorization: Bearer``.
CODEX_KEY_ENV_VAR = "LLM_GATEWAY_API_KEY"
CODEX_PROVIDER = "llm-gateway"


def codex_version() -> str:
    """The pinned version: ``$CODEX_VERSION``, else the default in scripts/setup_dev.sh."""
    given = os.environ.get(CODEX_VERSION_ENV_VAR)
    if given:
        return given
    m = re.search(r"CODEX_VERSION=\$\{CODEX_VERSION:-([^}]+)\}", SETUP_SCRIPT.read_text())
    if m is None:
        raise AgentCliMissing(f"no CODEX_VERSION=${{CODEX_VERSION:-...}} pin in {SETUP_SCRIPT}")
    return m.group(1)


def codex_dir() -> Path:
    """Where scripts/setup_dev.sh installs the pinned version (its npm --prefix)."""
    return cache_dir() / f"codex-{codex_version()}"


def codex_binary() -> Path:
    """The ``codex`` launcher: ``$CODEX_BIN``, else the cached install; AgentCliMissing if neither."""
    given = os.environ.get(CODEX_BIN_ENV_VAR)
    path = Path(given) if given else codex_dir() / "node_modules" / ".bin" / "codex"
    if not os.access(path, os.X_OK):
        raise AgentCliMissing(
            f"Codex is not installed (looked for {path}): run scripts/setup_dev.sh (npm install --prefix "
            f"{codex_dir()} {CODEX_PACKAGE}@{codex_version()}) or point {CODEX_BIN_ENV_VAR} at a binary"
        )
    return path


def write_codex_home(codex_home: Path, *, base_url: str, model: str) -> Path:
    """Write ``$CODEX_HOME/config.toml`` for a non-interactive ``codex exec`` whose only server is the gateway
    (every key is one Codex 0.171 knows: the test runs it with ``--strict-config``); returns the file.

    - ``[model_providers.llm-gateway]``: ``base_url`` the gateway's ``/v1`` (Codex appends ``/responses``),
      ``wire_api = "responses"`` (the only wire API Codex has), ``env_key`` naming :data:`CODEX_KEY_ENV_VAR`;
      no retries, so a refusal is final at once. ``model`` a public model of the gateway.
    - ``approval_policy = "never"``, ``sandbox_mode = "read-only"``: nothing is asked, nothing written.
    - ``[analytics] enabled = false`` (else it reaches for ab.chatgpt.com and waits on it, ~5 s),
      ``[feedback] enabled = false``, ``check_for_update_on_startup = false``.
    - ``[features] plugins = false``: else it runs ``git ls-remote https://github.com/openai/plugins`` and
      looks up api.github.com to sync its plugin marketplace.
    - ``web_search = "disabled"`` and ``[agents] enabled = false``: by default Codex sends a built-in
      ``web_search`` tool and a ``namespace`` tool (``multi_agent_v1``, its sub-agent tools), which the
      gateway refuses with a 400 (only function tools reach an engine).
    - ``[history] persistence = "none"``: no history.jsonl.
    """
    codex_home.mkdir(parents=True, exist_ok=True)
    path = codex_home / "config.toml"
    path.write_text(
        f"""model = {json.dumps(model)}
model_provider = "{CODEX_PROVIDER}"
approval_policy = "never"
sandbox_mode = "read-only"
web_search = "disabled"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[features]
plugins = false

[agents]
enabled = false

[history]
persistence = "none"

[model_providers.{CODEX_PROVIDER}]
name = "llm-gateway"
base_url = {json.dumps(base_url.rstrip("/") + "/v1")}
env_key = "{CODEX_KEY_ENV_VAR}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    return path


def codex_env(*, api_key: str, codex_home: Path, home: Path) -> dict[str, str]:
    """The whole environment of a ``codex exec`` run against the gateway (nothing inherited, so a developer's
    own OPENAI_* variables, proxy settings or ~/.codex cannot leak in).

    - ``CODEX_HOME``: the folder :func:`write_codex_home` wrote (config, and whatever state Codex keeps).
    - :data:`CODEX_KEY_ENV_VAR`: the gateway key; no ``OPENAI_API_KEY``, no ``OPENAI_BASE_URL``.
    - ``HOME`` (and the XDG dirs) a fresh directory: no login, auth.json, AGENTS.md or config of the user's.
    """
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CODEX_HOME": str(codex_home),
        CODEX_KEY_ENV_VAR: api_key,
    }


# -- the Vercel AI SDK ----------------------------------------------------------------------------------------

AI_SDK_PACKAGES = ("ai", "@ai-sdk/openai", "zod")
AI_SDK_ENV_VAR = "AI_SDK_NODE_MODULES"


def _pin(name: str) -> str:
    """A version pinned in scripts/setup_dev.sh as ``NAME=${NAME:-version}``, or ``$NAME`` where set."""
    given = os.environ.get(name)
    if given:
        return given
    m = re.search(rf"{name}=\$\{{{name}:-([^}}]+)\}}", SETUP_SCRIPT.read_text())
    if m is None:
        raise AgentCliMissing(f"no {name}=${{{name}:-...}} pin in {SETUP_SCRIPT}")
    return m.group(1)


def ai_sdk_versions() -> dict[str, str]:
    """The pinned versions of the three packages."""
    return {
        "ai": _pin("AI_SDK_VERSION"),
        "@ai-sdk/openai": _pin("AI_SDK_OPENAI_VERSION"),
        "zod": _pin("AI_SDK_ZOD_VERSION"),
    }


def ai_sdk_dir() -> Path:
    """Where scripts/setup_dev.sh installs the pinned versions (its npm --prefix)."""
    v = ai_sdk_versions()
    return cache_dir() / f"ai-sdk-{v['ai']}-openai-{v['@ai-sdk/openai']}"


def ai_sdk_node_modules() -> Path:
    """The ``node_modules`` holding the pinned AI SDK: ``$AI_SDK_NODE_MODULES``, else the cached install;
    AgentCliMissing if the packages (at their pinned versions) are not there."""
    given = os.environ.get(AI_SDK_ENV_VAR)
    path = Path(given) if given else ai_sdk_dir() / "node_modules"
    for package, version in ai_sdk_versions().items():
        manifest = path / package / "package.json"
        found = json.loads(manifest.read_text()).get("version") if manifest.is_file() else None
        if found != version and not given:
            raise AgentCliMissing(
                f"the Vercel AI SDK is not installed (looked for {manifest} at {version}): run scripts/setup_dev.sh "
                f"(npm install --prefix {ai_sdk_dir()} ai @ai-sdk/openai zod at the pinned versions) or point "
                f"{AI_SDK_ENV_VAR} at a node_modules"
            )
    if shutil.which("node") is None:
        raise AgentCliMissing("node is not installed (apt-get install nodejs)")
    return path


# -- a network namespace with only loopback -------------------------------------------------------------

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = "16sH22x"  # struct ifreq: the name, then ifr_flags in the union (40 bytes in all)


def loopback_only_argv(argv: list[str]) -> list[str]:
    """``argv`` run in a fresh user + network namespace (``unshare -rn``): only ``lo``, and it starts down,
    so the command must call :func:`bring_loopback_up` first."""
    return ["unshare", "--user", "--map-root-user", "--net", "--", *argv]


@cache
def namespaces_unavailable() -> str | None:
    """Why :func:`loopback_only_argv` cannot work here (no unshare, user namespaces off), or None."""
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    res = subprocess.run(
        loopback_only_argv([sys.executable, "-c", "pass"]),
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if res.returncode != 0:
        return f"unshare -rn does not work here (exit {res.returncode}: {res.stderr.strip()})"
    return None


def bring_loopback_up() -> None:
    """Set ``lo`` up in the current network namespace (what ``ip link set lo up`` does, without iproute2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack(_IFREQ, b"lo", 0))
        flags = struct.unpack(_IFREQ, got)[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack(_IFREQ, b"lo", flags | _IFF_UP))


def network_interfaces() -> list[str]:
    """The interfaces of the current network namespace (by the kernel's own list; /sys/class/net would show
    those of the namespace sysfs was mounted in)."""
    return sorted(name for _, name in socket.if_nameindex())


__all__ = [
    "AI_SDK_PACKAGES",
    "CLAUDE_CODE_PACKAGE",
    "CODEX_KEY_ENV_VAR",
    "CODEX_PACKAGE",
    "AgentCliMissing",
    "ai_sdk_dir",
    "ai_sdk_node_modules",
    "ai_sdk_versions",
    "bring_loopback_up",
    "claude_code_binary",
    "claude_code_dir",
    "claude_code_env",
    "claude_code_version",
    "codex_binary",
    "codex_dir",
    "codex_env",
    "codex_version",
    "loopback_only_argv",
    "namespaces_unavailable",
    "network_interfaces",
    "write_codex_home",
]


# -- running a CLI and reading what the gateway saw ------------------------------------------------------


def run_cli(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float) -> dict[str, Any]:
    """Run the CLI in its own process group, killed whole when it outlasts `timeout_s`."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own process group: the CLI and whatever it started
        stdout, stderr = proc.communicate()
        timed_out = True
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return {"rc": proc.returncode, "stdout": stdout, "stderr": stderr, "timed_out": timed_out}


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:]


def access_log(path: Path) -> list[dict[str, Any]]:
    """The gateway's access records (JSON lines of the ``gateway.access`` logger in its output)."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("logger") == "gateway.access":
                records.append(rec)
    return records
