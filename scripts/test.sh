#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the tools the real-packet tests
# use, then runs every test of the workspace (unit, golden, and network-namespace
# end-to-end tests, which need root and create and remove their own namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
cargo build --workspace --all-targets --locked
cargo test --workspace --locked "$@"
