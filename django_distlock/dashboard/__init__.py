"""The admin pages of held locks: listing across aliases, detail, force release."""
