"""Who may call and how much: API keys and their principals (`keys`), the rate-limit store vocabulary
and protocol (`store`), the in-process store (`memory`), the Redis store shared by replicas
(`redis_store`, imported only when configured, so a memory-only gateway never imports redis), and the
limiter that applies a key's limits and budgets (`limiter`).
"""
