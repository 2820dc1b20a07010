#!/usr/bin/env bash
# Builds the hardware check bundle: one folder that checks gputopo on a
# machine with only an NVIDIA GPU and its driver (no Go, no network, no
# cluster). Copy the folder there and run its run.sh (see docs/hardware.md).
#
#   hack/gpu-check-bundle.sh [OUTDIR]        # default _output/gpu-check
#
# It holds:
#   bin/gputopo-kubelet-plugin  cgo (NVML is loaded with dlopen, which a static
#                               glibc binary cannot do safely): needs glibc
#                               >= the version it was built against (see MANIFEST)
#   bin/gpucheck                static: compares, validates the CDI spec, writes
#                               the container's runtime config
#   bin/nvidia-cdi-hook         static: the NVIDIA Container Toolkit's hook, from
#                               the toolkit version in go.mod
#   bin/runc                    Debian's runc, copied from its package (needs the
#                               host's libseccomp.so.2; a runc on the host's PATH
#                               is used when the bundled one cannot start)
#   rootfs/                     the container's root: static busybox and this
#                               machine's glibc, which nvidia-smi (injected from the
#                               host by the CDI spec) runs on
#   run.sh, MANIFEST
# Needs Go, gcc with static glibc (libc6-dev), and the runc and busybox-static
# Debian packages (installed, or fetched with apt-get download).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-_output/gpu-check}"
GO="${GO:-go}"
arch=$("$GO" env GOARCH)
case "$arch" in
  amd64) triplet=x86_64-linux-gnu loader=lib64/ld-linux-x86-64.so.2 ;;
  arm64) triplet=aarch64-linux-gnu loader=lib/ld-linux-aarch64.so.1 ;;
  *) echo "gpu-check-bundle: GOARCH $arch is not supported (amd64, arm64)" >&2; exit 1 ;;
esac
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/rootfs"

echo "== build"
"$GO" build -tags=grpcnotrace -ldflags='-s -w' -o "$OUT/bin/" ./cmd/gputopo-kubelet-plugin
CGO_ENABLED=0 "$GO" build -ldflags='-s -w' -o "$OUT/bin/" ./hack/gpucheck
GO="$GO" hack/build-cdi-hook.sh "$OUT/bin"

# deb_file PACKAGE PATH: PATH from the installed Debian package, else from
# the package downloaded with apt-get (no root needed); nothing, with a
# warning, when neither works.
deb_file() {
  local pkg=$1 path=$2
  if [ -f "$path" ] && dpkg -S "$path" 2>/dev/null | grep -q "^$pkg"; then
    echo "$path"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  if (cd "$tmp" && apt-get download "$pkg" >/dev/null 2>&1) && dpkg-deb -x "$tmp"/"$pkg"_*.deb "$tmp/x"; then
    echo "$tmp/x$path"
    return
  fi
  echo "gpu-check-bundle: WARNING: no $path from the Debian package $pkg (apt-get install $pkg, or apt-get download must work); $3" >&2
}
echo "== runc and busybox from their Debian packages"
runc=$(deb_file runc /usr/sbin/runc "the bundle starts its container with a runc on the GPU machine's PATH")
[ -z "$runc" ] || cp "$runc" "$OUT/bin/runc"
busybox=$(deb_file busybox-static /bin/busybox "the container has no shell (nvidia-smi runs without one)")

echo "== container root file system"
mkdir -p "$OUT/rootfs/bin" "$OUT/rootfs/lib/$triplet" "$OUT/rootfs/$(dirname "$loader")" \
  "$OUT/rootfs/etc" "$OUT/rootfs/proc" "$OUT/rootfs/sys" "$OUT/rootfs/dev" "$OUT/rootfs/tmp"
if [ -n "$busybox" ]; then
  cp "$busybox" "$OUT/rootfs/bin/busybox"
  for tool in sh ls cat; do ln -s busybox "$OUT/rootfs/bin/$tool"; done
fi
# What nvidia-smi and the driver's libraries link against.
for lib in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libgcc_s.so.1; do
  src=""
  for dir in "/lib/$triplet" "/usr/lib/$triplet"; do
    if [ -e "$dir/$lib" ]; then src="$dir/$lib"; break; fi
  done
  [ -n "$src" ] || { echo "gpu-check-bundle: /lib/$triplet/$lib not found" >&2; exit 1; }
  cp -L "$src" "$OUT/rootfs/lib/$triplet/$lib"
done
cp -L "/$loader" "$OUT/rootfs/$loader"
echo "root:x:0:0:root:/:/bin/sh" >"$OUT/rootfs/etc/passwd"
# As Debian and Ubuntu images have it: nvidia-cdi-hook's update-ldcache adds
# the driver's library folders as a drop-in in ld.so.conf.d and leaves an
# existing ld.so.conf alone, so without the include a driver outside the
# system folders (/usr/local/nvidia/lib64) is not in the container's cache.
mkdir -p "$OUT/rootfs/etc/ld.so.conf.d"
echo "include /etc/ld.so.conf.d/*.conf" >"$OUT/rootfs/etc/ld.so.conf"
echo "/lib/$triplet" >"$OUT/rootfs/etc/ld.so.conf.d/$triplet.conf"

cp hack/gpu-check-run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh"
# sed, not head: with pipefail, a writer cut off by head fails the script.
glibc=$(ldd --version | sed -n '1s/.* \([0-9]*\.[0-9]*\)$/\1/p')
{
  echo "gputopo $(git describe --tags --always --dirty 2>/dev/null || echo unknown) for linux/$arch"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), glibc $glibc"
  echo "plugin needs glibc: $(objdump -T "$OUT/bin/gputopo-kubelet-plugin" 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | sed -n '$p' || echo unknown)"
  echo "nvidia-cdi-hook: $("$OUT/bin/nvidia-cdi-hook" --version | sed -n 1p)"
  echo "runc: $("$OUT/bin/runc" --version 2>/dev/null | sed -n 1p || echo 'none bundled, or it does not start here')"
} >"$OUT/MANIFEST"
cat "$OUT/MANIFEST"
echo "gpu-check-bundle: $OUT ($(du -sh "$OUT" | cut -f1)); copy it to a GPU machine and run: sudo $OUT/run.sh"
