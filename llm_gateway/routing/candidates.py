"""Which deployments of a model can serve a request at all, and whether the request fits them.

Eligible: the deployments whose weight format matches the one asked for (if any) and whose capabilities
cover what the request needs (tools, vision, JSON schema...), cached per route and need; a 400 naming what
is missing when none is. Fits: the request fits a deployment's context window where the window is known,
the prompt counted by the engine's own tokenizer where prompt_count.py asked it, else at its lower bound
(request_info `prompt_floor`), plus `max_tokens` where the engine counts it against the window; when no
deployment of the model or its fallbacks fits, a 400 `context_length_exceeded` (OpenAI's code) says which
window came nearest and what the request needs, before any engine is called. No I/O: dispatch.py decides
with these, and prompt_count.py asks the engines where the answer is ambiguous.
"""

from __future__ import annotations

from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.table import Deployment, ModelRoute


def eligible(route: ModelRoute, info: RequestInfo) -> list[Deployment]:
    """Deployments that could serve this request at all (ignores health); cached per route and need."""
    key = (info.format, info.needs)
    found = route.eligible.get(key)
    if found is None:
        found = [
            d
            for d in route.deployments
            if (info.format is None or d.cfg.format == info.format) and info.needs <= d.cfg.capabilities
        ]
        if len(route.eligible) < 256:
            route.eligible[key] = found
    return found


def explain_ineligible(route: ModelRoute, info: RequestInfo) -> InvalidRequest:
    if info.format is not None and not any(d.cfg.format == info.format for d in route.deployments):
        have = sorted({d.cfg.format for d in route.deployments})
        return InvalidRequest(
            f"no deployment of model '{route.name}' serves the '{info.format}' weight format "
            f"(it has: {', '.join(have)})",
            param="model",
            code="format_unavailable",
        )
    missing = sorted(info.needs - set().union(*(d.cfg.capabilities for d in route.deployments)))
    return InvalidRequest(
        f"model '{route.name}' has no deployment with the capabilities this request needs: "
        f"{', '.join(missing) or 'a combination'}",
        param="model",
        code="capability_unavailable",
    )


def output_counted(d: Deployment, info: RequestInfo) -> int:
    """The output tokens the fit check adds to the prompt: `max_tokens` where the deployment's engine
    refuses a prompt plus `max_tokens` over its window; 0 where it cuts the generation at the window's
    end, or when the request sets none (the engines then fill what is left)."""
    return (info.max_tokens or 0) if d.backend.adapter.window_counts_output else 0


def fits(d: Deployment, info: RequestInfo) -> bool:
    """Can the request fit the deployment's context window? An unknown window fits (no refusal on a
    guess); the prompt counts as the engine counted it where it was asked (an ambiguous size), else at
    its lower bound (request_info `prompt_floor`), so a request the engine would take is never kept
    from it."""
    window = d.context_length
    if window is None:
        return True
    exact = info.prompt_exact
    out = output_counted(d, info)
    if exact is None or d.model not in exact:
        ceiling = info.prompt_ceiling
        if ceiling is not None and ceiling + out <= window:
            return True  # even the upper bound fits (the floor is below it): the floor is not summed at all
        return info.prompt_floor + out <= window
    return exact[d.model] + out <= window


def explain_too_long(route: ModelRoute, deps: list[Deployment], info: RequestInfo) -> InvalidRequest:
    """400 `context_length_exceeded` (OpenAI's code), naming the window that came nearest and the count."""
    nearest = max(deps, key=lambda d: (d.context_length or 0) - output_counted(d, info))
    window, out = nearest.context_length, output_counted(nearest, info)
    exact = info.prompt_exact.get(nearest.model) if info.prompt_exact else None
    prompt = info.prompt_floor if exact is None else exact
    need = f"{'at least ' if exact is None else ''}{prompt + out} tokens"
    if out:
        need += f" ({prompt} of prompt and max_tokens {out})"
    how = (
        "by the gateway's estimate (a lower bound of the prompt's tokens)"
        if exact is None
        else "its prompt counted by the engine's own tokenizer"
    )
    return InvalidRequest(
        f"This model's maximum context length is {window} tokens (model '{route.name}'"
        + (", its largest deployment" if len(deps) > 1 else "")
        + f"). However, this request needs {need}, {how}. Please reduce the length of the prompt"
        + (" or max_tokens." if out else "."),
        param="messages" if "chat" in info.needs else "prompt" if "completions" in info.needs else "input",
        code="context_length_exceeded",
    )


def fits_in_any(groups: list[ModelRoute], info: RequestInfo) -> bool:
    """Does the request fit a deployment of any of these routes? (Loops, not `any(genexpr)`: closing a
    generator early raises GeneratorExit in it, once per request.)"""
    for g in groups:
        for d in eligible(g, info):
            if fits(d, info):
                return True
    return False
