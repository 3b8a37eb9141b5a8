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
  chromium  # the dashboard's tests drive it headless (tests/web)
)
# Node.js runs the dashboard's browser test; a machine that has one already keeps it.
command -v node >/dev/null || packages+=(nodejs npm)
# `scripts/deps.sh fuzz` (make fuzz): libFuzzer comes with clang.
if [[ "${1:-}" == "fuzz" ]]; then
  packages+=(clang-14 libfuzzer-14-dev)
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

if ((${#missing[@]} > 0)); then
  echo "deps: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    sudo=sudo
  else
    sudo=
  fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The browser test's driver, from the npm registry at the version package-lock.json pins
# (playwright-core drives the system's chromium and downloads no browser of its own).
web="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/web"
if [[ ! -d "$web/node_modules/playwright-core" ||
      "$web/package-lock.json" -nt "$web/node_modules/.package-lock.json" ]]; then
  echo "deps: npm ci in tests/web (playwright-core, for the dashboard's browser test)"
  (cd "$web" && npm ci --no-audit --no-fund --loglevel=error)
fi
