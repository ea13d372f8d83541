"""`python -m llm_gateway ...` is the `llm-gateway` command."""

from llm_gateway.cli import main

raise SystemExit(main())
