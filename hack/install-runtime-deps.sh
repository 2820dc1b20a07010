#!/usr/bin/env bash
# What the local cluster's containerd nodes need from the host, from
# Debian's packages: runc (containerd's runtime), busybox-static (the local
# images) and iproute2 (the pods' network namespaces). containerd itself is
# built from the Go module proxy by `localcluster build`. Installs only what
# is missing; needs root.
set -euo pipefail
missing=()
command -v runc >/dev/null || missing+=(runc)
# Debian's busybox (dynamically linked) also installs /bin/busybox;
# busybox-static replaces it with the static one the images need.
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null && command -v unshare >/dev/null && command -v flock >/dev/null || missing+=(util-linux)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-runtime-deps: missing ${missing[*]}; run as root, or apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "install-runtime-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
