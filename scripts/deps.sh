#!/usr/bin/env bash
# Installs the Debian 12 packages gpufleet builds and tests with. Safe to rerun: it asks apt only
# for what is missing, and does nothing when everything is there.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache make pkg-config git
  libfmt-dev libspdlog-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libboost-dev
  libsqlite3-dev libssl-dev
  openssl  # the HTTPS tests make their certificates with the openssl tool
  clang-format python3
  python3-torch  # the end-to-end DDP training job (gloo, CPU) and the reference model server
  prometheus  # the agent's integration test scrapes it with a real Prometheus server
  etcd-server  # the etcd store backend: its conformance suite runs against a real etcd
  iproute2 libfaketime  # the HA fault tests: network namespaces, and a server's clock stepped
  # Containers: the OCI runtimes (crun, and runc where crun refuses the cgroups), tini as the
  # containers' init, podman for image references, mmdebstrap for the tests' images.
  runc crun tini podman mmdebstrap
)
# `scripts/deps.sh fuzz` (make fuzz): libFuzzer comes with clang.
if [[ "${1:-}" == "fuzz" ]]; then
  packages+=(clang-14 libfuzzer-14-dev)
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "deps: installing ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  sudo=sudo
else
  sudo=
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
