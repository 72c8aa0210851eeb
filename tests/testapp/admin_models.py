"""Models for the optimistic admin tests."""
