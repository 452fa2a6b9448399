"""trainyard_placement."""
