"""trainyard_stack."""
