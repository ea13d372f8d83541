"""Ingress dialects: other APIs' requests and answers translated to and from OpenAI's, purely.

The gateway's service speaks OpenAI chat completions; a dialect here turns a client's request in
another API into an OpenAI chat body, and the OpenAI answer (whole, streamed or an error) back into
that API's shapes. Pure functions and small state machines over bytes and dicts: nothing here does
I/O or knows an engine (the HTTP layer wires a dialect to the service through a translating
`ClientExchange`). Imports only the shared vocabulary (errors, types).

- `anthropic_request`: an Anthropic Messages request -> an OpenAI chat body (and what the answer needs).
- `anthropic_response`: a whole OpenAI chat answer -> an Anthropic message; errors -> Anthropic's envelope.
- `anthropic_stream`: an OpenAI SSE stream -> Anthropic's stream events.
"""
