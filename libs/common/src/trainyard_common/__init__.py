"""trainyard_common."""
