#!/usr/bin/env bash
# Quickstart: builds svcproxy and shows what two differently-labelled nodes of the
# bundled example cluster would do with each service.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cargo build --release --locked --bin svcproxy
bin=target/release/svcproxy
for node in node-a node-c; do
  echo "================================================================"
  "$bin" snapshot --manifests examples/cluster --hostname-override "$node"
done
