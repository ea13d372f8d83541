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

DIALECTS = ("chat", "messages", "responses")
FILES = {d: f"agent-{d}.json" for d in DIALECTS}
MODEL = "fake-model"
SEED = 36  # issue 36
MAX_TOKENS = 64

# -- the system prompt -------------------------------------------------------------------------------------

_RULES = (
    "Read a file before you edit it, and edit with the smallest change that does the job.",
    "Prefer the dedicated file tools to shell commands for reading, searching and editing files.",
    "Never commit unless the user asks you to; never push, force or rewrite history.",
    "Run the project's tests after a change and report what they say, failures included.",
    "Keep answers short: the user reads them in a terminal. No headings for a one-line answer.",
    "When a command can take long, give it a timeout and say what you are waiting for.",
    "Do not invent file paths, function names or flags: look them up in the repository first.",
    "Secrets (API keys, tokens, passwords) are never printed, logged or written to files you create.",
    "If a request is ambiguous, ask one precise question instead of guessing.",
    "Follow the style of the surrounding code: names, imports, error handling, line length.",
    "Use the to-do list for work of more than three steps, and keep exactly one item in progress.",
    "A failing test is information: read its output before changing code or the test.",
)
_STYLE = (
    "Modules own one thing and say what in their docstring; imports point down the package tree.",
    "Type hints on every public function; mypy --strict must stay clean.",
    "Errors reach the client in its own API's error envelope; never a bare 500 with a traceback.",
    "No blocking call on the event loop; database and file work goes to the executor.",
    "Every feature has a test that fails without it.",
)


def system_prompt(rng: random.Random) -> str:
    parts = [
        "You are an interactive command-line coding assistant working in the user's repository. You help with "
        "software engineering tasks: fixing bugs, adding features, refactoring, explaining code, running and "
        "repairing tests. Use the tools described below to read and change the repository; the user sees "
        "every tool call and its result.\n",
        "# Rules\n" + "\n".join(f"- {r}" for r in _RULES),
        "\n# Tone and style\nBe direct and concrete. Quote file paths as `path/to/file.py:123` so the user can "
        "jump to them. Do not apologise, do not repeat the question, do not summarise what you are about to do "
        "before doing it. When you finish a task, say in one or two sentences what changed and what you ran.\n",
        "# Tool use\nCall several independent tools in one turn when you can (reading three files is one turn, "
        "not three). A tool result may be truncated; ask for a range if you need more. Shell commands run in "
        "a fresh non-interactive bash in the repository root with a 120 s default timeout; interactive "
        "programs (editors, pagers, REPLs) will hang and must not be used.\n",
        "# Environment\n<env>\nWorking directory: /home/dev/src/llm-gateway\nIs a git repository: yes\n"
        "Platform: linux\nOS version: Linux 6.1.0-28-amd64\nShell: bash 5.2.15\nToday's date: 2026-12-05\n"
        "Python: 3.11.2 (.venv)\n</env>\n",
        "# Project instructions (AGENTS.md)\n" + "\n".join(f"- {r}" for r in _STYLE),
        "\n## Layout\n" + "\n".join(f"- `{p}`: {_sentence(rng, 10, 18)}" for p in _PATHS),
        "\n## Commands\n" + "\n".join(f"- `{c}`: {_sentence(rng, 6, 12)}" for c in _COMMANDS),
        "\n## Notes from earlier sessions\n" + "\n".join(f"- {_sentence(rng, 14, 30)}" for _ in range(34)),
    ]
    return "\n".join(parts)


_PATHS = (
    "llm_gateway/app.py",
    "llm_gateway/service.py",
    "llm_gateway/request_info.py",
    "llm_gateway/dispatch.py",
    "llm_gateway/limits/limiter.py",
    "llm_gateway/limits/memory.py",
    "llm_gateway/routing/table.py",
    "llm_gateway/routing/admission.py",
    "llm_gateway/adapters/vllm.py",
    "llm_gateway/adapters/openai_compat.py",
    "llm_gateway/ingress/anthropic_request.py",
    "llm_gateway/ingress/responses_request.py",
    "llm_gateway/observability/ledger.py",
    "llm_gateway/observability/metrics.py",
    "tests/unit/",
    "tests/e2e/",
    "bench/",
)
_COMMANDS = (
    ".venv/bin/python -m pytest tests/unit -q -x",
    ".venv/bin/python -m pytest tests/e2e -q -k stream",
    ".venv/bin/ruff check . && .venv/bin/ruff format --check .",
    ".venv/bin/mypy --strict llm_gateway",
    "bench/run.sh --quick --targets gateway",
    "git diff --stat",
)
_VOCABULARY = (
    "request limiter reservation budget ledger stream chunk backend deployment route model token window "
    "queue admission probe metrics counter histogram config watcher reload key scope tenant usage settle "
    "refund estimate prompt completion header body parse encode translate adapter engine health retry "
    "timeout deadline cancel flush spool database writer batch executor loop task future connection pool "
    "upstream downstream client server error envelope status field schema validate default override the a "
    "of to in for on with when after before every each one that it is are be not only if then"
)
_WORDS = _VOCABULARY.split()


