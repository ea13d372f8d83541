"""The request pipeline: the process's shared objects and the swappable per-config part (`runtime`),
config hot reload (`reload`), one generation request's state (`request`), its steps (`pipeline`), the
relay loop of a streamed answer (`stream`) and what a queued stream hears while it waits
(`queue_progress`). Routing decisions live in `routing/`, engine knowledge in `adapters/`.
"""
