"""Helpers shared by the test suite (launchers for real engines, ...)."""
