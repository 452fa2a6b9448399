"""Harnesses shared by the test tiers (one copy each, imported from here)."""
