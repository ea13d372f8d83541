#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one: installs what is missing (scripts/setup_dev.sh,
# cached), then runs pytest against real llama-server, vLLM, Ollama, Redis and Prometheus (their
# tests fail rather than skip here), then the bounded many-streams load script.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_dev.sh
export LLM_GATEWAY_REQUIRE_ENGINES=1 LLM_GATEWAY_REQUIRE_TOOLS=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
