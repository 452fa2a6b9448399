"""trainyard_launcher."""
