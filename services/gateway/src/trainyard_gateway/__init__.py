"""trainyard_gateway."""
