"""trainyard_sdk."""
