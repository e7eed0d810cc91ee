"""Benchmarks of pagescribe on this machine: ``python -m bench.run [--quick | --smoke]`` (see docs/benchmarks.md)."""
