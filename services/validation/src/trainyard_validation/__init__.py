"""trainyard_validation."""
