"""/metrics bodies of the Python engines, computed from the live slot pool and counters.

vLLM (captured 0.32.0 names, multiprocess-style: sorted labels ``engine``/``model_name``,
``_created`` as separate gauges), SGLang (collector.py names, label ``model_name``) and
LMDeploy (metrics/loggers.py names, labels ``model_name``, ``engine`` in that order,
default registry). ``report_waiting`` / ``report_kv_usage`` override what is reported.
"""

from __future__ import annotations

from llm_gateway_emulators.prom_text import PyProm
from llm_gateway_emulators.scheduler import SlotPool
from llm_gateway_emulators.stats import Histogram, Stats

Hists = dict[str, Histogram]

VLLM_WAIT_DOC = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). "
    "Sum of all reasons equals vllm:num_requests_waiting."
)


def _reasons(s: Stats, names: tuple[str, ...]) -> list[tuple[list[tuple[str, str]], float]]:
    return [([("finished_reason", r)], s.finished_reasons.get(r, 0)) for r in names]


def vllm(model: str, created: float, pool: SlotPool, s: Stats, h: Hists) -> bytes:
    p = PyProm([("engine", "0"), ("model_name", model)], created, sort_labels=True)
    waiting = pool.reported_waiting()
    p.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", pool.running)
    p.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
    p.gauge_multi(
        "vllm:num_requests_waiting_by_reason",
        VLLM_WAIT_DOC,
        [([("reason", "capacity")], waiting), ([("reason", "deferred")], 0)],
    )
    p.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", pool.kv_usage())
    queries = "Prefix cache queries, in terms of number of queried tokens."
    p.counter("vllm:prefix_cache_queries", queries, [([], s.prompt_tokens_total)])
    p.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", [([], 0)])
    p.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", [([], 0)])
    p.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [([], s.prompt_tokens_total)])
    p.counter("vllm:generation_tokens", "Number of generation tokens processed.", [([], s.tokens_generated_total)])
    reasons = ("stop", "length", "abort", "error", "repetition")
    p.counter("vllm:request_success", "Count of successfully processed requests.", _reasons(s, reasons))
    p.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", h["ttft"])
    tpot_doc = "Histogram of time_per_output_token_seconds per request."
    p.histogram("vllm:request_time_per_output_token_seconds", tpot_doc, h["tpot"])
    p.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", h["e2e"])
    queue_doc = "Histogram of time spent in WAITING phase for request."
    p.histogram("vllm:request_queue_time_seconds", queue_doc, h["queue"])
    return p.render()


def sglang(model: str, created: float, pool: SlotPool, s: Stats, h: Hists) -> bytes:
    p = PyProm([("model_name", model)], created, sort_labels=True)
    p.gauge("sglang:num_running_reqs", "The number of running requests.", pool.running)
    p.gauge("sglang:num_used_tokens", "The number of used tokens.", pool.tokens_in_use())
    p.gauge("sglang:token_usage", "The token usage.", pool.kv_usage())
    p.gauge("sglang:gen_throughput", "The generation throughput (token/s).", 0.0)
    p.gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", pool.reported_waiting())
    p.gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", 0)
    p.gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0)
    p.counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [([], s.prompt_tokens_total)])
    p.counter("sglang:generation_tokens", "Number of generation tokens processed.", [([], s.tokens_generated_total)])
    p.counter("sglang:num_requests", "The number of processed requests.", [([], s.completed)])
    p.histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", h["ttft"])
    p.histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", h["e2e"])
    p.histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", h["queue"])
    return p.render()


def lmdeploy(model: str, created: float, pool: SlotPool, s: Stats, h: Hists) -> bytes:
    p = PyProm([("model_name", model), ("engine", "0")], created, sort_labels=False, multiprocess=False)
    p.gauge("lmdeploy:num_requests_succeeded", "Number of current succeeded requests.", s.completed)
    p.gauge("lmdeploy:num_requests_failed", "Number of current failed requests.", s.faulted)
    routed = pool.running + pool.waiting
    p.gauge("lmdeploy:num_api_requests_routed", "Number of requests routed to request handles.", routed)
    p.gauge("lmdeploy:num_api_requests_waiting", "Number of requests waiting for free request handles.", 0)
    p.gauge("lmdeploy:num_requests_running", "Number of requests in model execution batches.", pool.running)
    p.gauge("lmdeploy:num_requests_waiting", "Number of requests waiting to be processed.", pool.reported_waiting())
    p.gauge("lmdeploy:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", pool.kv_usage())
    hit_doc = "Prefix-cache hit rate. 1 means 100 percent of queried prefix tokens hit."
    p.gauge("lmdeploy:prefix_cache_hit_rate", hit_doc, 0.0)
    p.counter("lmdeploy:prompt_tokens", "Number of prefill tokens processed.", [([], s.prompt_tokens_total)])
    gen_doc = "Number of generation tokens processed."
    p.counter("lmdeploy:generation_tokens", gen_doc, [([], s.tokens_generated_total)])
    ok_doc = "Count of successfully processed requests."
    p.counter("lmdeploy:request_success", ok_doc, _reasons(s, ("stop", "length", "abort")))
    p.histogram("lmdeploy:time_to_first_token_seconds", "Histogram of time to first token in seconds.", h["ttft"])
    p.histogram("lmdeploy:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", h["e2e"])
    queue_doc = "Histogram of time spent in WAITING phase for request."
    p.histogram("lmdeploy:request_queue_time_seconds", queue_doc, h["queue"])
    return p.render()
