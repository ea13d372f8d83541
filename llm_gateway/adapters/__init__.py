"""Engine adapters: one module per engine behind `llm_gateway.adapters.base`; all engine knowledge lives here."""
