"""A real coding-agent CLI through the gateway's Responses API: OpenAI's Codex CLI (npm ``@openai/codex``, the
version ``scripts/setup_dev.sh`` pins) answers one ``codex exec`` prompt non-interactively (``--json`` events
on stdout, ``--output-last-message`` to a file), its only model provider the gateway (a ``CODEX_HOME``
``config.toml`` with ``wire_api = "responses"``) as a real process in front of the vLLM emulator, and every
other connection impossible: the emulator, the gateway and the CLI run together in a fresh network namespace
whose only interface is loopback (``unshare -rn``, this module run as a script inside it), as in
tests/e2e/test_claude_code.py.

What Codex 0.171.0 does against the gateway (seen through a recording proxy, and under ``strace -e connect``,
while writing this):

- endpoints: exactly one ``POST /v1/responses`` for a one-turn prompt, streamed (``stream: true``, ``accept:
  text/event-stream``). No ``/v1/models``, no websocket (the provider has ``supports_websockets = false``).
- headers: ``authorization: Bearer`` (the provider's ``env_key``), ``originator: codex_exec``, ``user-agent:
  codex_exec/0.171.0 (...)``, ``session-id``, ``thread-id``, ``x-client-request-id``, ``x-codex-window-id``,
  ``x-codex-beta-features: remote_compaction_v2``, ``x-codex-turn-metadata`` (JSON: installation, session,
  turn ids, sandbox mode, ``analytics_enabled``, model), ``accept-encoding: zstd,gzip``.
- body: ``model``, ``stream: true``, ``input`` (no ``instructions``: the system prompt comes as two
  ``developer`` messages, "You are a coding agent running in the Codex CLI, ..." and a skills block, then an
  ``<environment_context>`` user message, then the prompt; every item has an ``id``), ``tools`` (plain
  function tools with ``strict: false``: exec_command, write_stdin, request_user_input, view_image, get_goal,
  create_goal, update_goal), ``tool_choice: auto``, ``parallel_tool_calls: true``, ``reasoning: {summary:
  auto}`` (no effort), ``store: false``, ``include: ["reasoning.encrypted_content"]``, ``prompt_cache_key``
  (the thread id), ``client_metadata`` (string pairs: installation id, turn, thread and window ids). No
  ``max_output_tokens``, ``previous_response_id`` (``store: false``: every turn resends the history),
  ``text``, ``temperature`` or ``service_tier``.
- by default it also sends a built-in ``{type: web_search, external_web_access: false}`` tool and a
  ``{type: namespace, name: multi_agent_v1, tools: [...]}`` tool (its sub-agents); the gateway answers each
  with a 400 (``tools.N.type: 'namespace' tools are not supported by this gateway (only function tools
  are)``), so ``write_codex_home`` turns both off (``web_search = "disabled"``, ``[agents] enabled = false``).
- ``client_metadata`` cannot be turned off (Codex always sets it); the gateway answered it, when this test was
  written, with ``400 {"error": {"message": "Unknown parameter: 'client_metadata'.", "type":
  "invalid_request_error", "param": "client_metadata", "code": "unknown_parameter"}}``, on which Codex gives up
  at once (a ``turn.failed`` event, exit 1).
- the gateway's stream is enough for it: ``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``, one ``response.output_text.delta`` per
  token, ``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``,
  ``response.completed``. With no ``max_output_tokens`` the
  gateway sends the engine no ``max_tokens``, and the emulator then ends on its emulated EOS after
  ``natural_stop_tokens`` tokens (finish ``stop``: a ``completed`` response, not an ``incomplete`` one).
- it warns "Model metadata for `tiny-public` not found. Defaulting to fallback metadata" (an ``error`` item
  in the JSON events, not a failure): the gateway's model is not in Codex's catalog.
- with the defaults it would also call ab.chatgpt.com (analytics, and wait ~5 s on it) and run ``git
  ls-remote https://github.com/openai/plugins``; the config turns those off (see ``write_codex_home``).

The config and env the CLI gets are in ``tests/support/agent_cli.py`` (``write_codex_home``, ``codex_env``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread, expected_text
from tests.conftest import require
from tests.support.agent_cli import (
    AgentCliMissing,
    access_log,
    bring_loopback_up,
    codex_binary,
    codex_env,
    loopback_only_argv,
    namespaces_unavailable,
    network_interfaces,
    run_cli,
    tail,
    write_codex_home,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import REPO_ROOT

KEY = "sk-e2e-codex-0123456789"
MODEL = "tiny-public"
PROMPT = "Say hello in one short sentence."
NATURAL_STOP = 16  # tokens the emulator generates before its EOS when a request sets no token limit
ANSWER = expected_text(NATURAL_STOP)
GATEWAY_START_S = 20.0
CLI_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 58.0  # the whole namespace run; a healthy one takes a few seconds
HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MODEL_METADATA_WARNING = "Model metadata for `tiny-public` not found"
CONFIG = """
server: {{access_log: true}}
auth:
  mode: keys
  keys:
    - {{name: codex, sha256: "{sha}"}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", api_key: emu-key, probe: {{interval_s: 0.5}}}}
models:
  - name: {model}
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, tools]}}]
"""


def test_codex_answers_a_prompt_through_the_responses_api_with_no_other_network(tmp_path: Path) -> None:
    try:
        binary = codex_binary()
    except AgentCliMissing as e:
        require(str(e))
        raise
    why = namespaces_unavailable()
    if why is not None:
        require(why)

    got = run_isolated(tmp_path, binary)

    assert got["interfaces"] == ["lo"], got["interfaces"]  # nothing but loopback to connect to
    assert not got["timed_out"], f"codex exec did not finish in {CLI_TIMEOUT_S:g} s:\n{got['stderr'][-3000:]}"
    assert got["rc"] == 0, f"codex exec exited {got['rc']}:\n{got['stdout'][-3000:]}\n{got['stderr'][-3000:]}"
    assert got["last_message"] == ANSWER  # --output-last-message: the engine's text, whole

    # its JSON events: one turn, the engine's text as the agent's message, no error but the catalog warning
    events = [json.loads(line) for line in got["stdout"].splitlines() if line.strip()]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started" and kinds[-1] == "turn.completed", kinds
    assert "turn.failed" not in kinds and "error" not in kinds, events
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    assert [i["text"] for i in items if i["type"] == "agent_message"] == [ANSWER], items
    warnings = [i["message"] for i in items if i["type"] == "error"]
    assert all(MODEL_METADATA_WARNING in w for w in warnings), warnings
    usage = events[-1]["usage"]
    assert usage["output_tokens"] == NATURAL_STOP and usage["input_tokens"] > 1000, usage  # its prompt and tools

    # the gateway saw exactly the one streamed Responses request, answered it from the engine, under this key
    access = [r for r in access_log(tmp_path / "gateway.log") if r["path"] not in HEALTH_PATHS]
    seen = [(r["method"], r["path"], r["status"], r["outcome"], r["key"], r["model"], r["stream"]) for r in access]
    assert seen == [("POST", "/v1/responses", 200, "success", "codex", MODEL, True)], access
    assert access[0]["attempts"] == 1 and access[0]["completion_tokens"] == NATURAL_STOP

    # and the engine got Codex's request as one chat completion
    assert got["engine_inference_requests"] == 1
    body = got["engine_body"]
    assert (body["model"], body["stream"], body["tool_choice"], body["parallel_tool_calls"]) == (
        "tiny",
        True,
        "auto",
        True,
    )
    assert "max_tokens" not in body  # Codex sets no max_output_tokens: the engine ends on its own (finish stop)
    assert body["messages"][0]["role"] == "system" and "Codex CLI" in body["messages"][0]["content"]
    assert body["messages"][-1]["role"] == "user" and PROMPT in json.dumps(body["messages"][-1]["content"])
    assert {"exec_command", "write_stdin"} <= {t["function"]["name"] for t in body["tools"]}


# -- the run in its namespace -----------------------------------------------------------------------------


def run_isolated(workdir: Path, binary: Path) -> dict[str, Any]:
    """Run :func:`inside` in a loopback-only namespace (this module as a script) and return its result."""
    log_path = workdir / "namespace.log"
    argv = loopback_only_argv([sys.executable, "-m", "tests.e2e.test_codex", str(workdir), str(binary)])
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            rc = proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)  # `inside` stops the gateway and the CLI on SIGTERM
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            raise AssertionError(f"the namespace run took over {RUN_TIMEOUT_S:g} s:\n{tail(log_path)}") from None
    result = workdir / "result.json"
    assert rc == 0 and result.exists(), f"the namespace run exited {rc}:\n{tail(log_path)}"
    loaded: dict[str, Any] = json.loads(result.read_text())
    return loaded


def inside(workdir: Path, binary: Path) -> None:
    """In the namespace: loopback up, the emulator, the gateway, then ``codex exec``; writes result.json."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `with` blocks below stop what they started
    bring_loopback_up()
    result: dict[str, Any] = {"interfaces": network_interfaces()}
    emu_config = EmulatorConfig(
        engine="vllm", model="tiny", api_key="emu-key", ctx_len=200_000, natural_stop_tokens=NATURAL_STOP
    )
    with EmulatorThread(emu_config) as emu:
        cfg = CONFIG.format(sha=digest_of(KEY), url=emu.url, model=MODEL)
        with GatewayProcess(cfg, workdir, startup_timeout=GATEWAY_START_S) as gw:
            project = workdir / "project"  # the CLI's working directory: empty, no git, no AGENTS.md
            project.mkdir()
            codex_home = workdir / "codex-home"
            write_codex_home(codex_home, base_url=gw.url, model=MODEL)
            env = codex_env(api_key=KEY, codex_home=codex_home, home=workdir / "home")
            last = workdir / "last-message.txt"
            argv = [
                str(binary),
                "exec",
                "--json",
                "--output-last-message",
                str(last),
                "--skip-git-repo-check",  # the project is no git repository
                "--ephemeral",  # no session files
                "--strict-config",  # a config key this version does not know is an error, not ignored
                "--color",
                "never",
                "--sandbox",
                "read-only",
                "--model",
                MODEL,
                PROMPT,
            ]
            result.update(run_cli(argv, env, project, CLI_TIMEOUT_S))
            result["last_message"] = last.read_text() if last.exists() else None
        result["engine_inference_requests"] = emu.stats.requests_total
        last_request = emu.stats.last_request
        result["engine_body"] = last_request["json"] if last_request is not None else None
    (workdir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    inside(Path(sys.argv[1]), Path(sys.argv[2]))
