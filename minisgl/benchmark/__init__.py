"""Benchmarks: scripts that time a part of the engine and print figures. Run them as modules
(``python -m minisgl.benchmark.<name> --help``). Mirrors upstream ``benchmark/`` and
``minisgl.benchmark``."""
