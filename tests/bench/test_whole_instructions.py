"""bench/whole_instructions.py, the whole process's count: a dump's files read per thread, a real two-thread
process under valgrind whose second thread's work is counted (as the OTLP export thread's is), and the table's
ratios to the first profile."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import whole_instructions as wi  # noqa: E402

HEAD = b"version: 1\ncreator: callgrind-3.19.0\npid: 7\ncmd:  python -m x\npart: 1\n\nevents: Ir\n"


def test_a_dumps_files_are_read_per_thread(tmp_path: Path) -> None:
    (tmp_path / "cg.7.2-01").write_bytes(HEAD + b"summary: 1000\n")
    (tmp_path / "cg.7.2-02").write_bytes(HEAD + b"summary: 250\n")
    assert wi.per_thread(tmp_path.glob("cg.7.2*")) == {1: 1000, 2: 250}
    (tmp_path / "cg.8.1").write_bytes(HEAD + b"totals: 42\n")  # one thread: no suffix
    assert wi.per_thread([tmp_path / "cg.8.1"]) == {1: 42}


def test_the_table_gives_each_profiles_ratio_to_the_first_and_its_threads() -> None:
    r = {
        "minimal": {"ir_per_request": 700_000.0, "thread_1": 700_000.0},
        "traced": {"ir_per_request": 805_000.0, "thread_1": 750_000.0, "thread_2": 55_000.0},
    }
    lines = wi.table(r).splitlines()
    assert lines[0] == "| profile | instructions / request | x minimal | thread_1 | thread_2 |"
    assert lines[2] == "| minimal | 700,000 | 1.000 | 700,000 | - |"
    assert lines[3] == "| traced | 805,000 | 1.150 | 750,000 | 55,000 |"


def test_a_second_threads_work_is_counted_apart_from_the_main_threads(tmp_path: Path) -> None:
    if not all(wi.shutil.which(t) for t in ("valgrind", "callgrind_control", "taskset")):
        pytest.skip("valgrind not installed (scripts/setup_dev.sh installs it)")
    # a process whose second thread loops when told (a file appears); its main thread only waits
    script = tmp_path / "work.py"
    script.write_text(
        "import os, sys, threading, time\n"
        "go = sys.argv[1]\n"
        "def worker():\n"
        "    while True:\n"
        "        if os.path.exists(go):\n"
        "            n = int(open(go).read() or 0); os.remove(go); sum(range(n)); open(go + '.done', 'w').close()\n"
        "        time.sleep(0.01)\n"
        "threading.Thread(target=worker, daemon=True).start()\n"
        "open(go + '.ready', 'w').close()\n"
        "while True:\n"
        "    time.sleep(1)\n"
    )
    go = tmp_path / "go"
    target = wi.Target("work", [sys.executable, str(script), str(go)], tmp_path, tmp_path, {})
    try:
        for _ in range(600):  # Python starts slowly under valgrind
            if Path(str(go) + ".ready").exists():
                break
            time.sleep(0.1)
        target.control("-i", "on")

        def work() -> None:
            done = Path(str(go) + ".done")
            go.write_text("1000000")
            while not done.exists():
                time.sleep(0.05)
            done.unlink()

        counted = target.count_threads(work)
    finally:
        target.stop()
    assert set(counted) == {1, 2}
    assert counted[2] > 20 * counted[1] > 0


def test_the_agent_body_is_agent_requests_chat_request_and_the_floor_is_a_profile() -> None:
    import agent_request

    path, body = wi.request_body("agent")
    assert body == agent_request.encode(agent_request.bodies()["chat"]) and len(body) > 60_000
    assert path == "/v1/chat/completions"
    assert wi.request_body("request") == (path, (BENCH / "request.json").read_bytes())
    for dialect, at in (("messages", "/v1/messages"), ("responses", "/v1/responses")):  # the same conversation
        assert wi.request_body(f"agent-{dialect}") == (at, agent_request.encode(agent_request.bodies()[dialect]))
    assert wi.FLOORS == ("aiohttp",) and not set(wi.FLOORS) & set(wi.tg.PROFILES)  # never a gateway config
