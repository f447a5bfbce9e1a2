"""Benchmarks (chapter 22): the offline throughput workload, decode step time, and their
helpers. Run them as modules: ``python -m minisgl.benchmark.offline --help``,
``python -m minisgl.benchmark.decode_step --help``. Mirrors upstream ``benchmark/`` and
``minisgl.benchmark``."""
