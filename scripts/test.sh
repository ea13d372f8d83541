#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a warm one: installs what is missing (scripts/setup_dev.sh,
# cached), runs pytest against real llama-server, vLLM, Ollama, Redis and Prometheus (their tests fail
# rather than skip here; any skip that ALLOWED_SKIPS in tests/support/skip_guard.py does not name fails
# the run, listed with its reason), then the bounded many-streams load test (bench/streams.py: as many
# concurrent streams as the fd limit allows, up to 10,000, over 5 rounds; fails on any error, stall or leak).
#   scripts/test.sh -m "not real_engine"   pytest without the real engines (the marker is set for you)
#   scripts/test.sh                 everything
#   scripts/test.sh tests/unit -x   only pytest, with these arguments
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_dev.sh
export LLM_GATEWAY_REQUIRE_ENGINES=1 LLM_GATEWAY_REQUIRE_TOOLS=1
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
if [ $# -eq 0 ]; then
  timeout 900 .venv/bin/python bench/streams.py --n 10000 --rounds 5
fi
