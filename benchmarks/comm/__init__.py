"""Benchmarks: comm (see benchmarks/harness.py and BENCHMARKS.md)."""
