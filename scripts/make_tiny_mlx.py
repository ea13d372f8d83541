#!/usr/bin/env python3
"""Write a tiny random-weight Llama model that MLX-LM (`mlx_lm.server`) serves, fully offline, with mlx's own
model classes (no torch).

    usage: make_tiny_mlx.py OUT_DIR [--seed N] [--config-only]

`--config-only` writes the tokenizer and `config.json` without weights and without mlx: what Dynamo's
simulated worker (`dynamo.mocker`, scripts/install_dynamo.sh) reads.

Needs mlx, mlx-lm, transformers and tokenizers (the venv scripts/install_mlx.sh builds; it runs this for
you). The tokenizer and chat template are make_tiny_hf.py's (char-level BPE, ChatML, EOS `<|im_end|>`), and
the weights follow its recipe so that replies behave the same way: a constant residual channel and an
`lm_head` that gives every special token a very negative logit, so the model never emits EOS or a control
token: at temperature 0 each reply runs to `max_tokens` (finish_reason "length"), and `stop` strings give
"stop". `config.json` names `LlamaForCausalLM` (Dynamo's mocker reads the same folder).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_tiny_hf import SPECIALS, build_tokenizer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output model directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config-only", action="store_true", help="the tokenizer and config.json, no weights")
    a = ap.parse_args(argv)

    out = Path(a.out)
    hf_tok = build_tokenizer()
    hf_tok.save_pretrained(out)
    special = sorted(set(hf_tok.all_special_ids) | {hf_tok.convert_tokens_to_ids(t) for t in SPECIALS})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(hf_tok),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": hf_tok.bos_token_id,
        "eos_token_id": hf_tok.eos_token_id,
        "pad_token_id": hf_tok.pad_token_id,
    }
    if a.config_only:
        (out / "config.json").write_text(json.dumps(config, indent=2))
        return 0

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    args = ModelArgs.from_dict(config)
    mx.random.seed(a.seed)
    model = Model(args)
    params = dict(tree_flatten(model.parameters()))
    emb = mx.random.normal(params["model.embed_tokens.weight"].shape)
    emb[:, 0] = 4.0  # a constant "bias" channel in the residual stream
    params["model.embed_tokens.weight"] = emb
    for i in range(args.num_hidden_layers):
        for name in (f"model.layers.{i}.self_attn.o_proj.weight", f"model.layers.{i}.mlp.down_proj.weight"):
            w = params[name]
            w[0, :] = 0.0  # keep channel 0 constant
            params[name] = w
    head = mx.random.normal(params["lm_head.weight"].shape)
    head[:, 0] = 0.0
    ids = mx.array(special)
    head[ids, :] = 0.0
    head[ids, 0] = -50.0  # never emit EOS or a control token
    params["lm_head.weight"] = head
    mx.save_safetensors(str(out / "model.safetensors"), {k: v.astype(mx.float16) for k, v in params.items()})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    print(f"wrote {out}: vocab={len(hf_tok)} params={sum(v.size for v in params.values())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
