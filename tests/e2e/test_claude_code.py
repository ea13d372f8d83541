"""A real coding-agent CLI through the gateway: Claude Code (npm ``@anthropic-ai/claude-code``, the version
``scripts/setup_dev.sh`` pins) answers one ``claude -p`` prompt in print mode with ``--output-format json``,
its only server the gateway as a real process in front of the vLLM emulator, and every other connection
impossible: the emulator, the gateway and the CLI run together in a fresh network namespace whose only
interface is loopback (``unshare -rn``, this module run as a script inside it), so a call to Anthropic,
telemetry, an update check or a DNS lookup cannot go anywhere (it fails at once, and nothing is sent).

What Claude Code 2.1.332 does against the gateway (seen through a recording proxy while writing this):

- endpoints: exactly one ``POST /v1/messages?beta=true`` for a one-turn prompt, streamed (``stream: true``).
  No ``/v1/messages/count_tokens``, no ``/v1/models``, nothing else, in print mode.
- headers: ``x-api-key`` (from ``ANTHROPIC_API_KEY``), ``anthropic-version: 2023-06-01``, ``anthropic-beta:
  claude-code-20250219,interleaved-thinking-2025-05-14,effort-2025-11-24``, ``x-app: cli``,
  ``X-Claude-Code-Session-Id``.
- body: ``model``, ``max_tokens`` (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``, default 32,000), ``stream``, ``system``
  as three text blocks (an ``x-anthropic-billing-header: cc_version=...;`` line, which the gateway drops so
  that it never reaches the engine's prompt; "You are a Claude agent,
  ..."; the main prompt; two with ``cache_control``), ``messages`` (a user turn of a ``<system-reminder>``
  block and the prompt, then a ``role: system`` message with the environment section), 21 plain custom
  ``tools`` (Agent, Bash, Edit, Read, ...), ``thinking: {type: adaptive}``, ``output_config: {effort: high}``,
  ``metadata.user_id`` (a JSON string, forwarded as OpenAI ``user``).
- by default (no ``CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS``) it also sends ``context_management: {edits:
  [{type: clear_thinking_20251015, keep: all}]}`` and more betas: the gateway accepts edits that only clear
  earlier thinking (its translation never sends earlier thinking to the engine); it used to answer them
  with a 400, on which Claude Code retries and gives up (``is_error: true``, exit 1).
- a reply that ends at ``max_tokens`` is an error to Claude Code ("response exceeded the N output token
  maximum"; it retries with a continuation first). The emulator ends every request at its ``max_tokens``, so
  the test adds ``stop_sequences: ["."]`` through ``CLAUDE_CODE_EXTRA_BODY`` (Claude Code merges it into each
  request body): the engine stops at its 11th token and the answer is ``expected_text(10)``, a normal end.

The env the CLI gets is in ``tests/support/agent_cli.py`` (``claude_code_env``), with why each is there.
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
    claude_code_binary,
    claude_code_env,
    loopback_only_argv,
    namespaces_unavailable,
    network_interfaces,
    run_cli,
    tail,
)
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import REPO_ROOT

KEY = "sk-e2e-claude-code-0123456789"
MODEL = "tiny-public"
PROMPT = "Say hello in one short sentence."
STOP = "."  # the emulator's 11th token; the text before it is expected_text(10)
ANSWER = expected_text(10)
MAX_OUTPUT_TOKENS = 256
GATEWAY_START_S = 20.0
CLI_TIMEOUT_S = 30.0
RUN_TIMEOUT_S = 58.0  # the whole namespace run; a healthy one takes a few seconds
HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
CONFIG = """
server: {{access_log: true}}
auth:
  mode: keys
  keys:
    - {{name: claude-code, sha256: "{sha}"}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", api_key: emu-key, probe: {{interval_s: 0.5}}}}
models:
  - name: {model}
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, tools]}}]
"""


def test_claude_code_answers_a_prompt_through_the_gateway_with_no_other_network(tmp_path: Path) -> None:
    try:
        binary = claude_code_binary()
    except AgentCliMissing as e:
        require(str(e))
        raise
    why = namespaces_unavailable()
    if why is not None:
        require(why)

    got = run_isolated(tmp_path, binary)

    assert got["interfaces"] == ["lo"], got["interfaces"]  # nothing but loopback to connect to
    assert not got["timed_out"], f"claude -p did not finish in {CLI_TIMEOUT_S:g} s:\n{got['stderr'][-3000:]}"
    assert got["rc"] == 0, f"claude -p exited {got['rc']}:\n{got['stdout'][-3000:]}\n{got['stderr'][-3000:]}"
    out = json.loads(got["stdout"])
    assert (out["type"], out["subtype"], out["is_error"]) == ("result", "success", False), out
    assert out["result"] == ANSWER
    assert out["num_turns"] == 1 and out["terminal_reason"] == "completed"
    assert set(out["modelUsage"]) == {MODEL}
    assert out["usage"]["input_tokens"] > 1000  # its system prompt and tools reached the engine

    # the gateway saw exactly the one request, answered it from the engine, under this key
    access = [r for r in access_log(tmp_path / "gateway.log") if r["path"] not in HEALTH_PATHS]
    seen = [(r["method"], r["path"], r["status"], r["outcome"], r["key"], r["model"], r["stream"]) for r in access]
    assert seen == [("POST", "/v1/messages", 200, "success", "claude-code", MODEL, True)], access
    assert access[0]["attempts"] == 1 and access[0]["completion_tokens"] == 11  # ten tokens, then the stop token

    # and the engine got Claude Code's request as one chat completion
    assert got["engine_inference_requests"] == 1
    body = got["engine_body"]
    assert (body["model"], body["max_tokens"], body["stream"], body["stop"]) == (
        "tiny",
        MAX_OUTPUT_TOKENS,
        True,
        [STOP],
    )
    assert body["messages"][0]["role"] == "system" and "Claude" in body["messages"][0]["content"]
    assert "x-anthropic-billing-header" not in json.dumps(body["messages"])  # the gateway drops that line
    assert any(m["role"] == "user" and PROMPT in json.dumps(m["content"]) for m in body["messages"])
    assert {"Bash", "Read", "Edit"} <= {t["function"]["name"] for t in body["tools"]}
    assert body["chat_template_kwargs"] == {"enable_thinking": True}  # from thinking: adaptive


# -- the run in its namespace -----------------------------------------------------------------------------


def run_isolated(workdir: Path, binary: Path) -> dict[str, Any]:
    """Run :func:`inside` in a loopback-only namespace (this module as a script) and return its result."""
    log_path = workdir / "namespace.log"
    argv = loopback_only_argv([sys.executable, "-m", "tests.e2e.test_claude_code", str(workdir), str(binary)])
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
    """In the namespace: loopback up, the emulator, the gateway, then ``claude -p``; writes result.json."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the `with` blocks below stop what they started
    bring_loopback_up()
    result: dict[str, Any] = {"interfaces": network_interfaces()}
    emu_config = EmulatorConfig(engine="vllm", model="tiny", api_key="emu-key", ctx_len=200_000)
    with EmulatorThread(emu_config) as emu:
        cfg = CONFIG.format(sha=digest_of(KEY), url=emu.url, model=MODEL)
        with GatewayProcess(cfg, workdir, startup_timeout=GATEWAY_START_S) as gw:
            project = workdir / "project"  # the CLI's working directory: empty, no git, no CLAUDE.md
            project.mkdir()
            env = claude_code_env(
                base_url=gw.url, api_key=KEY, model=MODEL, home=workdir / "home", max_output_tokens=MAX_OUTPUT_TOKENS
            )
            env["CLAUDE_CODE_EXTRA_BODY"] = json.dumps({"stop_sequences": [STOP]})
            argv = [str(binary), "-p", PROMPT, "--output-format", "json", "--model", MODEL]
            result.update(run_cli(argv, env, project, CLI_TIMEOUT_S))
        result["engine_inference_requests"] = emu.stats.requests_total
        last = emu.stats.last_request
        result["engine_body"] = last["json"] if last is not None else None
    (workdir / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    inside(Path(sys.argv[1]), Path(sys.argv[2]))
