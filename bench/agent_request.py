#!/usr/bin/env python3
"""A realistic coding-agent request, in the three APIs the gateway speaks, for the bench's agent-sized scenarios.

What a coding agent (Claude Code, Codex, Aider, OpenHands) sends on every turn of a session: a long system
prompt (role, rules, environment, a project's instructions file), ~20 tool schemas (shell, file read/edit/write,
search, git, tests, web, a to-do list, sub-agents), and the history so far: a user's task, then rounds of the
assistant calling tools (a short thought and one call, now and then two in parallel) and the tools' results
(file contents, grep hits, test output, diffs), ending with a user message. About 74 KB of JSON in chat
completions form with 46 messages (a system message, the task, 21 assistant turns carrying 22 tool calls,
22 tool results and a last user note).

The same conversation in each API, built from one description so that all three carry the same text:
- `chat`: OpenAI chat completions (`system` message, `tool_calls`, `tool` messages, function tools);
- `messages`: Anthropic `/v1/messages` (`system`, `tool_use` blocks, `tool_result` blocks in user turns,
  `input_schema` tools);
- `responses`: OpenAI `/v1/responses` (`instructions`, `function_call` / `function_call_output` items,
  flat function tools, `store: false`).

Deterministic (seeded): the same bytes on every run and machine. Nothing in it contains `"max_tokens"` or
`"stream"` as a key (the fake engine finds those in the body without parsing it). `--out DIR` writes
`agent-chat.json`, `agent-messages.json`, `agent-responses.json` (whole answers; the stream client sets
`stream` and the token count itself with `--native-body`).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from agent_context import PATHS, WORDS, sentence, system_prompt, tool_specs

DIALECTS = ("chat", "messages", "responses")
FILES = {d: f"agent-{d}.json" for d in DIALECTS}
MODEL = "fake-model"
SEED = 36  # issue 36
MAX_TOKENS = 64

# -- the history -------------------------------------------------------------------------------------------


def _code(rng: random.Random, lines: int, first: int) -> str:
    """Numbered lines of plausible Python (as a read tool shows a file)."""
    out = []
    indent = 0
    for i in range(lines):
        w = [rng.choice(WORDS) for _ in range(4)]
        kind = rng.random()
        if kind < 0.12:
            indent = 0
            text = f"def {w[0]}_{w[1]}(self, {w[2]}: {w[3].capitalize()} | None = None) -> int:"
            line, indent = text, 4
        elif kind < 0.2:
            line = " " * indent + f'"""{sentence(rng, 6, 14)}"""'
        elif kind < 0.35:
            line = " " * indent + f"if {w[0]}.{w[1]} is None or {w[2]} > self.{w[3]}_limit:"
            indent = min(indent + 4, 12)
        elif kind < 0.45:
            line = " " * indent + f"return {w[0]}_{w[1]}({w[2]}, {w[3]}=True)"
            indent = max(4, indent - 4)
        elif kind < 0.55:
            line = " " * indent + f"# {sentence(rng, 5, 12)}"
        else:
            line = " " * indent + f"{w[0]}_{w[1]} = self.{w[2]}.get({w[3]!r}, {rng.randint(0, 4096)})"
        out.append(f"{first + i:6d}\t{line}")
    return "\n".join(out)


def _result_text(rng: random.Random, kind: str, arg: str) -> str:
    if kind == "read_file":
        return _code(rng, rng.randint(26, 46), rng.randint(1, 300))
    if kind == "grep":
        return "\n".join(
            f"{rng.choice(PATHS)}:{rng.randint(1, 400)}:    {rng.choice(WORDS)}_{rng.choice(WORDS)} = "
            f"{arg}({rng.choice(WORDS)})"
            for _ in range(rng.randint(8, 18))
        )
    if kind == "run_tests":
        names = [f"tests/unit/test_{rng.choice(WORDS)}.py::test_{rng.choice(WORDS)}_{i}" for i in range(10)]
        return (
            "============================= test session starts ==============================\n"
            + "\n".join(f"{n} {'PASSED' if rng.random() < 0.8 else 'FAILED'}" for n in names)
            + "\n\n=================================== FAILURES ===================================\n"
            + _code(rng, 12, rng.randint(20, 200))
            + f"\nE   AssertionError: assert {rng.randint(0, 99)} == {rng.randint(100, 199)}\n"
            f"========================= 2 failed, 8 passed in {rng.randint(1, 9)}.{rng.randint(10, 99)}s ========"
        )
    if kind == "git_diff":
        head = f"diff --git a/{arg} b/{arg}\n--- a/{arg}\n+++ b/{arg}\n@@ -{rng.randint(1, 200)},7 +1,9 @@\n"
        lines = [line.split("\t", 1)[1] for line in _code(rng, 16, 1).split("\n")]
        return head + "\n".join(f"{rng.choice('+- ')}{line}" for line in lines)
    if kind == "edit_file":
        return f"The file {arg} has been updated. Here is the result of running `cat -n` on a snippet:\n" + _code(
            rng, 10, rng.randint(10, 300)
        )
    if kind == "bash":
        return "\n".join(sentence(rng, 6, 14) for _ in range(rng.randint(6, 12)))
    return "\n".join(f"{rng.choice(PATHS)}" for _ in range(rng.randint(6, 14)))


_PLAN = (  # (tool, argument) per assistant turn; a pair is two calls in one turn
    ("todo_write", ""),
    ("grep", "estimate_prompt"),
    ("read_file", "llm_gateway/request_info.py"),
    (("read_file", "llm_gateway/service.py"), ("read_file", "llm_gateway/dispatch.py")),
    ("grep", "orjson.dumps"),
    ("read_file", "llm_gateway/ingress/anthropic_request.py"),
    ("read_file", "llm_gateway/ingress/responses_request.py"),
    ("run_tests", "tests/unit/test_request_info.py"),
    ("edit_file", "llm_gateway/request_info.py"),
    ("run_tests", "tests/unit/test_request_info.py"),
    ("read_file", "tests/unit/test_request_info.py"),
    ("edit_file", "tests/unit/test_request_info.py"),
    (("bash", ".venv/bin/mypy --strict llm_gateway"), ("bash", ".venv/bin/ruff check .")),
    ("git_diff", "llm_gateway/request_info.py"),
    ("read_file", "llm_gateway/limits/limiter.py"),
    ("edit_file", "llm_gateway/limits/limiter.py"),
    ("run_tests", "tests/unit"),
    ("read_file", "llm_gateway/observability/ledger.py"),
    ("bash", "bench/run.sh --quick --targets gateway"),
    ("todo_write", ""),
)


def conversation(seed: int = SEED) -> dict[str, Any]:
    """The dialect-neutral conversation: system text, tools, and turns (`user` text; `assistant` with a thought
    and calls; `tool` results), deterministic for `seed`."""
    rng = random.Random(seed)
    system = system_prompt(rng)
    tools = tool_specs(rng)
    turns: list[dict[str, Any]] = [
        {
            "role": "user",
            "text": "The gateway spends most of its CPU on large agent requests. Find where request_info and the "
            "ingress translation walk the whole body, make the size estimate use the bytes we already have, "
            "keep every result identical, and add tests that prove it. Run the unit tests when you are done.",
        }
    ]
    n = 0
    for step in _PLAN:
        calls = step if isinstance(step[0], tuple) else (step,)
        thought = sentence(rng, 8, 22) if rng.random() < 0.8 else ""
        out_calls = []
        for tool, arg in calls:
            n += 1
            out_calls.append({"id": f"call_{n:02d}_{rng.getrandbits(48):012x}", "name": tool, "args": _args(tool, arg)})
        turns.append({"role": "assistant", "text": thought, "calls": out_calls})
        for c in out_calls:
            turns.append({"role": "tool", "id": c["id"], "text": _result_text(rng, c["name"], arg)})
    turns.append({"role": "assistant", "text": "The tests pass. " + sentence(rng, 20, 30), "calls": []})
    turns.append({"role": "user", "text": "Good. Now check the streamed path as well, then summarise the change."})
    return {"system": system, "tools": tools, "turns": turns}


def _args(tool: str, arg: str) -> dict[str, Any]:
    if tool == "todo_write":
        return {
            "todos": [
                {"id": str(i), "content": c, "status": s}
                for i, (c, s) in enumerate(
                    (
                        ("Find where the body is walked", "in_progress"),
                        ("Estimate from bytes in hand", "pending"),
                        ("Tests for same results", "pending"),
                        ("Run unit tests", "pending"),
                    )
                )
            ]
        }
    if tool == "grep":
        return {"pattern": arg, "path": "llm_gateway", "output_mode": "content", "context": 0}
    if tool == "read_file":
        return {"file_path": f"/home/dev/src/llm-gateway/{arg}"}
    if tool == "edit_file":
        return {
            "file_path": f"/home/dev/src/llm-gateway/{arg}",
            "old_string": "    size = len(orjson.dumps(body))\n",
            "new_string": "    size = len(raw)  # the bytes in hand\n",
        }
    if tool == "run_tests":
        return {"paths": [arg], "fail_fast": True}
    if tool == "git_diff":
        return {"paths": [arg]}
    return {"command": arg, "description": "Run " + arg.split()[0].rsplit("/", 1)[-1]}


# -- the three dialects ------------------------------------------------------------------------------------


def _json_args(args: dict[str, Any]) -> str:
    return json.dumps(args, separators=(",", ":"))


def chat_body(conv: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": conv["system"]}]
    for t in conv["turns"]:
        if t["role"] == "user":
            msgs.append({"role": "user", "content": t["text"]})
        elif t["role"] == "tool":
            msgs.append({"role": "tool", "tool_call_id": t["id"], "content": t["text"]})
        else:
            m: dict[str, Any] = {"role": "assistant", "content": t["text"] or None}
            if t["calls"]:
                m["tool_calls"] = [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _json_args(a)}}
                    for c in t["calls"]
                    for a in (c["args"],)
                ]
            msgs.append(m)
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": sch}}
        for t in conv["tools"]
        for sch in (t["schema"],)
    ]
    return {
        "model": MODEL,
        "messages": msgs,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": max_tokens,
        "temperature": 0.2,
        "stream": False,
    }


def messages_body(conv: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for t in conv["turns"]:
        if t["role"] == "user":
            block = {"type": "text", "text": t["text"]}
            if msgs and msgs[-1]["role"] == "user":  # after tool results: the same user turn
                msgs[-1]["content"].append(block)
            else:
                msgs.append({"role": "user", "content": [block]})
        elif t["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": t["id"], "content": t["text"]}
            if msgs and msgs[-1]["role"] == "user":
                msgs[-1]["content"].append(block)
            else:
                msgs.append({"role": "user", "content": [block]})
        else:
            blocks: list[dict[str, Any]] = [{"type": "text", "text": t["text"]}] if t["text"] else []
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in t["calls"]]
            msgs.append({"role": "assistant", "content": blocks})
    tools = [{"name": s["name"], "description": s["description"], "input_schema": s["schema"]} for s in conv["tools"]]
    return {
        "model": MODEL,
        "max_tokens": max_tokens,
        "system": conv["system"],
        "messages": msgs,
        "tools": tools,
        "tool_choice": {"type": "auto"},
        "temperature": 0.2,
        "stream": False,
    }


def responses_body(conv: dict[str, Any], max_tokens: int = MAX_TOKENS) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for t in conv["turns"]:
        if t["role"] == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": t["text"]}]})
        elif t["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": t["id"], "output": t["text"]})
        else:
            if t["text"]:
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": t["text"]}]}
                )
            items += [
                {"type": "function_call", "call_id": c["id"], "name": c["name"], "arguments": _json_args(c["args"])}
                for c in t["calls"]
            ]
    tools = [
        {"type": "function", "name": s["name"], "description": s["description"], "parameters": s["schema"]}
        for s in conv["tools"]
    ]
    return {
        "model": MODEL,
        "instructions": conv["system"],
        "input": items,
        "tools": tools,
        "tool_choice": "auto",
        "max_output_tokens": max_tokens,
        "temperature": 0.2,
        "store": False,
        "stream": False,
    }


BUILDERS = {"chat": chat_body, "messages": messages_body, "responses": responses_body}


def bodies(seed: int = SEED, max_tokens: int = MAX_TOKENS) -> dict[str, dict[str, Any]]:
    """The same conversation as a chat, a messages and a responses body (whole answers)."""
    conv = conversation(seed)
    return {d: BUILDERS[d](conv, max_tokens) for d in DIALECTS}


def encode(body: dict[str, Any]) -> bytes:
    """As agents' SDKs send it: compact JSON, UTF-8."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def write(out: Path, seed: int = SEED) -> dict[str, Path]:
    """Writes the three bodies into `out` (created); returns their paths by dialect."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for d, body in bodies(seed).items():
        p = out / FILES[d]
        p.write_bytes(encode(body))
        paths[d] = p
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for agent-{chat,messages,responses}.json")
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args()
    for d, p in write(a.out, a.seed).items():
        body = json.loads(p.read_bytes())
        n = len(body.get("messages") or body.get("input") or [])
        print(f"{d:>9}: {p} {p.stat().st_size:,} bytes, {n} {'items' if d == 'responses' else 'messages'}")


if __name__ == "__main__":
    main()
