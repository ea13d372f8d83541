#!/usr/bin/env bash
# Installs the real MLX-LM server (`mlx_lm.server`, Apple's MLX on its Linux CPU backend: PyPI `mlx-lm[cpu]`;
# a plain `mlx-lm` leaves mlx out on Linux) into a cached venv, and writes a tiny random-weight Llama model
# with mlx's own model classes (scripts/make_tiny_mlx.py, no torch) into the cache, keyed by the content hash
# of that script and of make_tiny_hf.py (its tokenizer). Idempotent: a second run only checks the venv
# (stamp + find_spec) and prints the paths (~0.2 s).
# Prints two lines on stdout: the tiny model dir, then the venv's python on the LAST line.
# Start the server with:  HF_HUB_OFFLINE=1 HF_HUB_CACHE=<an existing dir> PY -m mlx_lm server --model DIR --port N
#   (without an existing Hugging Face cache folder its /v1/models is a 200 with an empty body).
#   usage: scripts/install_mlx.sh [--check]  (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
#   --check: install nothing; exit 3 if the venv is missing.
# Fresh install: ~40 s and ~60 MB of downloads on 2 cores (mlx-cpu bundles OpenBLAS); the venv takes ~370 MB.
# The wheels are manylinux_2_35 (glibc >= 2.35; Debian 12 has 2.36).
set -euo pipefail
VER=${MLX_LM_VERSION:-0.32.2}
MLX_VER=${MLX_VERSION:-0.32.4}
PYTHON=${PYTHON:-python3}
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$CACHE/mlx-venv"
PY="$VENV/bin/python"
mhash=$(cat "$HERE/make_tiny_mlx.py" "$HERE/make_tiny_hf.py" | sha256sum | cut -c1-12)
MODEL="$CACHE/tiny-mlx-$mhash"
stamp="$VENV/.installed-mlx-lm-$VER-mlx-$MLX_VER"
pipq() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2; }
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

venv_ok() {
  [ -f "$stamp" ] && [ -x "$PY" ] &&
    "$PY" -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('mlx', 'mlx_lm', 'transformers')) else 1)" 2>/dev/null
}

if ! venv_ok; then
  [ "${1:-}" = --check ] && { echo "mlx-lm==$VER is not installed in $VENV" >&2; exit 3; }
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV"
  pipq "$PY" -m pip install -q --disable-pip-version-check "mlx-lm[cpu]==$VER" "mlx[cpu]==$MLX_VER"
  "$PY" -c "import mlx.core as mx, mlx_lm.server; mx.zeros(1).tolist()" >/dev/null 2>&1 ||
    { echo "install_mlx.sh: mlx does not import in $VENV" >&2; "$PY" -c "import mlx.core, mlx_lm.server" >&2; exit 1; }
  touch "$stamp"
fi

if [ ! -f "$MODEL/.complete" ]; then
  tmp="$MODEL.tmp.$$"
  rm -rf "$tmp"
  "$PY" "$HERE/make_tiny_mlx.py" "$tmp" >&2
  touch "$tmp/.complete"
  [ -f "$MODEL/.complete" ] || { rm -rf "$MODEL"; mv -T "$tmp" "$MODEL" 2>/dev/null || true; }
  rm -rf "$tmp"
  [ -f "$MODEL/.complete" ] || { echo "install_mlx.sh: could not write $MODEL" >&2; exit 1; }
fi
echo "$MODEL"
echo "$PY"
