"""Admin registrations of the test app (the optimistic admin tests use them)."""
