#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs the tools the real-packet tests
# use, then runs every test of the workspace (unit, golden, and network-namespace
# end-to-end tests, which need root and create and remove their own namespaces).
#
# A test that cannot run here (no root, a tool missing) says SKIP; the summary at
# the end counts them. Under CI or SVCPROXY_E2E_REQUIRED=1 a skip is a failure: the
# test itself fails, and so does this script if any skip was counted.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
cargo build --workspace --all-targets --locked
SVCPROXY_SKIP_LOG=$(mktemp -t svcproxy-skips.XXXXXX)
export SVCPROXY_SKIP_LOG
trap 'rm -f "$SVCPROXY_SKIP_LOG"' EXIT
status=0
cargo test --workspace --locked "$@" || status=$?
skipped=$(grep -c '^SKIP' "$SVCPROXY_SKIP_LOG" || true)
echo "svcproxy: ${skipped} test(s) skipped"
# Skipping is forbidden as svcproxy-testkit's rule says: CI or
# SVCPROXY_E2E_REQUIRED set, and not empty, 0 or false.
forbidden=false
for v in "${CI:-}" "${SVCPROXY_E2E_REQUIRED:-}"; do
  case "$v" in "" | 0 | false) ;; *) forbidden=true ;; esac
done
if [ "$skipped" -gt 0 ]; then
  sed 's/^/  /' "$SVCPROXY_SKIP_LOG"
  if [ "$forbidden" = true ]; then
    echo "svcproxy: skips are failures under CI / SVCPROXY_E2E_REQUIRED" >&2
    status=1
  fi
fi
exit "$status"
