#!/usr/bin/env bash
# Build tools/paper-draws into .cache/bin/paper-draws while it is older than its sources;
# prints the binary's absolute path. Standard library only: nothing to download.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/.cache/bin/paper-draws"

if [[ ! -x "$out" || "$here/main.go" -nt "$out" || "$here/go.mod" -nt "$out" ]]; then
  mkdir -p "$(dirname "$out")"
  tmp="$out.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  # Output goes to stderr: stdout is reserved for the path callers parse.
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -o "$tmp" .) >&2
  mv -f "$tmp" "$out"
fi

echo "$out"
