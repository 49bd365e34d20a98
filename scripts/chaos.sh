#!/usr/bin/env bash
# The chaos runs (not part of CI), in a two-node cluster of network namespaces where
# 12 services' endpoints change every 50-250 ms, for SECONDS seconds in MODE
# (nftables, iptables, iptables-legacy, userspace, ebpf or ipvs), while a pod of
# node-a connects to the services all along:
#   kill       node-a's svcproxy is killed with SIGKILL at random moments (every
#              1-5 s) and started again (its kernel objects forward meanwhile);
#   hand-over  a new svcproxy (two binaries, alternately) starts beside node-a's at
#              random moments, stands by, and takes over at the owner's SIGTERM.
# After each disruption `explain --live` must find the kernel equal to the plan and
# every service must answer from its current endpoints, and every connection of the
# stream must have been answered. SOURCE `api` has node-a's svcproxy read a fake
# API server in node-a's namespace (--kubeconfig), each change applied to it, rather
# than the manifests. Prints the counts; exits non-zero on any mismatch or failure.
#   ./scripts/chaos.sh [SECONDS] [MODE] [kill|hand-over] [manifests|api]   (as root;
#   CHAOS_SEED=N repeats a run)
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 [SECONDS] [MODE] [kill|hand-over] [manifests|api]"
export CHAOS_SECONDS=${1:-120} CHAOS_MODE=${2:-nftables} CHAOS_SOURCE=${4:-manifests}
case ${3:-kill} in
  kill) test=chaos_kill_9_under_endpoint_churn ;;
  hand-over) test=chaos_rolling_hand_overs_under_endpoint_churn ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
case $CHAOS_SOURCE in
  manifests|api) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
cargo build --locked -p svcproxy -p svcproxy-e2e --bins
exec cargo test --locked -p svcproxy-e2e --test dataplane -- --ignored \
  --exact "$test" --nocapture
