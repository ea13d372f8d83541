#!/usr/bin/env python3
"""Write a tiny deterministic random LoRA adapter for the tiny test models, fully offline.

    usage: make_tiny_lora.py hf OUT_DIR --base TINY_HF_DIR [--seed N]   (a PEFT adapter for vLLM / SGLang)
           make_tiny_lora.py gguf OUT.gguf [--n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2] [--seed N]
                                                                          (a GGUF LoRA for llama-server --lora)

Both target the attention's q and v projections of every layer, rank 8, alpha 16, with weights large enough
that the adapter visibly changes the tiny model's replies (tests compare them with the base model's).

* `hf`: `adapter_config.json` (peft_type LORA, r, lora_alpha, target_modules [q_proj, v_proj]) and
  `adapter_model.safetensors` with PEFT's tensor names `base_model.model.model.layers.N.self_attn.q_proj.lora_A
  .weight` (rank x in) and `...lora_B.weight` (out x rank), written with numpy + safetensors (no peft needed);
  the shapes come from the base model's config.json. Runs in the vLLM venv (scripts/install_tiny_lora.sh).
* `gguf`: what llama.cpp's convert_lora_to_gguf.py writes and src/llama-adapter.cpp checks: `general.type`
  "adapter", `general.architecture` the base model's ("llama"), `adapter.type` "lora", `adapter.lora.alpha`,
  and per layer `blk.N.attn_q.weight.lora_a` (numpy rank x in: ggml [in, rank]) and `.lora_b` (out x rank).
  The defaults match scripts/make_tiny_gguf.py's. Runs in the gguf venv (gguf + numpy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

RANK, ALPHA = 8, 16.0


def pair(rng: np.random.Generator, n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    a = (rng.standard_normal((RANK, n_in)) / np.sqrt(n_in)).astype(np.float32)
    b = rng.standard_normal((n_out, RANK)).astype(np.float32)  # (PEFT starts B at 0: a trained adapter's is not)
    return a, b


def write_hf(out: Path, base: Path, seed: int) -> None:
    from safetensors.numpy import save_file

    cfg = json.loads((base / "config.json").read_text())
    d, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or d // heads
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for i in range(cfg["num_hidden_layers"]):
        for proj, n_out in (("q_proj", heads * head_dim), ("v_proj", kv * head_dim)):
            a, b = pair(rng, d, n_out)
            p = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[p + ".lora_A.weight"], tensors[p + ".lora_B.weight"] = a, b
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2))


def write_gguf(out: Path, a: argparse.Namespace) -> None:
    import gguf

    head_dim = a.n_embd // a.n_head
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, ALPHA)
    w.add_name("tiny-random-lora")
    for i in range(a.n_layer):
        for t, n_out in (("attn_q", a.n_head * head_dim), ("attn_v", a.n_head_kv * head_dim)):
            la, lb = pair(rng, a.n_embd, n_out)
            w.add_tensor(f"blk.{i}.{t}.weight.lora_a", la)
            w.add_tensor(f"blk.{i}.{t}.weight.lora_b", lb)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("hf", "gguf"))
    ap.add_argument("out")
    ap.add_argument("--base", help="hf: the tiny HF model directory (its config.json gives the shapes)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    a = ap.parse_args(argv)
    if a.kind == "hf":
        if not a.base:
            ap.error("hf needs --base")
        write_hf(Path(a.out), Path(a.base), a.seed)
    else:
        write_gguf(Path(a.out), a)
    print(f"wrote {a.kind} LoRA adapter {a.out} (rank {RANK}, alpha {ALPHA:g})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
