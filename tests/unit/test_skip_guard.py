"""tests/support/skip_guard.py: unexpected skips fail a complete run, allowed ones do not, nothing changes
without the flag; the real_engine marker lands on every real-engine test and on nothing else."""

from __future__ import annotations

import textwrap

import pytest

from tests.support import skip_guard

pytest_plugins = ["pytester"]

FLAGS = skip_guard.REQUIRE_ENV
ARGS = (
    *("-p", "tests.support.skip_guard", "-p", "no:cacheprovider", "-p", "no:cloudcoil"),
    *("-o", "asyncio_default_fixture_loop_scope=function"),
)
OLLAMA_CASE = "test_auth_failure_toward_the_engine_is_the_gateways_problem"


@pytest.fixture
def flag(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """None: neither variable set; else the one variable set to 1."""
    for name in FLAGS:
        monkeypatch.delenv(name, raising=False)
    name: str | None = getattr(request, "param", None)
    if name is not None:
        monkeypatch.setenv(name, "1")
    return name


def write(pytester: pytest.Pytester, rel: str, source: str) -> None:
    path = pytester.path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


SKIPS = """
    import pytest

    def test_runs():
        pass

    def test_skips_inside():
        pytest.skip("engine not installed: foo")

    @pytest.mark.skipif(True, reason="a marker skip")
    def test_skipif():
        pass

    @pytest.fixture
    def missing():
        pytest.skip("a fixture skip")

    def test_fixture_skips(missing):
        pass

    @pytest.mark.xfail(reason="known bug")
    def test_xfails():
        assert False
"""


@pytest.mark.parametrize("flag", FLAGS, indirect=True)
def test_an_unexpected_skip_fails_a_complete_run_and_is_listed_with_its_reason(
    pytester: pytest.Pytester, flag: str
) -> None:
    write(pytester, "test_things.py", SKIPS)
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*= unexpected skips =*",
            "*3 test(s) skipped where the suite must be complete*",
            "UNEXPECTED SKIP test_things.py::test_skips_inside (call): engine not installed: foo",
            "UNEXPECTED SKIP test_things.py::test_skipif (setup): a marker skip",
            "UNEXPECTED SKIP test_things.py::test_fixture_skips (setup): a fixture skip",
        ]
    )
    assert "test_xfails" not in result.stdout.str().split("unexpected skips")[1]  # an xfail is not a skip


@pytest.mark.parametrize("flag", FLAGS, indirect=True)
def test_a_module_level_skip_counts_too(pytester: pytest.Pytester, flag: str) -> None:
    write(pytester, "test_mod.py", 'import pytest\npytest.importorskip("no_such_module_here")\n')
    result = pytester.runpytest(*ARGS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["UNEXPECTED SKIP test_mod.py (collect): *no_such_module_here*"])


def test_without_the_flag_nothing_changes(pytester: pytest.Pytester, flag: None) -> None:
    write(pytester, "test_things.py", SKIPS)
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=1, skipped=3, xfailed=1)
    assert result.ret == pytest.ExitCode.OK
    assert "unexpected skips" not in result.stdout.str()


CONTRACT = f"""
    import pytest

    @pytest.mark.parametrize("target", ["ollama/real", "ollama/emulator", "vllm/emulator"])
    def {OLLAMA_CASE}(target):
        if target.startswith("ollama"):
            pytest.skip("ollama has no authentication of its own")
"""


@pytest.mark.parametrize("flag", FLAGS, indirect=True)
def test_an_allow_listed_skip_does_not_fail_the_run(pytester: pytest.Pytester, flag: str) -> None:
    write(pytester, "tests/contract/test_contract.py", CONTRACT)
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=1, skipped=2)
    assert result.ret == pytest.ExitCode.OK
    assert "UNEXPECTED" not in result.stdout.str()
    result.stdout.fnmatch_lines([f"allowed skip tests/contract/test_contract.py::{OLLAMA_CASE}[[]ollama/real]: *"])


@pytest.mark.parametrize("flag", FLAGS, indirect=True)
def test_an_allow_listed_test_skipping_for_another_reason_still_fails(pytester: pytest.Pytester, flag: str) -> None:
    write(pytester, "tests/contract/test_contract.py", CONTRACT.replace("of its own", "today"))
    result = pytester.runpytest(*ARGS)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["UNEXPECTED SKIP *[[]ollama/real] (call): ollama has no authentication today"])


