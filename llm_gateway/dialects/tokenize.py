"""vLLM's token utilities on the gateway: `POST /tokenize` ({model, prompt} or {model, messages}: the tokens by the
model's own tokenizer) and `POST /detokenize` ({model, tokens}: the text), served by a deployment with the
`tokenize` capability (service/tokenize.py; each engine's shape in adapters/tokenize.py). Errors are OpenAI's
envelope."""

from __future__ import annotations

from llm_gateway.dialects.common import HandlerContext, authenticate, read_json_object
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service import tokenize as service
from llm_gateway.service.runtime import Runtime


async def tokenize(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "tokenize"
    who = authenticate(call, rec, rt)
    await service.serve(ctx.service.gw, call, rec, rt, "tokenize", await read_json_object(ctx, call), who)


async def detokenize(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "detokenize"
    who = authenticate(call, rec, rt)
    await service.serve(ctx.service.gw, call, rec, rt, "detokenize", await read_json_object(ctx, call), who)
