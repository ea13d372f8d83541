"""A pytest plugin: no silent skips where the suite must be complete, and one marker for real engines.

Registered from ``tests/conftest.py`` (``pytest_plugins``).

Skips. Where the suite is meant to be complete (``scripts/test.sh`` sets ``LLM_GATEWAY_REQUIRE_ENGINES=1``
and ``LLM_GATEWAY_REQUIRE_TOOLS=1``), a skip is a test that did not run, so any skip that ``ALLOWED_SKIPS``
below does not name fails the session: the terminal summary lists each one with its reason and the exit
status becomes non-zero. ``ALLOWED_SKIPS`` is the one place skips are allowed, each entry with the reason
it is by design. An xfail is not a skip. Without either variable nothing changes (a developer machine
without the engines skips as before).

Marker. Every test that uses a real engine gets the ``real_engine`` marker at collection: the tests that
use one of the session fixtures in ``REAL_ENGINE_FIXTURES`` (``tests/conftest.py``), directly or through
other fixtures, and the contract cases whose target parameter ends in ``/real`` (``tests/contract``, where
the engine fixture is requested at run time). So ``-m real_engine`` / ``-m "not real_engine"`` select them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest

REQUIRE_ENV = ("LLM_GATEWAY_REQUIRE_ENGINES", "LLM_GATEWAY_REQUIRE_TOOLS")
REAL_ENGINE_FIXTURES = frozenset({"llama_server", "vllm_server", "ollama_server", "mlx_server", "dynamo_server"})
REAL_TARGET_SUFFIX = "/real"
MARKER = "real_engine"


@dataclass(frozen=True)
class AllowedSkip:
    """A skip that is by design. ``nodeid`` and ``reason`` are patterns where only ``*`` is special
    (any characters); both must match. ``why`` says why the test cannot run there."""

    nodeid: str
    reason: str
    why: str

    def matches(self, nodeid: str, reason: str) -> bool:
        return _glob(self.nodeid).fullmatch(nodeid) is not None and _glob(self.reason).fullmatch(reason) is not None


#: The only skips allowed where the suite must be complete.
ALLOWED_SKIPS: tuple[AllowedSkip, ...] = (
    AllowedSkip(
        nodeid="tests/contract/test_contract.py::test_auth_failure_toward_the_engine_is_the_gateways_problem[ollama/*]",
        reason="ollama has no authentication of its own",
        why="Ollama has no API key, so there is no engine-side auth failure to provoke (real and emulated)",
    ),
    AllowedSkip(
        nodeid="tests/contract/test_contract.py::test_auth_failure_toward_the_engine_is_the_gateways_problem[*]",
        reason="*'s server takes no API key",
        why="MLX-LM, trtllm-serve, MLC LLM and Dynamo's frontend take no API key (HAS_AUTH in test_contract.py), so"
        " there is no engine-side auth failure to provoke",
    ),
)


@dataclass(frozen=True)
class Skip:
    nodeid: str
    reason: str
    where: str  # "collect", "setup", "call" or "teardown"


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.DOTALL)


def allowed(nodeid: str, reason: str, entries: tuple[AllowedSkip, ...] = ALLOWED_SKIPS) -> AllowedSkip | None:
    """The allow-list entry that covers this skip, if any."""
    return next((e for e in entries if e.matches(nodeid, reason)), None)


def required() -> bool:
    return any(os.environ.get(name) == "1" for name in REQUIRE_ENV)


def uses_real_engine(item: pytest.Item) -> bool:
    if REAL_ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return False
    if any(isinstance(v, str) and v.endswith(REAL_TARGET_SUFFIX) for v in callspec.params.values()):
        return True
    return any(part.endswith(REAL_TARGET_SUFFIX) for part in callspec.id.split("-"))


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


# -- the plugin ---------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    if not any(line.split(":", 1)[0].strip() == MARKER for line in config.getini("markers")):
        config.addinivalue_line("markers", f"{MARKER}: runs against a real engine process")
    config.pluginmanager.register(SkipGuard(active=required()), "llm-gateway-skip-guard")


class SkipGuard:
    """One per session: marks real-engine tests, records skips, fails the session on unexpected ones."""

    def __init__(self, active: bool) -> None:
        self.active = active
        self.skips: list[Skip] = []

    def unexpected(self) -> list[Skip]:
        return [s for s in self.skips if allowed(s.nodeid, s.reason) is None]

    @pytest.hookimpl(tryfirst=True)  # before -m deselects
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            if uses_real_engine(item) and item.get_closest_marker(MARKER) is None:
                item.add_marker(MARKER)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skips.append(Skip(report.nodeid, _reason(report), "collect"))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append(Skip(report.nodeid, _reason(report), report.when))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        if self.active and self.unexpected() and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.active:
            return
        unexpected = self.unexpected()
        if unexpected:
            names = " / ".join(f"{n}=1" for n in REQUIRE_ENV)
            terminalreporter.section("unexpected skips", sep="=", red=True, bold=True)
            terminalreporter.line(
                f"{len(unexpected)} test(s) skipped where the suite must be complete ({names}); each fails "
                "the session unless ALLOWED_SKIPS in tests/support/skip_guard.py names it:",
                red=True,
            )
            for s in unexpected:
                terminalreporter.line(f"UNEXPECTED SKIP {s.nodeid} ({s.where}): {s.reason}", red=True)
        by_design = [(s, e) for s in self.skips if (e := allowed(s.nodeid, s.reason)) is not None]
        if by_design:
            terminalreporter.section("skips allowed by design", sep="-")
            for s, e in by_design:
                terminalreporter.line(f"allowed skip {s.nodeid}: {e.why}")
