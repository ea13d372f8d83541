"""The strategy of a model whose config names none (settings/gateway.py, ModelConfig._default_strategy).

cache_aware for a model with more than one deployment (README's agent runs: it recomputed what the oracle did,
least_load 1.25-1.6x that), least_load for one (nothing to choose; no prefix record kept); a named strategy
always wins. Through HTTP: a two-deployment model without `strategy:` keeps each conversation on one engine,
where the same model with `strategy: least_load` moves them (equal loads take turns).
"""

from __future__ import annotations

from typing import Any

import pytest

from llm_gateway.settings import ModelConfig
from tests.conftest import gateway_client, make_config
from tests.unit.test_cache_aware import NAMES, conversation, engines

ONE = {"backend": "a", "model": "m", "format": "gguf"}
TWO = [ONE, {**ONE, "backend": "b"}]


def model(deployments: list[dict[str, str]], **named: str) -> ModelConfig:
    return ModelConfig.model_validate({"name": "x", "deployments": deployments, **named})


def test_two_deployments_default_to_cache_aware_and_one_to_least_load() -> None:
    assert model(TWO).strategy == "cache_aware"
    assert model([*TWO, {**ONE, "backend": "c"}]).strategy == "cache_aware"
    assert model([ONE]).strategy == "least_load"


@pytest.mark.parametrize("strategy", ["least_load", "round_robin", "prefix_affinity", "cache_aware"])
def test_a_named_strategy_always_wins(strategy: str) -> None:
    assert model(TWO, strategy=strategy).strategy == strategy
    assert model([ONE], strategy=strategy).strategy == strategy


def config(strategy: str | None) -> Any:
    backends = "".join(f'  - {{name: {n}, engine: vllm, url: "http://{n}.test"}}\n' for n in NAMES)
    deps = "".join(f"      - {{backend: {n}, model: upstream-model, format: safetensors}}\n" for n in NAMES)
    named = f"    strategy: {strategy}\n" if strategy else ""
    return make_config(
        f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
{backends}models:
  - name: agent
{named}    deployments:
{deps}  - name: solo
    deployments: [{{backend: engine-a, model: upstream-model, format: safetensors}}]
"""
    )


def test_the_loaded_config_has_the_default_per_model() -> None:
    cfg = config(None)
    assert {m.name: m.strategy for m in cfg.models} == {"agent": "cache_aware", "solo": "least_load"}
    assert config("least_load").models[0].strategy == "least_load"


async def served(strategy: str | None, sessions: int = 3, turns: int = 3) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {s: [] for s in range(sessions)}
    async with gateway_client(config(strategy), upstream=engines()) as (client, _):
        for t in range(1, turns + 1):
            for s in range(sessions):
                r = await client.post("/v1/chat/completions", json={"model": "agent", "messages": conversation(s, t)})
                assert r.status_code == 200, r.text
                out[s].append(r.headers["x-gateway-backend"])
        solo = await client.post("/v1/chat/completions", json={"model": "solo", "messages": conversation(0, 1)})
        assert solo.status_code == 200 and solo.headers["x-gateway-backend"] == "engine-a"
    return out


async def test_by_default_a_conversation_stays_on_one_engine_and_least_load_named_moves_it() -> None:
    default = await served(None)
    assert all(len(set(turns)) == 1 for turns in default.values()), default
    assert len({turns[0] for turns in default.values()}) == 2, default  # and new conversations use both engines
    least = await served("least_load")  # 3 conversations: equal loads take turns, so each turn moves
    assert any(len(set(turns)) > 1 for turns in least.values()), least


def test_cache_aware_leaves_a_deployment_whose_model_would_load_cold() -> None:
    # the conversation was served on a, whose model has since been unloaded (b has it loaded): a's engine holds
    # none of it, and a cold load costs more than a recompute, so it goes to b; all cold, or prefer_resident off:
    # the affinity as before
    from llm_gateway.routing.selection import CandidateView, order

    def views(a_resident: bool | None, b_resident: bool | None) -> list[CandidateView]:
        a = CandidateView("a/m", 0, 2, False, None, 0, resident=a_resident, session_at=990.0, match=0.9)
        return [a, CandidateView("b/m", 0, 2, False, None, 0, resident=b_resident)]

    def first(cands: list[CandidateView], prefer_resident: bool = True, spread_new: bool = True) -> str:
        i = order("cache_aware", cands, now=1000.0, stale_s=15.0, affinity_key="k", prefer_resident=prefer_resident,
                  spread_new=spread_new)  # fmt: skip
        return cands[i[0]].key

    assert first(views(False, True)) == "b/m"
    assert first(views(False, True), spread_new=False) == "b/m"  # under hash placement too
    assert first(views(True, True)) == first(views(None, None)) == "a/m"
    assert first(views(False, False)) == "a/m"
    assert first(views(False, True), prefer_resident=False) == "a/m"
