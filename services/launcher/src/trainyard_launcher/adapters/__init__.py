"""The launcher's I/O: the local process backend and its MongoDB state."""
