#!/usr/bin/env bash
# Build the test cluster's binaries once into .cache/bin and reuse them while they are
# newer than their sources; prints the directory holding them.
#   trainyard-kube  etcd + kube-apiserver + kube-controller-manager + kube-scheduler +
#                   kubectl, from tools/kube (Kubernetes v1.34.4, DESIGN §7)
#   kwok            KWOK v0.8.0 (nodes and pod lifecycles without a kubelet)
#   helm            Helm v3, to render deploy/helm in the tests
# The first build compiles Kubernetes: 15-30 minutes on 2 cores. Go's build and module
# caches are kept by Go itself, so a rebuild after a change is a relink.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$root/.cache/bin"
mkdir -p "$bin"

KUBE_VERSION=v1.34.4
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.19.0

newer_than() {  # is any of the sources newer than $1 (or $1 missing)?
  local out="$1"; shift
  [[ ! -x "$out" ]] && return 0
  for src in "$@"; do [[ "$src" -nt "$out" ]] && return 0; done
  return 1
}

if newer_than "$bin/trainyard-kube" "$here/main.go" "$here/urls.go" "$here/go.mod" "$here/go.sum" "$here/build.sh"; then
  tmp="$bin/trainyard-kube.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=34"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitMinor=34"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$tmp" .) >&2
  mv -f "$tmp" "$bin/trainyard-kube"
fi

# Tools built as their authors publish them, at a pinned version (a stamp names it).
install_tool() {  # name module version
  local name="$1" module="$2" version="$3"
  if [[ -x "$bin/$name" && "$(cat "$bin/.$name.version" 2>/dev/null)" == "$version" ]]; then
    return
  fi
  GOBIN="$bin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$module@$version" >&2
  echo "$version" > "$bin/.$name.version"
}
install_tool kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
install_tool helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"

echo "$bin"
