#!/usr/bin/env bash
# Writes the tiny deterministic llama GGUF (scripts/make_tiny_gguf.py) into the cache, keyed by the
# generator's content hash and its arguments, so test runs don't regenerate it. The generator runs
# in a small cached venv holding the pinned gguf + numpy (~30 s to create once).
# Idempotent: a second run only prints the path (~0.02 s).
# Prints the path of the .gguf file on its last line.
#   usage: scripts/install_tiny_gguf.sh [GENERATOR ARGS...]   e.g. --anti-repeat 0
#          (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
set -euo pipefail
GGUF_VER=${GGUF_VERSION:-0.19.0}
NUMPY_VER=${NUMPY_VERSION:-2.4.6}
PYTHON=${PYTHON:-python3}
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$CACHE/gguf-venv"
h=$({ cat "$HERE/make_tiny_gguf.py"; printf '%s\0' "$@"; } | sha256sum | cut -c1-12)
OUT="$CACHE/tiny-$h.gguf"
if [ -s "$OUT" ]; then echo "$OUT"; exit 0; fi
pipq() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2; }
mkdir -p "$CACHE"
stamp="$VENV/.installed-gguf-$GGUF_VER-numpy-$NUMPY_VER"
if [ ! -f "$stamp" ] || ! "$VENV/bin/python" -c "import gguf, numpy" 2>/dev/null; then
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
  pipq "$VENV/bin/python" -m pip install -q --disable-pip-version-check "gguf==$GGUF_VER" "numpy==$NUMPY_VER"
  touch "$stamp"
fi
"$VENV/bin/python" "$HERE/make_tiny_gguf.py" "$OUT.tmp.$$" "$@" >&2
mv "$OUT.tmp.$$" "$OUT"
echo "$OUT"
