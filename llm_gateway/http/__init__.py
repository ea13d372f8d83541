"""The HTTP surface: ASGI app, handlers, the hardened server protocol."""
