"""bench/cpu_idle.py: the CPU latency request the bench holds while it measures, and how the reports say
whether it was held. No real /dev/cpu_dma_latency: a file stands in for it (the kernel reads the same four
bytes), so the test runs anywhere and changes nothing on the machine."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import board_report  # noqa: E402
import cpu_idle  # noqa: E402
import report  # noqa: E402


def test_the_request_is_written_as_a_32_bit_int_and_held_while_the_block_runs(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")
    with cpu_idle.held_latency(0, str(dev)) as status:
        assert status == "cpu_dma_latency 0 µs held"
        assert dev.read_bytes() == struct.pack("i", 0)
    with cpu_idle.held_latency(20, str(dev)) as status:
        assert status == "cpu_dma_latency 20 µs held"
        assert struct.unpack("i", dev.read_bytes()[:4]) == (20,)


def test_a_device_that_cannot_be_opened_is_reported_not_held(tmp_path: Path) -> None:
    with cpu_idle.held_latency(0, str(tmp_path / "missing")) as status:
        assert status.startswith("not held: ") and "missing" in status


def test_minus_one_holds_nothing() -> None:
    with cpu_idle.held_latency(-1, "/nonexistent/never-opened") as status:
        assert status.startswith("not held (--cpu-latency-us -1)")


def test_the_file_is_closed_when_the_block_ends_even_by_an_exception(tmp_path: Path) -> None:
    import os

    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")
    before = set(os.listdir("/proc/self/fd"))
    try:
        with cpu_idle.held_latency(0, str(dev)):
            assert len(set(os.listdir("/proc/self/fd")) - before) >= 1  # the request's file is open
            raise RuntimeError("the run failed")
    except RuntimeError:
        pass
    assert not any(os.path.realpath(f"/proc/self/fd/{fd}") == str(dev) for fd in os.listdir("/proc/self/fd"))


def test_the_idle_driver_is_read_from_sysfs(tmp_path: Path) -> None:
    assert cpu_idle.idle_driver(tmp_path / "absent") == "none"
    (tmp_path / "current_driver").write_text("haltpoll\n")
    (tmp_path / "current_governor_ro").write_text("haltpoll\n")
    assert cpu_idle.idle_driver(tmp_path) == "haltpoll/haltpoll"


def test_both_reports_say_how_the_cpus_idled() -> None:
    cfg = {"targets": ["gateway", "direct"], "scenarios": ["ns_c1"], "duration": 1}
    data = {"config": dict(cfg), "results": {}, "versions": {"python": "3.11.2"}}
    assert "CPU idle: not recorded" in board_report.machine(data)  # a run from before the hold
    data["config"]["cpu_idle"] = {"latency_request": "cpu_dma_latency 0 µs held", "driver": "haltpoll/haltpoll"}
    said = "CPU idle: cpu_dma_latency 0 µs held (cpuidle haltpoll/haltpoll)"
    assert said in board_report.machine(data)
    assert said in report.render(data)
