#!/usr/bin/env bash
# Installs NVIDIA Dynamo's OpenAI frontend and its simulated worker (`dynamo.mocker`, no GPU) from PyPI into a
# cached venv: `ai-dynamo` and `ai-dynamo-runtime` with --no-deps, then the dependencies they use here by
# hand. A plain install fails offline: the dependency `aisimulate` (Python 3.11-3.13) is a `wheel_stub` sdist
# that fetches the real wheel from a non-PyPI index; `kubernetes` is only for its operator. The tiny model is
# make_tiny_mlx.py's tokenizer and config.json without weights (`--config-only`: the mocker simulates the
# generation; its config.json names `LlamaForCausalLM`, which the mocker needs), keyed by the scripts' hash.
# Idempotent: a second run only checks the venv and prints the paths (~0.2 s).
# Prints two lines on stdout: the tiny model dir, then the venv's python on the LAST line.
# Start:  DYN_FILE_KV=<dir> PY -m dynamo.frontend --discovery-backend file --http-port N
#         DYN_FILE_KV=<dir> PY -m dynamo.mocker --model-path DIR --discovery-backend file
#   usage: scripts/install_dynamo.sh [--check]  (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
#   --check: install nothing; exit 3 if the venv is missing.
# Fresh install: ~80 MB of wheels (one 226 MB shared object unpacked); the venv takes ~630 MB.
set -euo pipefail
VER=${AI_DYNAMO_VERSION:-1.6.1}
PYTHON=${PYTHON:-python3}
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$CACHE/dynamo-venv"
PY="$VENV/bin/python"
stamp="$VENV/.installed-ai-dynamo-$VER-2"
pipq() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2; }
DEPS=(aiohttp msgspec prometheus-client pyzmq redis tqdm transformers zstandard "pydantic>=2.10.6,<=2.13.5" uvloop
  "certifi>=2026.10.19")
mhash=$(cat "$HERE/make_tiny_mlx.py" "$HERE/make_tiny_hf.py" | sha256sum | cut -c1-12)
MODEL="$CACHE/tiny-dynamo-$mhash"

venv_ok() {
  [ -f "$stamp" ] && [ -x "$PY" ] &&
    "$PY" -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('dynamo', 'dynamo.frontend', 'dynamo.mocker')) else 1)" 2>/dev/null
}

if ! venv_ok; then
  [ "${1:-}" = --check ] && { echo "ai-dynamo==$VER is not installed in $VENV" >&2; exit 3; }
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV"
  pipq "$PY" -m pip install -q --disable-pip-version-check --no-deps "ai-dynamo==$VER" "ai-dynamo-runtime==$VER"
  pipq "$PY" -m pip install -q --disable-pip-version-check "${DEPS[@]}"
  "$PY" -c "import dynamo.frontend, dynamo.mocker" >/dev/null 2>&1 ||
    { echo "install_dynamo.sh: dynamo does not import in $VENV" >&2; "$PY" -c "import dynamo.frontend, dynamo.mocker" >&2; exit 1; }
  touch "$stamp"
fi
if [ ! -f "$MODEL/.complete" ]; then
  tmp="$MODEL.tmp.$$"
  rm -rf "$tmp"
  HF_HUB_OFFLINE=1 "$PY" "$HERE/make_tiny_mlx.py" "$tmp" --config-only >&2
  touch "$tmp/.complete"
  [ -f "$MODEL/.complete" ] || { rm -rf "$MODEL"; mv -T "$tmp" "$MODEL" 2>/dev/null || true; }
  rm -rf "$tmp"
  [ -f "$MODEL/.complete" ] || { echo "install_dynamo.sh: could not write $MODEL" >&2; exit 1; }
fi
echo "$MODEL"
echo "$PY"
