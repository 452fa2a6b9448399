"""The launcher's I/O: its task backends (local processes, Kubernetes pods) and its state
in the store (SQLite by default, MongoDB by URL)."""
