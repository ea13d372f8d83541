"""Engine adapters: one module per engine behind the protocol in `adapters.base`."""
