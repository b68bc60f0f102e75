"""Benchmarks; each writes its own section of docs/benchmarks.md with --write."""
