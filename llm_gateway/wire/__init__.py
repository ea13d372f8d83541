"""Client-API wire formats shared by the engines' adapters and the client dialects, pure: Server-Sent
Events read as bytes (`sse_bytes`: data lines, usage, output markers, text sizes) and the gateway's own
OpenAI chat stream read event by event (`chat_events`). Nothing here does I/O or knows an engine or a
route; it imports only the shared vocabulary (errors, types).
"""
