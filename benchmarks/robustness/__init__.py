"""Benchmarks: robustness (see benchmarks/harness.py and BENCHMARKS.md)."""
