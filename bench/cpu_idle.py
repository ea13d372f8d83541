"""How the bench's CPUs idle while it measures: it holds a CPU latency request (`/dev/cpu_dma_latency`).

Every proxied request wakes an idle CPU twice (the proxy's core when the client writes, again when the
engine answers); the engine alone wakes none, its load generator sharing its core. How long a wake-up takes is
the machine's, not the proxy's: on this Firecracker VM the guest idles in `haltpoll` with
`guest_halt_poll_ns=0`, so every idle CPU halts, and waking it is a VM exit, the host's scheduler, a VM entry:
measured here, ns_c1 through the gateway went from 2,805 req/s (p50 0.34 ms) to 698 req/s (p50 1.37 ms)
with the halts allowed, while the gateway's own time per request (gateway_overhead_seconds) stayed under
0.25 ms. A latency request of 0 µs makes the kernel's cpuidle keep to its polling state (state0, `POLL`), so
a wake-up is a flag the idle loop sees at once, on bare metal and in a VM alike. This is what tuned's
`latency-performance` profile does (`force_latency`), and what latency benchmarks do to measure the
software and not the idle states. The request is the kernel's PM QoS: it lasts while the file stays
open and goes when it is closed (or this process dies), so nothing outlives the run.

It is applied to every target alike (direct, smg, the gateway ...), and the report says whether it was
held; `--cpu-latency-us -1` measures with the machine's own idle states instead. Polling is idle time,
counted to no process, but the halts cost the processes that wake: the same runs measured CPU per request
at ns_c1 of 510 µs (gateway) and 454 (smg) with halts, 235 and 227 without, and at ns_c64 304 / 307 with
halts, 238 / 242 without. So a run says which it was, and two runs compare only when they say the same.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

DEVICE = "/dev/cpu_dma_latency"
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")


def idle_driver(root: Path = CPUIDLE) -> str:
    """The cpuidle driver and governor, as sysfs names them ("haltpoll/haltpoll"), or "none"."""
    try:
        driver = (root / "current_driver").read_text().strip()
    except OSError:
        return "none"
    try:
        governor = (root / "current_governor_ro").read_text().strip()
    except OSError:
        try:
            governor = (root / "current_governor").read_text().strip()
        except OSError:
            governor = "?"
    return f"{driver}/{governor}"


@contextlib.contextmanager
def held_latency(us: int, device: str = DEVICE) -> Iterator[str]:
    """Hold a CPU latency request of `us` microseconds while the block runs (`us` < 0: none); yields what
    was done, for the report: "cpu_dma_latency 0 µs held", or "not held: <why>"."""
    if us < 0:
        yield "not held (--cpu-latency-us -1): the machine's own idle states"
        return
    fd: int | None = None
    try:
        fd = os.open(device, os.O_WRONLY)
        os.write(fd, struct.pack("i", us))  # the kernel's binary form: a native 32-bit int
        status = f"cpu_dma_latency {us} µs held"
    except OSError as e:
        status = f"not held: {device}: {e.strerror or e}"
    try:
        yield status
    finally:
        if fd is not None:
            os.close(fd)  # the request ends with the file
