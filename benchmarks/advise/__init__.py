"""Benchmarks: advise (see benchmarks/harness.py and BENCHMARKS.md)."""
