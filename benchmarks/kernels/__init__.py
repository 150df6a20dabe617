"""Benchmarks: kernels (see benchmarks/harness.py and BENCHMARKS.md)."""
