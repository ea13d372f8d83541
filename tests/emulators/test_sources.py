"""The emulators with no captures of their own say which engine source they follow: repository, files
and the commit that was read."""

from __future__ import annotations

import re

import pytest

from llm_gateway_emulators.engines import aphrodite, dynamo, lmdeploy, lmstudio, mlc, sglang, tabbyapi, tgi, trtllm

COMMIT = re.compile(r"@?\b[0-9a-f]{40}\b")


@pytest.mark.parametrize(
    ("module", "repo", "files"),
    [
        (sglang, "sgl-project/sglang", ["python/sglang/srt/entrypoints/http_server.py", "python/sglang/srt/utils.py"]),
        (tabbyapi, "theroyallab/tabbyAPI", ["common/auth.py", "endpoints/OAI/utils/chat_completion.py"]),
        (lmdeploy, "InternLM/lmdeploy", ["lmdeploy/serve/openai/api_server.py", "server_utils.py"]),
        (aphrodite, "aphrodite-engine/aphrodite-engine", ["aphrodite/entrypoints/openai/engine/protocol.py"]),
        (
            trtllm,
            "NVIDIA/TensorRT-LLM",
            ["serve/openai_protocol.py", "serve/openai_server.py"],
        ),
        (mlc, "mlc-ai/mlc-llm", ["python/mlc_llm/protocol/error_protocol.py", "openai_entrypoints.py"]),
        (dynamo, "ai-dynamo/dynamo", ["lib/llm/src/http/service/error.rs"]),
        (lmstudio, "lmstudio-ai/docs", ["1_developer/2_rest/list.md"]),
        (tgi, "huggingface/text-generation-inference", ["router/src/server.rs", "router/src/chat.rs"]),
    ],
)
def test_module_docstring_cites_repository_files_and_commit(module: object, repo: str, files: list[str]) -> None:
    doc = module.__doc__ or ""
    assert repo in doc
    for f in files:
        assert f in doc, f
    assert COMMIT.search(doc), "cite the full commit the source was read at"
