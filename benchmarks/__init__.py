"""Benchmark scripts (run from a checkout; not part of the installed package)."""
