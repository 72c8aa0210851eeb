"""Models for the fenced-write tests."""
