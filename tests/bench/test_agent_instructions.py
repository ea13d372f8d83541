"""bench/agent_instructions.py, the agent request's callgrind count per dialect: it sends every dialect the agent
request comes in, and its table gives each one's ratio to chat."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import agent_instructions  # noqa: E402
import agent_request  # noqa: E402


def test_every_dialect_of_the_agent_request_is_counted_chat_first() -> None:
    assert tuple(agent_instructions.PATHS) == agent_request.DIALECTS and agent_request.DIALECTS[0] == "chat"


def test_the_table_gives_each_dialects_ratio_to_chat() -> None:
    text = agent_instructions.table({"chat": 3_000_000.0, "messages": 3_900_000.0, "responses": 4_500_000.0})
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert "| 3,000,000 | 1.000 |" in rows["chat"]
    assert "| 3,900,000 | 1.300 |" in rows["messages"] and "| 4,500,000 | 1.500 |" in rows["responses"]
