#!/usr/bin/env bash
# The long fuzz run (issue 15): the generator-based fuzz test of
# crates/svcproxy-plan/tests/fuzz.rs with many more cases than CI's fixed-seed 48 and a
# seed of your choosing. Each case is two generated clusters (valid, edge and hostile
# values) under a random configuration, taken from manifests text to both backends'
# rules; nft loads them for real and iptables-restore --test checks them, inside
# throwaway network namespaces (root needed; nothing outside them is touched).
#
#   scripts/fuzz.sh [CASES [SEED]]      defaults: 5000 cases, a seed from the clock
#
# A failure prints the shrunk case (its manifests and configuration) and the seed, so
# `scripts/fuzz.sh CASES SEED` reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-5000}
seed=${2:-$(date +%s)}
echo "fuzz: $cases cases, seed $seed" >&2
SVCPROXY_FUZZ_CASES=$cases SVCPROXY_FUZZ_SEED=$seed \
  cargo test --locked -p svcproxy-plan --test fuzz -- --nocapture
