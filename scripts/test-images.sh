#!/usr/bin/env bash
# Builds the container images the tests run (docs/containers.md), offline but for Debian's
# package mirror: mmdebstrap makes root filesystem tarballs, `podman import` puts the small one in
# podman's store as a reference. Kept in $GPUFLEET_TEST_IMAGES between runs; safe to rerun (it
# builds only what is missing). Needs root.
#   base.tar   Debian 12 minbase (~170 MB)
#   torch.tar  minbase + python3-torch, for DDP in containers (~1.3 GB, ~2 minutes to build)
set -euo pipefail
dir=${GPUFLEET_TEST_IMAGES:-/var/cache/gpufleet/test-images}
mirror=${GPUFLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$dir"

build() {  # name, extra packages
  local name=$1 include=$2
  [[ -f "$dir/$name.tar" && -s "$dir/$name.tar" ]] && return 0
  echo "test-images: building $dir/$name.tar (mmdebstrap bookworm minbase${include:+ + $include})"
  # --format: the .partial name would otherwise make mmdebstrap write a directory.
  local args=(--variant=minbase --mode=root --format=tar --quiet)
  [[ -n "$include" ]] && args+=(--include="$include")
  # A build cut off leaves its partial file; --one-file-system keeps rm out of any mount left in it.
  rm -rf --one-file-system "$dir/$name.tar.partial"
  mmdebstrap "${args[@]}" bookworm "$dir/$name.tar.partial" "$mirror"
  mv "$dir/$name.tar.partial" "$dir/$name.tar"
}

build base ""
build torch "python3-torch"
if ! podman image exists localhost/gpufleet-test:base; then
  echo "test-images: podman import $dir/base.tar localhost/gpufleet-test:base"
  podman import --quiet "$dir/base.tar" localhost/gpufleet-test:base >/dev/null
fi
