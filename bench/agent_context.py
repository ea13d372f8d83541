"""What a coding agent sends with every turn besides its history, for agent_request.py: the system prompt (role,
rules, environment, a project's instructions file) and ~20 tool schemas (shell, file read/edit/write, search, git,
tests, web, a to-do list, sub-agents), as plain text and JSON Schema; each dialect wraps the tools its own way.
Deterministic for a seeded `random.Random`; `sentence` and `PATHS` are shared with the history's tool results.
"""

from __future__ import annotations

import random
from typing import Any

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
        "\n## Layout\n" + "\n".join(f"- `{p}`: {sentence(rng, 10, 18)}" for p in PATHS),
        "\n## Commands\n" + "\n".join(f"- `{c}`: {sentence(rng, 6, 12)}" for c in _COMMANDS),
        "\n## Notes from earlier sessions\n" + "\n".join(f"- {sentence(rng, 14, 30)}" for _ in range(34)),
    ]
    return "\n".join(parts)


PATHS = (
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
WORDS = _VOCABULARY.split()


def sentence(rng: random.Random, lo: int, hi: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
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
        desc = f"{title}. " + " ".join(sentence(rng, 12, 24) for _ in range(rng.randint(4, 7)))
        schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
        out.append({"name": name, "description": desc, "schema": schema})
    return out
