"""Benchmarks of pagescribe on this machine: ``python -m bench.run [--quick]`` (see docs/benchmarks.md)."""
