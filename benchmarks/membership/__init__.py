"""Membership benchmark: see __main__.py."""
