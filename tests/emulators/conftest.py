"""Emulator test suite configuration: every test here is asyncio-based and fast.

After a run of this whole suite that passed, every capture file must have been read by some test
(``emu_helpers.READ``): a capture no test reads holds the emulators to nothing, so it fails the
session, listed by name; use it or delete it with a reason in ``captures/README.md``. A partial run
(some files, ``-k``, ``-m``, ``-x`` stopping early) cannot tell and checks nothing; the static
counterpart, ``test_captures.py``, checks the test sources on every run.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import emu_helpers  # noqa: E402  (after the path insert above)

_WHOLE = pytest.StashKey[bool]()
_UNREAD = pytest.StashKey[list[str]]()
_PENDING = pytest.StashKey[set[str]]()  # this suite's selected tests that have not passed yet


def all_captures() -> set[str]:
    return {p.relative_to(emu_helpers.CAPTURES).as_posix() for p in emu_helpers.CAPTURES.rglob("*.txt")}


def _here(item: pytest.Item) -> bool:
    return HERE in Path(item.path).resolve().parents


@pytest.hookimpl(trylast=True)  # after -k / -m deselected what they deselect
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = {item.nodeid for item in items if _here(item)}
    modules = {Path(item.path).resolve() for item in items if _here(item)}
    whole = modules == {p.resolve() for p in HERE.glob("test_*.py")} and not (
        config.getoption("keyword") or config.getoption("markexpr") or config.getoption("deselect")
    )
    config.stash[_WHOLE] = whole
    config.stash[_PENDING] = mine if whole else set()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.passed:
        item.config.stash.get(_PENDING, set()).discard(item.nodeid)
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
    whole = session.config.stash.get(_WHOLE, False)
    if not whole or exitstatus != pytest.ExitCode.OK or session.config.stash.get(_PENDING, {""}):
        return  # not every test of this suite ran and passed (a partial or --collect-only run)
    unread = sorted(all_captures() - emu_helpers.READ)
    session.config.stash[_UNREAD] = unread
    if unread:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    unread = config.stash.get(_UNREAD, [])
    if unread:
        terminalreporter.section("capture files no test read", sep="=", red=True, bold=True)
        for rel in unread:
            terminalreporter.line(f"UNREAD CAPTURE tests/emulators/captures/{rel}", red=True)
