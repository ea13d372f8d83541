"""Client-API wire formats shared by the engines' adapters and the client dialects, pure: Server-Sent
Events read as bytes (`sse_bytes`: data lines, the end marker, usage, output markers, text sizes, the one
envelope learner), the gateway's OpenAI chat stream as events and the `ChatTranslation` a relay drives for
a client of another API (`chat_events`), and Anthropic's facts shared by its translation and its native
pass-through (`anthropic`: error types and envelope, `msg_` ids, usage, frames). Nothing here does I/O or
knows an engine or a route; it imports only the shared vocabulary (errors, types).
"""
