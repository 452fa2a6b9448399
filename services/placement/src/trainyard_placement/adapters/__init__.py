"""Placement's adapters: the only code here that does I/O."""
