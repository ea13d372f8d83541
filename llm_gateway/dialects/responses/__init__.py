"""OpenAI's Responses API on the gateway: the request and its input items as an OpenAI chat body
(`request`, `items`), the Response object (`response`), the typed stream events (`stream`), the
exchange and handlers with stored responses (`exchange`) and the OpenAPI description (`openapi*`).
"""
