#!/usr/bin/env python3
"""Write a tiny random-weight Hugging Face Llama model directory that vLLM serves, fully offline.

    usage: make_tiny_hf.py OUT_DIR [--seed N]

Needs torch, transformers and tokenizers (all present in the vLLM venv that
``scripts/install_vllm.sh`` builds; it runs this script for you). No hub access.

Properties the tests rely on:

* Deterministic: the same script and seed give the same tokenizer and weights.
* Char-level BPE tokenizer (Metaspace, no byte fallback): every token decodes to valid
  UTF-8 text, so vLLM's streamed deltas carry visible characters. (With a byte-level BPE a
  random model emits mostly partial UTF-8 and vLLM streams empty ``"content": ""`` deltas.)
* head_dim = 64: vLLM's CPU attention only supports head sizes 32, 64, 80, 96, 112, 128, ...
  A head dim of 16 loads, then kills the engine on the first request.
* Residual channel 0 is held constant and ``lm_head`` gives every special token a very
  negative logit, so the model never emits EOS/<unk>/<pad>/ChatML markers: at temperature 0
  each reply runs to ``max_tokens`` (finish_reason "length"), and ``stop`` strings give
  finish_reason "stop".
* ChatML chat template; EOS is ``<|im_end|>``.
"""

from __future__ import annotations

import argparse
import sys

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "You are a helpful assistant. user assistant system",
    "Say hello. Write a story about a llama gateway model token.",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
] * 50


def build_tokenizer():  # type: ignore[no-untyped-def]
    """Train a small deterministic char-level BPE tokenizer and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIALS,
        initial_alphabet=[chr(c) for c in range(32, 127)] + ["\n", "\u2581"],
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "</s>"],
        model_max_length=2048,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="output model directory")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    hf_tok = build_tokenizer()
    hf_tok.save_pretrained(a.out)
    special_ids = sorted(set(hf_tok.all_special_ids) | {hf_tok.convert_tokens_to_ids(t) for t in SPECIALS})

    cfg = LlamaConfig(
        vocab_size=len(hf_tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,  # head_dim = 64 (allowed by vLLM's CPU attention)
        num_key_value_heads=1,
        max_position_embeddings=2048,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(a.seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.normal_(0.0, 1.0)
        emb[:, 0] = 4.0  # constant "bias" channel in the residual stream
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0  # keep channel 0 constant
            layer.mlp.down_proj.weight[0, :] = 0.0
        head = model.lm_head.weight
        head.normal_(0.0, 1.0)
        head[:, 0] = 0.0
        head[special_ids, :] = 0.0
        head[special_ids, 0] = -50.0  # never emit EOS / control tokens
    model = model.to(torch.bfloat16)
    model.save_pretrained(a.out)
    GenerationConfig(
        bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    ).save_pretrained(a.out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: vocab={len(hf_tok)} params={n_params}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
