"""Rate limits per key: the store vocabulary and protocol (store.py), the in-process store
(memory.py), the Redis store shared by replicas (redis_store.py, imported only when configured, so
a memory-only gateway never imports redis), and the limiter that applies a key's limits (limiter.py).
"""