def _sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


# -- tools -------------------------------------------------------------------------------------------------


def _prop(kind: str, desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "description": desc, **extra}


def tool_specs(rng: random.Random) -> list[dict[str, Any]]:
    """20 tools as (name, description, JSON schema): what the dialects wrap in their own tool shape."""
    path = _prop("string", "Absolute path of the file, inside the working directory.")
    specs: list[tuple[str, str, dict[str, Any], list[str]]] = [
        ("bash", "Run a shell command", {"command": _prop("string", "The command line."),
         "timeout_ms": _prop("integer", "Kill it after this many milliseconds (default 120000, at most 600000)."),
         "description": _prop("string", "Five to ten words saying what the command does."),
         "run_in_background": _prop("boolean", "Start it and return at once; read its output with bash_output.")},
         ["command"]),
        ("bash_output", "Read new output of a background shell", {"shell_id": _prop("string", "The id bash gave."),
         "filter": _prop("string", "Only lines matching this regular expression.")}, ["shell_id"]),
        ("read_file", "Read a file", {"file_path": path,
         "offset": _prop("integer", "First line to read (1-based)."),
         "limit": _prop("integer", "Lines to read (default 2000).")}, ["file_path"]),
        ("write_file", "Write a whole file", {"file_path": path, "content": _prop("string", "The new content.")},
         ["file_path", "content"]),
        ("edit_file", "Replace one exact string in a file", {"file_path": path,
         "old_string": _prop("string", "The text to replace: unique in the file, whitespace exact."),
         "new_string": _prop("string", "The replacement."),
         "replace_all": _prop("boolean", "Replace every occurrence instead of exactly one.")},
         ["file_path", "old_string", "new_string"]),
        ("multi_edit", "Several edits to one file at once", {"file_path": path, "edits": {"type": "array",
         "description": "Applied in order; each sees the result of the previous.", "items": {"type": "object",
         "properties": {"old_string": _prop("string", "Exact text."), "new_string": _prop("string", "Replacement."),
         "replace_all": _prop("boolean", "Every occurrence.")}, "required": ["old_string", "new_string"],
         "additionalProperties": False}, "minItems": 1}}, ["file_path", "edits"]),
        ("glob", "Find files by pattern", {"pattern": _prop("string", "A glob such as src/**/*.py."),
         "path": _prop("string", "Directory to search (default: the working directory).")}, ["pattern"]),
        ("grep", "Search file contents", {"pattern": _prop("string", "A ripgrep regular expression."),
         "path": _prop("string", "File or directory to search."),
         "glob": _prop("string", "Only files matching this glob."),
         "output_mode": _prop("string", "What to show.", enum=["content", "files_with_matches", "count"]),
         "context": _prop("integer", "Lines of context around each match."),
         "case_insensitive": _prop("boolean", "Ignore case."),
         "head_limit": _prop("integer", "Show at most this many lines.")}, ["pattern"]),
        ("list_dir", "List a directory", {"path": path, "ignore": {"type": "array", "items": {"type": "string"},
         "description": "Glob patterns to leave out."}}, ["path"]),
        ("web_fetch", "Fetch a web page as markdown", {"url": _prop("string", "An http(s) URL.", format="uri"),
         "prompt": _prop("string", "What to extract from the page.")}, ["url", "prompt"]),
        ("web_search", "Search the web", {"query": _prop("string", "The query.", minLength=2),
         "allowed_domains": {"type": "array", "items": {"type": "string"}, "description": "Only these sites."},
         "blocked_domains": {"type": "array", "items": {"type": "string"}, "description": "Never these."}},
         ["query"]),
        ("todo_write", "Replace the to-do list", {"todos": {"type": "array", "description": "The whole list.",
         "items": {"type": "object", "properties": {"content": _prop("string", "What to do.", minLength=1),
         "status": _prop("string", "Its state.", enum=["pending", "in_progress", "completed"]),
         "id": _prop("string", "A stable id.")}, "required": ["content", "status", "id"],
         "additionalProperties": False}}}, ["todos"]),
        ("run_tests", "Run the test suite or part of it", {"paths": {"type": "array", "items": {"type": "string"},
         "description": "Test files or node ids; empty: the whole suite."},
         "keyword": _prop("string", "pytest -k expression."), "fail_fast": _prop("boolean", "Stop at the first.")},
         []),
        ("git_status", "Show the working tree's status", {"short": _prop("boolean", "Porcelain format.")}, []),
        ("git_diff", "Show changes", {"staged": _prop("boolean", "The index instead of the working tree."),
         "paths": {"type": "array", "items": {"type": "string"}, "description": "Limit to these paths."},
         "stat": _prop("boolean", "Only the summary.")}, []),
        ("git_log", "Show recent commits", {"max_count": _prop("integer", "How many (default 10)."),
         "path": _prop("string", "Only commits touching this path.")}, []),
        ("git_commit", "Commit staged changes", {"message": _prop("string", "The commit message: why, not what."),
         "paths": {"type": "array", "items": {"type": "string"}, "description": "Stage these first."}},
         ["message"]),
        ("diagnostics", "Type checker and linter findings for a file", {"file_path": path,
         "severity": _prop("string", "The least severe to show.", enum=["error", "warning", "info"])},
         ["file_path"]),
        ("task", "Hand a self-contained task to a sub-agent", {"description": _prop("string", "3-5 words."),
         "prompt": _prop("string", "Everything the sub-agent needs: it cannot see this conversation."),
         "subagent_type": _prop("string", "Which agent.", enum=["general", "explore", "review"])},
         ["description", "prompt"]),
        ("ask_user", "Ask the user a question and wait", {"question": _prop("string", "One precise question."),
         "options": {"type": "array", "items": {"type": "string"}, "maxItems": 4,
         "description": "Answers to offer."}}, ["question"]),
    ]  # fmt: skip
    out = []
    for name, title, props, required in specs:
        desc = f"{title}. " + " ".join(_sentence(rng, 12, 24) for _ in range(rng.randint(4, 7)))
        schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
        out.append({"name": name, "description": desc, "schema": schema})
    return out


