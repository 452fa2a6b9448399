#!/usr/bin/env bash
# Build tools/ferretdb once into .cache/bin/trainyard-ferretdb and reuse it
# while it is newer than its sources; prints the binary's absolute path.
# The first build downloads and compiles many modules (pure-Go SQLite is
# large), so skipping rebuilds matters for test start-up time.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/.cache/bin/trainyard-ferretdb"

needs_build=0
if [[ ! -x "$out" ]]; then
  needs_build=1
else
  for src in "$here/main.go" "$here/go.mod" "$here/go.sum"; do
    if [[ "$src" -nt "$out" ]]; then
      needs_build=1
      break
    fi
  done
fi

if [[ "$needs_build" == 1 ]]; then
  mkdir -p "$(dirname "$out")"
  # Build to a temp name and rename, so a concurrent caller never execs a
  # half-written binary.
  tmp="$out.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  # Output goes to stderr: stdout is reserved for the path callers parse.
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -o "$tmp" .) >&2
  mv -f "$tmp" "$out"
fi

echo "$out"
