"""Benchmarks: memory (see benchmarks/harness.py and BENCHMARKS.md)."""
