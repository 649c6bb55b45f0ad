"""Passwords of the test users, shared by the fixtures and the tests that log in by hand."""

OWNER_PASSWORD = "owner-pass-123"
OUTSIDER_PASSWORD = "outsider-pass-123"
