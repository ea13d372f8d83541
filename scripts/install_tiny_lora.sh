#!/usr/bin/env bash
# Writes a tiny random LoRA adapter for the tiny test models (scripts/make_tiny_lora.py) into the cache, keyed by
# the generator's content hash and its arguments, so test runs don't regenerate it. Prints its path on the last line.
#   usage: scripts/install_tiny_lora.sh hf   [GENERATOR ARGS...]  a PEFT dir for the tiny HF model (vLLM, SGLang);
#                                                                  needs the vLLM venv (scripts/install_vllm.sh)
#          scripts/install_tiny_lora.sh gguf [GENERATOR ARGS...]  a GGUF LoRA for the tiny GGUF (llama-server --lora);
#                                                                  in the gguf venv of scripts/install_tiny_gguf.sh
#   (cache: $LLM_GATEWAY_CACHE or ~/.cache/llm-gateway). Idempotent: a second run only prints the path.
set -euo pipefail
KIND=${1:?usage: install_tiny_lora.sh hf|gguf [ARGS...]}; shift
CACHE=${LLM_GATEWAY_CACHE:-$HOME/.cache/llm-gateway}
HERE=$(cd "$(dirname "$0")" && pwd)
h=$({ cat "$HERE/make_tiny_lora.py"; printf '%s\0' "$KIND" "$@"; } | sha256sum | cut -c1-12)
case "$KIND" in
  hf)
    lines=$(bash "$HERE/install_vllm.sh" --check)  # exit 3 (not installed) passes through
    BASE=$(echo "$lines" | tail -n 2 | head -n 1); PY=$(echo "$lines" | tail -n 1)
    OUT="$CACHE/tiny-lora-hf-$h"
    if [ ! -f "$OUT/.complete" ]; then
      tmp="$OUT.tmp.$$"; rm -rf "$tmp"
      "$PY" "$HERE/make_tiny_lora.py" hf "$tmp" --base "$BASE" "$@" >&2
      touch "$tmp/.complete"
      [ -f "$OUT/.complete" ] || { rm -rf "$OUT"; mv -T "$tmp" "$OUT" 2>/dev/null || true; }
      rm -rf "$tmp"
    fi ;;
  gguf)
    bash "$HERE/install_tiny_gguf.sh" >/dev/null  # its venv (gguf + numpy), and the base model it fits
    OUT="$CACHE/tiny-lora-$h.gguf"
    if [ ! -s "$OUT" ]; then
      "$CACHE/gguf-venv/bin/python" "$HERE/make_tiny_lora.py" gguf "$OUT.tmp.$$" "$@" >&2
      mv "$OUT.tmp.$$" "$OUT"
    fi ;;
  *) echo "install_tiny_lora.sh: hf or gguf, not $KIND" >&2; exit 2 ;;
esac
echo "$OUT"
