#!/usr/bin/env python3
"""Write a tiny, deterministic, random-weight llama-architecture GGUF for llama.cpp and Ollama.

    usage: make_tiny_gguf.py OUT.gguf [--anti-repeat 1.0] [--seed N] [--n-embd 64] [--n-layer 2] ...

Needs only ``gguf==0.19.0`` and ``numpy==2.4.6`` from PyPI (``tests/support/real_engines.py``
installs them into a small cached venv and runs this script for you). No download of weights.
The same arguments give a byte-identical file (~560 KB).

Design:

* SentencePiece-style vocab (tokenizer model "llama"): ``<unk>``, ``<s>``, ``</s>``, the
  ChatML control tokens ``<|im_start|>``/``<|im_end|>``, all 256 byte-fallback tokens
  ``<0xNN>`` (llama.cpp needs them to tokenize arbitrary input), ``\\u2581`` (space), every
  printable ASCII character and some ``\\u2581word`` pieces.
* Residual channel 0 is held constant (embedding column 0 = 4, attention/FFN output rows 0 = 0)
  and ``output.weight`` gives every non-text token a very negative logit through that channel.
  So generation only emits text pieces: readable ASCII gibberish, never EOS, control or raw
  byte tokens, and at temperature 0 every reply runs to ``max_tokens`` (finish_reason
  "length"). ``stop`` strings in requests give finish_reason "stop".
* No token ever follows itself at temperature 0 (``--anti-repeat 1``, the default): each text
  token's output row is pushed away from its own embedding. Without this (``--anti-repeat 0``,
  byte-identical to the earlier repeat-prone model) replies fall into runs of one token such as
  "5555...", and Ollama aborts a generation after 30 identical tokens (its stream then ends with
  no ``done``/``[DONE]``) after as few as ~40 tokens. Use ``--anti-repeat 0`` to provoke that
  abort as a fault case; measured here with the default: 10 prompts x 400 tokens on Ollama all
  ended with finish_reason "length", longest run of one token 1.
* ChatML chat template in ``tokenizer.chat_template``.
* Works for embeddings too: ``llama-server --embeddings --pooling mean``.
"""

from __future__ import annotations

import argparse
import sys

import gguf
import numpy as np

WORDS = (  # noqa: SIM905 (one readable block of words)
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "hello world llama gateway token model"
).split()

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_vocab() -> tuple[list[str], list[float], list[int], int]:
    """Return (tokens, scores, token types, number of leading non-text tokens)."""
    toks: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, ttype: gguf.TokenType) -> None:
        toks.append(text)
        scores.append(float(score))
        types.append(int(ttype))

    tt = gguf.TokenType
    add("<unk>", 0, tt.UNKNOWN)
    add("<s>", 0, tt.CONTROL)
    add("</s>", 0, tt.CONTROL)
    add("<|im_start|>", 0, tt.CONTROL)
    add("<|im_end|>", 0, tt.CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0, tt.BYTE)
    n_nontext = len(toks)
    add("\u2581", -1, tt.NORMAL)
    for c in range(0x21, 0x7F):
        add(chr(c), -2, tt.NORMAL)
    for i, word in enumerate(dict.fromkeys(WORDS)):
        add("\u2581" + word, -3 - i, tt.NORMAL)
    return toks, scores, types, n_nontext


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write a tiny deterministic llama GGUF with a ChatML template.")
    ap.add_argument("out", help="output .gguf path")
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--n-ff", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--anti-repeat",
        type=float,
        default=1.0,
        help="push each text token's output row away from its embedding (0: repeat-prone model)",
    )
    ap.add_argument(
        "--reranker",
        action="store_true",
        help="a reranker for llama-server --reranking: qwen3 architecture, rank pooling and a classification head",
    )
    a = ap.parse_args(argv)

    toks, scores, types, n_nontext = build_vocab()
    n_vocab, d = len(toks), a.n_embd
    head_dim = d // a.n_head
    rng = np.random.default_rng(a.seed)

    def rnd(*shape: int, std: float | None = None) -> np.ndarray:
        # numpy shape is (out, in); gguf reverses it into ggml's ne order
        s = std if std is not None else 1.0 / np.sqrt(shape[-1])
        return (rng.standard_normal(shape) * s).astype(np.float32)

    # A reranker laid out as llama.cpp's conversion of Qwen3-Reranker is: the qwen3 architecture (llama's blocks plus
    # per-head q/k norms), `qwen3.pooling_type` RANK and a `cls.output.weight` head of one row per classifier label
    # (gguf-py 0.19's names: PoolingType.RANK, MODEL_TENSOR.CLS_OUT "cls.output"). llama-server's rerank routes
    # (ggml-org/llama.cpp tools/server/server.cpp @aa6192d: /rerank, /reranking, /v1/rerank, /v1/reranking) need
    # `--reranking` and a model with rank pooling; this one was seen to load and answer /v1/rerank with scores in
    # (0, 1) on the cached llama-server build (tests/e2e/test_rerank_llama_server.py).
    w = gguf.GGUFWriter(a.out, "qwen3" if a.reranker else "llama")
    if a.reranker:
        w.add_pooling_type(gguf.PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
    w.add_name("tiny-random-llama")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(a.n_ctx)
    w.add_embedding_length(d)
    w.add_block_count(a.n_layer)
    w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML)

    emb = rnd(n_vocab, d, std=1.0)
    emb[:, 0] = 4.0  # constant "bias" channel
    w.add_tensor("token_embd.weight", emb)
    for i in range(a.n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(p + "attn_q.weight", rnd(a.n_head * head_dim, d))
        w.add_tensor(p + "attn_k.weight", rnd(a.n_head_kv * head_dim, d))
        if a.reranker:
            w.add_tensor(p + "attn_q_norm.weight", np.ones(head_dim, np.float32))
            w.add_tensor(p + "attn_k_norm.weight", np.ones(head_dim, np.float32))
        w.add_tensor(p + "attn_v.weight", rnd(a.n_head_kv * head_dim, d))
        wo = rnd(d, a.n_head * head_dim)
        wo[0, :] = 0  # keep channel 0 constant
        w.add_tensor(p + "attn_output.weight", wo)
        w.add_tensor(p + "ffn_norm.weight", np.ones(d, np.float32))
        w.add_tensor(p + "ffn_gate.weight", rnd(a.n_ff, d))
        w.add_tensor(p + "ffn_up.weight", rnd(a.n_ff, d))
        wd = rnd(d, a.n_ff)
        wd[0, :] = 0
        w.add_tensor(p + "ffn_down.weight", wd)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    out = rnd(n_vocab, d, std=1.0)
    out[:, 0] = 0.0
    out[n_nontext:, 1:] -= a.anti_repeat * emb[n_nontext:, 1:]  # no token follows itself
    out[:n_nontext, :] = 0.0
    out[:n_nontext, 0] = -50.0  # never sample <unk>/<s>/</s>/control/byte tokens
    w.add_tensor("output.weight", out)
    if a.reranker:
        w.add_tensor("cls.output.weight", rnd(2, d))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(
        f"wrote {a.out}: vocab={n_vocab} n_embd={d} n_layer={a.n_layer} n_head={a.n_head}/{a.n_head_kv}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
