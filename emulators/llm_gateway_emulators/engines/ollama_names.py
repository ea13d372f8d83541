"""Ollama's model identity as the emulator reports it: full names (``tiny`` -> ``tiny:latest``), blob
digests and the ``details`` block of /api/tags, /api/ps and /api/show. Its own module because both the
engine (ollama.py) and its native routes (ollama_native.py) name models the same way.
"""

from __future__ import annotations

import hashlib

DIGEST = "df23d3d75cc3d6cc62dc5b936ff8e1862e93a0b3471d8ebc1bcd5fbc55b0d914"
DETAILS = {
    "parent_model": "",
    "format": "gguf",
    "family": "llama",
    "families": ["llama"],
    "parameter_size": "138K",
    "quantization_level": "unknown",
}


def full_name(name: str) -> str:
    """A model name with its tag (``tiny`` -> ``tiny:latest``)."""
    return name if ":" in name else f"{name}:latest"


def digest_of(name: str, primary: str) -> str:
    """The blob digest: the captured one for the primary model, a stable made-up one for the others."""
    return DIGEST if name == primary else hashlib.sha256(name.encode()).hexdigest()
