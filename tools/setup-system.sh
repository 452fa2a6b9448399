#!/usr/bin/env bash
# System packages from Debian: Open MPI (mpirun for MPI jobs on a local node, mpicc for
# building mpi4py), Prometheus (`make metrics`; the tests check the alert rules and the
# dashboard's queries with it), Chromium (the console's browser tests, via Playwright) and
# python-is-python3 (a `python` for tasks, as Kubeflow's SDK runs it). Idempotent, and never fails `make setup`: without root or
# apt-get it says what is missing, and the tests that need a package skip with that reason.
set -u

say() { echo "setup-system: $*" >&2; }

missing=()
if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    missing+=(openmpi-bin libopenmpi-dev)
fi
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    missing+=(prometheus)
fi
if ! command -v chromium >/dev/null 2>&1; then
    missing+=(chromium)
fi
# `python` on the nodes' own PATH (tasks run as other users, without this user's
# pyenv): the Kubeflow SDK's train_func jobs run `python`, as its images have it.
if [ ! -x /usr/bin/python ] && [ ! -x /usr/local/bin/python ]; then
    missing+=(python-is-python3)
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "not root: install by hand with apt-get install ${missing[*]} (MPI jobs, make metrics and the console's tests need them)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get: install ${missing[*]} by hand (MPI jobs, make metrics and the console's tests need them)"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# An empty package list (a fresh container) knows none of them: update it first.
if ! apt-cache show "${missing[0]}" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || say "apt-get update failed"
fi
for package in "${missing[@]}"; do
    if apt-get install -y -qq --no-install-recommends "$package" >/dev/null 2>&1; then
        say "installed $package"
    else
        say "apt-get install $package failed: what needs it cannot run here"
    fi
done
# Debian's package starts a system Prometheus where an init system runs: Trainyard runs
# its own (make metrics), so stop that one rather than hold port 9090.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
exit 0
