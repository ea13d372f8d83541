"""The client APIs the gateway speaks, one folder or module each, each owning its request, answer,
stream, exchange and OpenAPI description:

- `openai`: OpenAI's chat completions, completions, embeddings and models (the service's own dialect);
- `anthropic/`: Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), translated to
  and from OpenAI chat;
- `responses/`: OpenAI's Responses API (`/v1/responses` and its stored responses), likewise;
- `ops`: the operator's routes (`/healthz`, `/readyz`, `/metrics`, `/openapi.json`);
- `common`: what every handler shares (the handler context, authentication, reading a JSON body);
  `field_checks` and `error_names`: field checks and error renames of the translated dialects;
- `openapi`: the gateway's OpenAPI document, assembled from the dialects' descriptions;
- `routes`: the route table the HTTP server dispatches by.

Handlers sit above the HTTP server (`http/`) and the service: they read a request through the server's
`Call`, hand it to the service through a `ClientExchange`, and never route or talk to an engine.
"""
