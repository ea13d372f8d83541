"""Engine adapters: one module per engine behind the protocol in `llm_gateway.adapters.base`."""
