"""Benchmarks, run as modules: ``python -m bench.ingest`` and the like (``make bench``)."""
