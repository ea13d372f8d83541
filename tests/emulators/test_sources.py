"""The emulators with no captures of their own say which engine source they follow: repository, files
and the commit that was read."""

from __future__ import annotations

import re

import pytest

from llm_gateway_emulators.engines import lmdeploy, sglang, tabbyapi

COMMIT = re.compile(r"@?\b[0-9a-f]{40}\b")


@pytest.mark.parametrize(
    ("module", "repo", "files"),
    [
        (sglang, "sgl-project/sglang", ["python/sglang/srt/entrypoints/http_server.py", "python/sglang/srt/utils.py"]),
        (tabbyapi, "theroyallab/tabbyAPI", ["common/auth.py", "endpoints/OAI/utils/chat_completion.py"]),
        (lmdeploy, "InternLM/lmdeploy", ["lmdeploy/serve/openai/api_server.py", "server_utils.py"]),
    ],
)
def test_module_docstring_cites_repository_files_and_commit(module: object, repo: str, files: list[str]) -> None:
    doc = module.__doc__ or ""
    assert repo in doc
    for f in files:
        assert f in doc, f
    assert COMMIT.search(doc), "cite the full commit the source was read at"
