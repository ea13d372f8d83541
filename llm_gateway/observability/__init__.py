"""Metrics and logs: the gateway's own registry, the access log, log setup."""
