"""llm-gateway: one OpenAI-compatible endpoint in front of local LLM engines."""

__version__ = "0.1.0"
