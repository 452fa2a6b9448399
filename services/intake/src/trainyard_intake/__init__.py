"""trainyard_intake."""
