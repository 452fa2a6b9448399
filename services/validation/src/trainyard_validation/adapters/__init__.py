"""The validation service's I/O: the job-name registry."""
