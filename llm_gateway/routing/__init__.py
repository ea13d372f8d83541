"""Routing: the table (backends, models, deployments) and the decisions over it, from reading what a
request needs (`request_info`) to the attempt on one deployment.

- `table`: backends, models and deployments built from the config; `gauges`: its state for /metrics;
- `request_info`: an OpenAI body read for what routing needs; `candidates`: which deployments can serve
  it and whether it fits their context windows; `prompt_count`: exact counts where a fit is ambiguous,
  through `backend_calls`;
- `selection` (pure: which deployment, by format, capabilities, load and affinity), `admission` (each
  deployment's bounded fair queue), `breaker` (the circuit breaker);
- `dispatch`: retries and failover over them, each try an `attempt` (the slot it holds and its one report
  to the breaker); `prober`: the health and load probes that feed them.
"""
