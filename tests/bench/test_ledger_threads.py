"""bench/ledger_threads.py, CPU per thread of a gateway: its /proc reading must tell the main thread from the others
(by kind and rank) and count what each one ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

#: in a process of its own (threads of earlier tests would take the ranks): a thread spins while the main one sleeps
SPIN = """
import json, os, threading, time
import ledger_threads
stop = threading.Event()
def spin():
    while not stop.is_set():
        pass
before = ledger_threads.threads(os.getpid())
worker = threading.Thread(target=spin)
worker.start()
time.sleep(0.3)
during = ledger_threads.threads(os.getpid())
stop.set()
worker.join()
deadline = time.monotonic() + 5  # a joined thread's /proc entry goes a moment after join returns (seen under load)
while set(after := ledger_threads.threads(os.getpid())) != {"loop"} and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"before": before, "during": during, "after": after}))
"""


def test_each_thread_is_counted_apart_and_the_busy_one_ran_most() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SPIN], cwd=BENCH, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    got = json.loads(out)
    before, during, after = got["before"], got["during"], got["after"]
    assert set(before) == set(after) == {"loop"}  # the main thread, by its id being the process's
    (spun,) = set(during) - {"loop"}  # the new thread, by its name and rank
    assert spun.endswith("#1")
    assert all(len(v) == 5 for v in during.values())  # run ns, user and system ticks, two kinds of switches
    spun_ns = during[spun][0]
    assert spun_ns > 20e6  # it ran (at least 20 ms of the 300)
    assert spun_ns > during["loop"][0] - before["loop"][0]  # and more than the sleeping main thread did
