"""Models for the optimistic-locking tests."""
