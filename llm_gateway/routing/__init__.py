"""Routing state and the pure decisions over it: the routing table (backends, models, deployments),
selection (which deployment, by format, capabilities, load and affinity), admission (each
deployment's bounded queue) and the circuit breaker. No I/O and no web framework here: the retry
and failover loop that uses them is `llm_gateway.dispatch`, the probes that feed them `llm_gateway.prober`.
"""
