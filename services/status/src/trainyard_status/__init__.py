"""trainyard_status."""
