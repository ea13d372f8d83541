"""Wire formats and request inspection; no I/O."""
