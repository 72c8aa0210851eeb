"""Models the ``orm`` benchmarks save and sell (benchmark-only; no migrations).

``benchmarks.orm.setup()`` creates their tables with the schema editor in the
benchmark database. Not part of the package and never used by the tests.
"""
