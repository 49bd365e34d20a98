#!/usr/bin/env bash
# Quickstart (run as root): installs what it needs, builds svcproxy, shows what two
# differently-labelled nodes of the bundled example cluster would do, then runs a
# live demo: a throwaway two-node cluster of network namespaces, svcproxy in nftables
# mode on node-a, and real requests to a ClusterIP and a NodePort. The demo removes
# everything it created when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release --locked --bin svcproxy --bin svcproxy-demo --bin svcproxy-echo
# Where cargo put them (CARGO_TARGET_DIR, if set, as cargo reads it).
release=${CARGO_TARGET_DIR:-target}/release
bin=$release/svcproxy
for node in node-a node-c; do
  echo "================================================================"
  echo "\$ svcproxy snapshot --manifests examples/cluster --hostname-override $node"
  "$bin" snapshot --manifests examples/cluster --hostname-override "$node"
done
echo "================================================================"
echo "live demo (network namespaces, real packets):"
"$release/svcproxy-demo"
