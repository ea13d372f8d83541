"""End-to-end tests share the real-engine fixtures of tests/conftest.py."""
