#!/usr/bin/env bash
# System packages some job kinds need on a local node: Open MPI (mpirun for MPI jobs,
# mpicc for building mpi4py). Idempotent, and never fails `make setup`: without root or
# apt-get it says what is missing, and the tests that need it skip with that reason.
set -u

say() { echo "setup-system: $*" >&2; }

if command -v mpirun >/dev/null 2>&1 && command -v mpicc >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "Open MPI is not installed and this is not root: MPI jobs cannot run here (apt-get install openmpi-bin libopenmpi-dev)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "Open MPI is not installed and there is no apt-get: install Open MPI by hand for MPI jobs"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# An empty package list (a fresh container) knows no openmpi-bin: update it first.
if ! apt-cache show openmpi-bin >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed"
fi
if apt-get install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev >/dev/null 2>&1; then
    say "installed Open MPI ($(mpirun --version 2>/dev/null | head -n 1))"
else
    say "apt-get install openmpi-bin libopenmpi-dev failed: MPI jobs cannot run here"
fi
exit 0
