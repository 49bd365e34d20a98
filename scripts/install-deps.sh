#!/usr/bin/env bash
# Installs what svcproxy's demo, build and tests need on a fresh Debian/Ubuntu machine:
# nftables, iproute2, conntrack, iptables (the data planes' tools), clang and libbpf's
# headers (the eBPF mode's programs, compiled by crates/svcproxy-dataplane/build.rs),
# with --tests Prometheus (tests/dashboards.rs runs kube-proxy's dashboard queries
# against svcproxy), python3 and ethtool,
# and a Rust toolchain check.
# Idempotent: does nothing when everything is already there.
set -euo pipefail

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v conntrack >/dev/null 2>&1 || need+=(conntrack)
command -v iptables-restore >/dev/null 2>&1 || need+=(iptables)
command -v clang >/dev/null 2>&1 || need+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
[ -f /usr/include/linux/bpf.h ] || need+=(linux-libc-dev)
# The tests: python3 (a client holding connections open, tests/schedulers.rs; and
# scripts/validate-manifests.sh's virtualenv), ethtool (a test namespace's veth made
# to send whole checksums, as a wire does: tests/ebpf_packet.rs's XDP run).
if [ "${1:-}" = "--tests" ]; then
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
fi

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "svcproxy: need root to install: ${need[*]}" >&2
    exit 1
  fi
  echo "svcproxy: installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# With --tests (scripts/test.sh): Prometheus, without its recommends (its node
# exporter, unused here). The service it registers does not start without systemd,
# and the test starts its own.
if [ "${1:-}" = "--tests" ] && ! command -v promtool >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    # The test that needs it needs root too: it will say SKIP.
    echo "svcproxy: not root: prometheus not installed (tests/dashboards.rs will skip)" >&2
  else
    echo "svcproxy: installing prometheus" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
fi

if ! command -v cargo >/dev/null 2>&1; then
  {
    echo "svcproxy: cargo is not on PATH (looked in: $PATH)."
    if [ -n "${SUDO_USER:-}" ]; then
      echo "  Run under sudo: root's PATH lacks ${SUDO_USER}'s ~/.cargo/bin. Keep yours:"
      echo "    sudo env \"PATH=\$PATH\" ./scripts/quickstart.sh   (or ./scripts/test.sh)"
    elif [ -x "$HOME/.cargo/bin/cargo" ]; then
      echo "  It is at $HOME/.cargo/bin/cargo: export PATH=\"\$HOME/.cargo/bin:\$PATH\""
    else
      echo "  Install a stable Rust toolchain: https://rustup.rs"
    fi
  } >&2
  exit 1
fi
