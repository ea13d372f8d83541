#!/usr/bin/env bash
# The gateway's main job on an embedded default, from a fresh clone:
# installs the project, gets a real llama.cpp server (the xllamacpp wheel: llama.cpp's own server
# code, installed in seconds), generates a tiny GGUF model locally, starts the engine and the
# gateway in front of it (config/gateway.yaml), and shows a chat completion going through it with
# the openai SDK. Then it keeps serving on http://127.0.0.1:8080/v1 until Ctrl-C.
#   scripts/quickstart.sh            # demo, then keep serving
#   scripts/quickstart.sh --demo     # demo, then stop everything
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO_ONLY=0; [ "${1:-}" = "--demo" ] && DEMO_ONLY=1
GATEWAY_PORT=${GATEWAY_PORT:-8080}; LLAMA_PORT=${LLAMA_PORT:-8081}
T0=$(date +%s)
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
echo "== installing llm-gateway, xllamacpp and the openai SDK into .venv"
mkdir -p .cache
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e . "xllamacpp==2026.10.11549" "openai>=1.40" > .cache/pip.log 2>&1 \
  || { quiet < .cache/pip.log >&2; exit 1; }
echo "== generating the tiny GGUF model (cached)"
MODEL=$(scripts/install_tiny_gguf.sh | tail -1)
echo "   $MODEL"

PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM
echo "== starting llama.cpp server on 127.0.0.1:$LLAMA_PORT (log: .cache/llama.log)"
.venv/bin/python scripts/xllamacpp_serve.py --model "$MODEL" --alias tiny-llama --port "$LLAMA_PORT" > .cache/llama.log 2>&1 &
PIDS+=($!)
echo "== starting the gateway on 127.0.0.1:$GATEWAY_PORT (log: .cache/gateway.log)"
GATEWAY_PORT=$GATEWAY_PORT LLAMA_URL=http://127.0.0.1:$LLAMA_PORT .venv/bin/llm-gateway serve --config config/gateway.yaml > .cache/gateway.log 2>&1 &
PIDS+=($!)
for i in $(seq 1 150); do
  if .venv/bin/python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$GATEWAY_PORT/readyz').status==200 else 1)" 2>/dev/null; then break; fi
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || { echo "a process died; see .cache/*.log" >&2; tail -20 .cache/*.log >&2; exit 1; }; done
  sleep 0.2
done
echo "== ready after $(( $(date +%s) - T0 )) s"
.venv/bin/python scripts/quickstart_demo.py "http://127.0.0.1:$GATEWAY_PORT/v1"
if [ $DEMO_ONLY = 1 ]; then exit 0; fi
echo
echo "The gateway is serving http://127.0.0.1:$GATEWAY_PORT/v1 (metrics: /metrics). Ctrl-C stops it and the engine."
wait "${PIDS[1]}"
