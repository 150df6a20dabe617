"""gnnpar's benchmark scripts, by topic; benchmarks/harness.py is what they share (BENCHMARKS.md)."""
