"""The captures and the tests that read them: every capture file is named, in full, by some test of
this suite; every capture a test names exists; the raw HTTP ones parse. (``conftest.py`` checks, after
a full run, that each file was actually read.)"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from emu_helpers import CAPTURES, parse_capture

HERE = Path(__file__).resolve().parent
CAPTURE_PATH = re.compile(r"^(llamacpp|ollama|vllm)/[\w./-]+\.txt$")


def capture_files() -> set[str]:
    return {p.relative_to(CAPTURES).as_posix() for p in CAPTURES.rglob("*") if p.is_file() and p.suffix == ".txt"}


def named_in_tests() -> dict[str, set[str]]:
    """Capture paths written as string literals in the test modules, with the modules naming them."""
    out: dict[str, set[str]] = {}
    for module in sorted(HERE.glob("test_*.py")):
        for node in ast.walk(ast.parse(module.read_text(), str(module))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CAPTURE_PATH.match(node.value):
                out.setdefault(node.value, set()).add(module.name)
    return out


def test_every_capture_file_is_named_by_a_test() -> None:
    unnamed = sorted(capture_files() - set(named_in_tests()))
    assert not unnamed, (
        "capture files no test names (write the full path, e.g. 'vllm/health.txt', where a test reads it, "
        f"or delete the file with a reason in captures/README.md): {unnamed}"
    )


def test_every_capture_a_test_names_exists() -> None:
    missing = {rel: sorted(mods) for rel, mods in named_in_tests().items() if not (CAPTURES / rel).is_file()}
    assert not missing, f"tests name capture files that do not exist: {missing}"


def test_the_readme_gives_a_reason_for_every_deleted_capture() -> None:
    readme = (CAPTURES / "README.md").read_text()
    deleted = re.findall(r"^- `([^`]+\.txt)`: (.+)$", readme, re.MULTILINE)
    assert deleted, "captures/README.md lists no deleted captures"
    for rel, reason in deleted:
        assert not (CAPTURES / rel).exists(), f"{rel} is listed as deleted but still there"
        assert len(reason.split()) >= 5, f"{rel}: say why it was deleted"


def test_raw_http_captures_parse() -> None:
    notes = {rel for rel in capture_files() if not _is_http(CAPTURES / rel)}
    for rel in sorted(capture_files() - notes):  # parsed here without counting as read
        got = parse_capture((CAPTURES / rel).read_bytes())
        assert 100 <= got.status < 600 and got.headers, rel
    # the few that are notes, logs or a bare metrics body are read as text by their tests
    assert notes == {
        "llamacpp/http/50_client_disconnect.txt",
        "ollama/queue-full/serve-log.txt",
        "ollama/serve-log-first.txt",
        "vllm/metrics-under-load.txt",
        "vllm/serve-log-default.txt",
        "vllm/serve-log-eager-apikey.txt",
        "vllm/serve-log-eager-no-triton.txt",
        "vllm/serve-log-headdim16-crash.txt",
    }


def _is_http(path: Path) -> bool:
    raw = path.read_bytes()
    if raw.startswith(b"$ "):
        raw = raw.split(b"\n", 1)[1]
    return raw.startswith(b"HTTP/1.1 ")