@pytest.mark.parametrize("flag", FLAGS, indirect=True)
def test_a_failing_run_still_lists_its_unexpected_skips(pytester: pytest.Pytester, flag: str) -> None:
    write(
        pytester, "test_x.py", "import pytest\ndef test_a():\n    pytest.skip('x')\ndef test_b():\n    assert False\n"
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(failed=1, skipped=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["UNEXPECTED SKIP test_x.py::test_a (call): x"])


def test_the_allow_list_is_short_and_says_why() -> None:
    assert len(skip_guard.ALLOWED_SKIPS) <= 3
    for entry in skip_guard.ALLOWED_SKIPS:
        assert entry.why and entry.reason != "*" and "*" not in entry.nodeid.split("::")[0]


def test_allow_list_patterns_match_whole_ids_and_treat_brackets_literally() -> None:
    nodeid = f"tests/contract/test_contract.py::{OLLAMA_CASE}[ollama/real]"
    reason = "ollama has no authentication of its own"
    assert skip_guard.allowed(nodeid, reason) is not None
    assert skip_guard.allowed(nodeid.replace("ollama/", "vllm/"), reason) is None
    assert skip_guard.allowed(nodeid + "x", reason) is None
    assert skip_guard.allowed(nodeid, reason + " (really)") is None
    assert skip_guard.allowed("tests/contract/test_contract.py::test_non_streaming[ollama/real]", reason) is None


# -- the real_engine marker --------------------------------------------------------------------------------

MARKED = """
    import pytest

    @pytest.fixture(scope="session")
    def llama_server():
        return "engine"

    @pytest.fixture(scope="session")
    def vllm_server():
        return "engine"

    @pytest.fixture(scope="session")
    def ollama_server():
        return "engine"

    @pytest.fixture
    def gateway(llama_server):  # indirect use
        return llama_server

    @pytest.fixture(params=["llama-server/real", "vllm/real", "sglang/emulator", "vllm/emulator"])
    def target(request):
        return request.param

    def test_direct_vllm(vllm_server):
        pass

    def test_direct_ollama(ollama_server):
        pass

    def test_through_a_fixture(gateway):
        pass

    def test_contract_style(target):
        pass

    @pytest.mark.parametrize("kind", ["x/real", "x/emulator"])
    def test_parametrized(kind):
        pass

    def test_plain():
        pass
"""
REAL = {
    "test_marks.py::test_direct_vllm",
    "test_marks.py::test_direct_ollama",
    "test_marks.py::test_through_a_fixture",
    "test_marks.py::test_contract_style[llama-server/real]",
    "test_marks.py::test_contract_style[vllm/real]",
    "test_marks.py::test_parametrized[x/real]",
}
NOT_REAL = {
    "test_marks.py::test_contract_style[sglang/emulator]",
    "test_marks.py::test_contract_style[vllm/emulator]",
    "test_marks.py::test_parametrized[x/emulator]",
    "test_marks.py::test_plain",
}


def collected(pytester: pytest.Pytester, *args: str) -> set[str]:
    result = pytester.runpytest(*ARGS, "--collect-only", "-q", *args)
    return {line for line in result.stdout.lines if line.startswith("test_marks.py::")}


@pytest.mark.parametrize("flag", [None, FLAGS[0]], indirect=True)
def test_real_engine_marker_selects_exactly_the_real_engine_tests(pytester: pytest.Pytester, flag: str | None) -> None:
    write(pytester, "test_marks.py", MARKED)
    assert collected(pytester, "-m", "real_engine") == REAL
    assert collected(pytester, "-m", "not real_engine") == NOT_REAL
    assert collected(pytester) == REAL | NOT_REAL


def test_the_marker_is_registered(pytester: pytest.Pytester, flag: None) -> None:
    write(pytester, "test_marks.py", "import pytest\n@pytest.mark.real_engine\ndef test_x():\n    pass\n")
    result = pytester.runpytest(*ARGS, "--strict-markers")
    result.assert_outcomes(passed=1)
