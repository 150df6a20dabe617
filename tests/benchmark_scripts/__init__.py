"""Tests of benchmarks/: every script still runs (its --smoke setting)."""
