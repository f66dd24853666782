"""Helpers shared by the tests, one module per role; conftest.py re-exports them."""
