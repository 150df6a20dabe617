"""Benchmarks: frameworks (see benchmarks/harness.py and BENCHMARKS.md)."""
