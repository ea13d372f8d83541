"""Anthropic's Messages API on the gateway: the request as an OpenAI chat body (`request`, `options`),
the answer and errors in Anthropic's shapes (`response`), the stream as Anthropic's events (`stream`),
the exchange and handlers (`exchange`) and the OpenAPI description (`openapi`).
"""
