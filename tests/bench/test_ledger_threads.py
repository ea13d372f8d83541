"""bench/ledger_threads.py, CPU per thread of a gateway: its /proc reading must tell the main thread from the others
(by kind and rank) and count what each one ran."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ledger_threads  # noqa: E402


def test_each_thread_is_counted_apart_and_the_busy_one_ran_most() -> None:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    before = ledger_threads.threads(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    try:
        time.sleep(0.3)  # the main thread sleeps while the worker spins
        during = ledger_threads.threads(os.getpid())
    finally:
        stop.set()
        worker.join()
    assert "loop" in before and "loop" in during  # the main thread, by its id being the process's
    (spun,) = set(during) - set(before)  # the new thread, by its name and rank
    assert "#" in spun and spun not in ledger_threads.threads(os.getpid())  # gone once joined
    spun_ns = during[spun][0]
    assert spun_ns > 20e6  # it ran (at least 20 ms of the 300)
    assert spun_ns > during["loop"][0] - before["loop"][0]  # and more than the sleeping main thread did
