"""Upstream HTTP clients behind one small protocol."""
