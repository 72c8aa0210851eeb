"""Side-by-side benchmarks of django-distlock against its peers and the floor.

Run with ``python -m benchmarks`` (see ``benchmarks/README.md``).
"""