# -- the history -------------------------------------------------------------------------------------------


def _code(rng: random.Random, lines: int, first: int) -> str:
    """Numbered lines of plausible Python (as a read tool shows a file)."""
    out = []
    indent = 0
    for i in range(lines):
        w = [rng.choice(_WORDS) for _ in range(4)]
        kind = rng.random()
        if kind < 0.12:
            indent = 0
            text = f"def {w[0]}_{w[1]}(self, {w[2]}: {w[3].capitalize()} | None = None) -> int:"
            line, indent = text, 4
        elif kind < 0.2:
            line = " " * indent + f'"""{_sentence(rng, 6, 14)}"""'
        elif kind < 0.35:
            line = " " * indent + f"if {w[0]}.{w[1]} is None or {w[2]} > self.{w[3]}_limit:"
            indent = min(indent + 4, 12)
        elif kind < 0.45:
            line = " " * indent + f"return {w[0]}_{w[1]}({w[2]}, {w[3]}=True)"
            indent = max(4, indent - 4)
        elif kind < 0.55:
            line = " " * indent + f"# {_sentence(rng, 5, 12)}"
        else:
            line = " " * indent + f"{w[0]}_{w[1]} = self.{w[2]}.get({w[3]!r}, {rng.randint(0, 4096)})"
        out.append(f"{first + i:6d}\t{line}")
    return "\n".join(out)


def _result_text(rng: random.Random, kind: str, arg: str) -> str:
    if kind == "read_file":
        return _code(rng, rng.randint(26, 46), rng.randint(1, 300))
    if kind == "grep":
        return "\n".join(
            f"{rng.choice(_PATHS)}:{rng.randint(1, 400)}:    {rng.choice(_WORDS)}_{rng.choice(_WORDS)} = "
            f"{arg}({rng.choice(_WORDS)})"
            for _ in range(rng.randint(8, 18))
        )
    if kind == "run_tests":
        names = [f"tests/unit/test_{rng.choice(_WORDS)}.py::test_{rng.choice(_WORDS)}_{i}" for i in range(10)]
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
        return "\n".join(_sentence(rng, 6, 14) for _ in range(rng.randint(6, 12)))
    return "\n".join(f"{rng.choice(_PATHS)}" for _ in range(rng.randint(6, 14)))


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
        thought = _sentence(rng, 8, 22) if rng.random() < 0.8 else ""
        out_calls = []
        for tool, arg in calls:
            n += 1
            out_calls.append({"id": f"call_{n:02d}_{rng.getrandbits(48):012x}", "name": tool, "args": _args(tool, arg)})
        turns.append({"role": "assistant", "text": thought, "calls": out_calls})
        for c in out_calls:
            turns.append({"role": "tool", "id": c["id"], "text": _result_text(rng, c["name"], arg)})
    turns.append({"role": "assistant", "text": "The tests pass. " + _sentence(rng, 20, 30), "calls": []})
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
