"""HEAD Ollama's ``logprobs``: the entries (``[{token, logprob, bytes, top_logprobs?}]``, api/types.go
``Logprob``; server/logprob.go ``toAPILogprobs``) for emulated tokens, and the native stream lines that
carry them (``LogprobStream``). The 0.5.4 build has none of this. Kept apart from the engine
(ollama.py) and its native routes (ollama_native.py), which both build answers with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llm_gateway_emulators import textgen
from llm_gateway_emulators.engines.ollama_stream import NativeStream, go_json

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.ollama import Ollama


def token_logprobs(tokens: list[str], top: int) -> list[dict[str, Any]]:
    """HEAD's ``logprobs`` entries for ``tokens`` (emulated values: the chosen token is the likeliest)."""
    out: list[dict[str, Any]] = []
    for t in tokens:
        i = textgen.VOCAB.index(t) if t in textgen.VOCAB else 0
        entry: dict[str, Any] = {"token": t, "logprob": -0.25 - (i % 5) * 0.5}
        if t:
            entry["bytes"] = list(t.encode())
        if top > 0:
            alts = [t] + [textgen.VOCAB[(i + k) % len(textgen.VOCAB)] for k in range(1, top)]
            entry["top_logprobs"] = [
                {"token": a, "logprob": entry["logprob"] - k, "bytes": list(a.encode())} for k, a in enumerate(alts)
            ]
        out.append(entry)
    return out


def split_tokens(text: str) -> list[str]:
    """The emulated tokens of generated ``text`` (VOCAB in order from the first; a stop-cut rest as one)."""
    out: list[str] = []
    pos = i = 0
    while pos < len(text):
        t = textgen.token_text(i)
        if not t or not text.startswith(t, pos):
            out.append(text[pos:])
            break
        out.append(t)
        pos += len(t)
        i += 1
    return out


class LogprobStream(NativeStream):
    """HEAD's stream lines with ``logprobs`` (after ``done``, as api.ChatResponse orders its fields)."""

    def __init__(self, eng: Ollama, model: str, chat: bool, top: int) -> None:
        super().__init__(eng, model, chat)
        self.top = top

    def token(self, delta: str) -> bytes:
        line = super().token(delta)
        if not delta:
            return line
        return line[:-2] + b',"logprobs":' + go_json(token_logprobs([delta], self.top)) + b"}\n"
