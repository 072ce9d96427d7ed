"""Benchmarks: python bench/<name>.py (see each file\x27s docstring)."""
