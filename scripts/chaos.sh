#!/usr/bin/env bash
# The chaos run (not part of CI): for SECONDS seconds in MODE (nftables, iptables or
# userspace), node-a's svcproxy in a two-node cluster of network namespaces is killed
# with SIGKILL at random moments (every 1-5 s) and started again while 12 services'
# endpoints change every 50-250 ms. After each restart's first sync, `explain --live`
# must find the kernel equal to the plan and every service must answer from its
# current endpoints. Prints the counts; exits non-zero on any mismatch or failure.
#   ./scripts/chaos.sh [SECONDS] [MODE]       (as root; CHAOS_SEED=N repeats a run)
set -euo pipefail
cd "$(dirname "$0")/.."
export CHAOS_SECONDS=${1:-120} CHAOS_MODE=${2:-nftables}
cargo build --locked -p svcproxy -p svcproxy-e2e --bins
exec cargo test --locked -p svcproxy-e2e --test dataplane -- --ignored \
  --exact chaos_kill_9_under_endpoint_churn --nocapture
