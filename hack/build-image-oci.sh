#!/usr/bin/env bash
# Builds the gputopo container image without Docker or a registry, as an
# OCI image layout tarball (`ctr images import`, `docker load`, `skopeo copy
# oci-archive:...`). The binaries, entrypoint and user of
# deployments/container/Dockerfile's image, on a smaller base than its
# distroless/base, in two layers (hack/ociimage, go-containerregistry):
#   1. the base: Debian's libc6 package, whole (the C library and dynamic
#      loader that the cgo binaries need; NVML is loaded with dlopen), at the
#      version installed on this machine, which is the glibc `make build`
#      linked them against; /etc/passwd and /etc/group with root and
#      nonroot (65532); /tmp.
#   2. /usr/bin: gputopo-kubelet-plugin, gputopo-controller, gputopo and
#      nvidia-cdi-hook from BIN (`make build`).
# hack/ociimage refuses to write an image in which a binary would not find
# its interpreter or a library it needs.
#
#   hack/build-image-oci.sh                       # ghcr.io/gputopo/gputopo:<chart appVersion>
#   IMAGE=registry.example.com/gputopo TAG=v0.1.0 OUT=/tmp/g.tar hack/build-image-oci.sh
#
# Needs Go, and apt-get and dpkg-deb (Debian or Ubuntu) for the libc6
# package, which is cached in ~/.cache/gputopo/image-base/. Prints the
# tarball's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-ghcr.io/gputopo/gputopo}"
TAG="${TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deployments/helm/gputopo/Chart.yaml)}"
BIN="${BIN:-$PWD/bin}"
OUT="${OUT:-$PWD/_output/image/gputopo-image.oci.tar}"
VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo "$TAG")}"
CACHE="${GPUTOPO_IMAGE_BASE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gputopo/image-base}"
binaries=(gputopo-kubelet-plugin gputopo-controller gputopo nvidia-cdi-hook)

for b in "${binaries[@]}"; do
  [ -x "$BIN/$b" ] || { echo "build-image-oci: $BIN/$b is missing; run 'make build' first (or set BIN)" >&2; exit 1; }
done
for t in apt-get dpkg-deb dpkg-query; do
  command -v "$t" >/dev/null || { echo "build-image-oci: $t not found: the base layer is made from Debian's libc6 package (Debian or Ubuntu needed)" >&2; exit 1; }
done
case "$(go env GOARCH)" in
amd64 | arm64) arch=$(go env GOARCH) ;;
*) echo "build-image-oci: GOARCH $(go env GOARCH) is not supported (amd64, arm64)" >&2; exit 1 ;;
esac

# The libc6 the binaries were linked against here: the same version, so
# every glibc symbol version they need is there.
libc_version=$(dpkg-query -W -f='${Version}' "libc6:$(dpkg --print-architecture)")
mkdir -p "$CACHE"
deb=$(ls "$CACHE"/libc6_*"$(dpkg --print-architecture)".deb 2>/dev/null | grep -F "_${libc_version/:/%3a}_" || true)
if [ -z "$deb" ]; then
  echo "build-image-oci: apt-get download libc6=$libc_version into $CACHE" >&2
  (cd "$CACHE" && apt-get download "libc6=$libc_version" >&2) || {
    echo "build-image-oci: could not download libc6 $libc_version (apt-get update, or a reachable Debian mirror, may be needed)" >&2
    exit 1
  }
  deb=$(ls "$CACHE"/libc6_*"$(dpkg --print-architecture)".deb | grep -F "_${libc_version/:/%3a}_")
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gputopo-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
base="$work/base" layer="$work/bin"
mkdir -p "$base/etc" "$base/tmp" "$layer/usr/bin"
dpkg-deb -x "$deb" "$base"
chmod 1777 "$base/tmp"
cat >"$base/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
cat >"$base/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
for b in "${binaries[@]}"; do cp "$BIN/$b" "$layer/usr/bin/$b"; done

mkdir -p "$(dirname "$OUT")"
go -C hack/ociimage build -o "$work/ociimage" .
"$work/ociimage" --ref "$IMAGE:$TAG" --out "$OUT" --arch "$arch" \
  --layer "$base" --layer "$layer" \
  --entrypoint /usr/bin/gputopo --user 65532:65532 \
  --label org.opencontainers.image.title=gputopo \
  --label "org.opencontainers.image.description=Topology-aware Kubernetes DRA driver for GPUs (gpu.gputopo.dev)" \
  --label org.opencontainers.image.source=https://github.com/gputopo/gputopo \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "dev.gputopo.image.base=debian libc6 $libc_version" >&2
echo "$OUT"
