"""How work that runs beside the event loop, in threads of the same process, gives way to it.

The usage ledger's SQLite writer and its crash spool (state/sqlite_writer.py, observability/spool.py) do their
work in threads while the loop serves requests. Where they share a core with the loop (a container held to one
CPU, the bench's pinned gateway), a request that arrives while one of them runs waits until the scheduler lets
the loop back in: with EEVDF (Linux 6.6+) the running thread may finish its slice first, a millisecond or two,
however nice it is, which is what the ledger's flushes added to c1's p99 (issue 36). So that work is cut into
pieces, and after each piece the thread hands the core over (`yield_cpu`): a request waits at most one piece.
It lives here, below both packages, because both use it and neither may import the other.
"""

from __future__ import annotations

import os


def yield_cpu() -> None:
    """Give the CPU, and the GIL, to whatever else is runnable on this core (the event loop first) between two
    pieces of background work. `os.sched_yield` drops the GIL around the call; with nothing else runnable it
    returns at once (one syscall, about a microsecond)."""
    os.sched_yield()
