#!/usr/bin/env bash
# Resident memory of svcproxy watching a large cluster.
#
# Serves a generated cluster with svcproxy-fakeapi (default: 10000 Services with 10
# endpoints each, i.e. 100k endpoints, and 5000 Nodes), runs
#   svcproxy snapshot --watch --format json --kubeconfig ... --hostname-override node-1
# against it and, once the first snapshot line is printed, reads VmHWM (peak RSS) and
# VmRSS from /proc/PID/status. The same is done first against an empty cluster (the
# baseline); both are printed with the difference and the time to the first snapshot.
#
# Usage: scripts/bench-memory.sh [--services N] [--endpoints-per-service M]
#          [--nodes K] [--hostname NAME] [--timeout SECS] [--settle SECS] [--kernel]
#          [--no-build]
# --settle SECS: also read VmRSS again SECS after the first snapshot (default 0: no).
# --kernel: also run the daemon itself (nftables mode) against the same cluster, in
#   a network namespace this script creates and deletes (the fake API server runs
#   there too), and read its memory after its first sync. Needs root, ip and nft.
# Linux only (/proc). Snapshot mode needs no privileges: it touches no kernel state.
set -euo pipefail
cd "$(dirname "$0")/.."

services=10000
endpoints=10
nodes=5000
hostname=node-1
timeout_s=300
settle=0
build=1
kernel=0

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --services) services=$2; shift 2 ;;
        --endpoints-per-service) endpoints=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --hostname) hostname=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --settle) settle=$2; shift 2 ;;
        --kernel) kernel=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$services" "$endpoints" "$nodes" "$timeout_s" "$settle"; do
    case "$v" in ''|*[!0-9]*) echo "not a non-negative integer: $v" >&2; exit 2 ;; esac
done

if [ "$build" = 1 ]; then
    cargo build --release -p svcproxy -p svcproxy-fakeapi >&2
fi
target_dir=${CARGO_TARGET_DIR:-target}
svcproxy=$target_dir/release/svcproxy
fakeapi=$target_dir/release/svcproxy-fakeapi
for b in "$svcproxy" "$fakeapi"; do
    [ -x "$b" ] || { echo "missing $b (build it, or drop --no-build)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/svcproxy-bench.XXXXXX")
pids=()
netns=
cleanup() {
    [ "${#pids[@]}" -eq 0 ] || stop "${pids[@]}"
    if [ -n "$netns" ]; then
        ip netns delete "$netns" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
# A /proc/PID/status field (kB) in MiB.
mib() { awk -v f="$1:" '$1 == f { printf "%.1f", $2 / 1024; found = 1 } END { if (!found) print "n/a" }' "/proc/$2/status"; }

# wait_until LABEL PID WHAT LOG CMD...: polls CMD until it succeeds; gives up, with
# the tail of LOG, if PID exits first or after --timeout seconds.
wait_until() {
    local label=$1 pid=$2 what=$3 log=$4
    shift 4
    local deadline=$((SECONDS + timeout_s))
    until "$@" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "[$label] exited before $what:" >&2; tail -n 20 "$log" >&2; exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "[$label] no $what within ${timeout_s}s:" >&2; tail -n 20 "$log" >&2; exit 1
        fi
        sleep 0.05
    done
}

# stop PID...: terminates and reaps.
stop() {
    kill "$@" 2>/dev/null || true
    local pid
    for pid in "$@"; do
        wait "$pid" 2>/dev/null || true
    done
}

# The first snapshot is complete once its line is terminated.
has_line() { [ "$(wc -l <"$1")" -ge 1 ]; }

# start_api LABEL SERVICES ENDPOINTS NODES [PREFIX...]: starts the fake API server
# (under PREFIX, e.g. `ip netns exec NS`) and waits until it serves.
start_api() {
    local label=$1 n_svc=$2 n_eps=$3 n_nodes=$4
    shift 4
    local dir=$work/$label
    mkdir -p "$dir"
    "$@" "$fakeapi" --listen 127.0.0.1:0 --kubeconfig-out "$dir/kubeconfig" \
        --services "$n_svc" --endpoints-per-service "$n_eps" --nodes "$n_nodes" \
        >"$dir/fakeapi.out" 2>"$dir/fakeapi.err" &
    pids+=("$!")
    wait_until "$label" "$!" "svcproxy-fakeapi serving" "$dir/fakeapi.err" \
        grep -qx ready "$dir/fakeapi.out"
    echo "[$label] $(tail -n 1 "$dir/fakeapi.err")" >&2
}

# run_case LABEL SERVICES ENDPOINTS NODES: sets hwm, rss, ttfs (and rss_settled).
run_case() {
    local label=$1
    local dir=$work/$label
    start_api "$@"
    local api=${pids[-1]}

    local start
    start=$(now)
    "$svcproxy" snapshot --watch --format json --kubeconfig "$dir/kubeconfig" \
        --hostname-override "$hostname" >"$dir/snapshots" 2>"$dir/svcproxy.err" &
    local proxy=$!
    pids+=("$proxy")
    wait_until "$label" "$proxy" "svcproxy's first snapshot" "$dir/svcproxy.err" \
        has_line "$dir/snapshots"
    ttfs=$(elapsed "$start" "$(now)")
    hwm=$(mib VmHWM "$proxy")
    rss=$(mib VmRSS "$proxy")
    rss_settled=
    if [ "$settle" -gt 0 ]; then
        sleep "$settle"
        rss_settled=$(mib VmRSS "$proxy")
    fi
    local bytes
    bytes=$(head -n 1 "$dir/snapshots" | wc -c)
    echo "[$label] first snapshot after ${ttfs}s ($bytes bytes): VmHWM $hwm MiB, VmRSS $rss MiB" >&2
    stop "$proxy" "$api"
}

# run_kernel_case SERVICES ENDPOINTS NODES: the daemon in a throwaway network
# namespace; sets k_hwm, k_rss, k_sync (seconds to the first sync), k_settled.
run_kernel_case() {
    local label=kernel dir=$work/kernel
    netns=svcproxy-bench-$$
    ip netns add "$netns"
    ip -n "$netns" link set lo up
    start_api "$label" "$@" ip netns exec "$netns"
    local api=${pids[-1]}
    # The node's InternalIP, so that its healthCheckNodePort servers can listen.
    local node_ip server
    server=$(sed -n 's/^ *server: *//p' "$dir/kubeconfig" | head -n 1)
    node_ip=$(ip netns exec "$netns" curl -sf "$server/api/v1/nodes/$hostname" | tr -d ' \n' |
        sed -nE 's/.*"address":"([^"]*)","type":"InternalIP".*/\1/p; t; s/.*"type":"InternalIP","address":"([^"]*)".*/\1/p' |
        head -n 1 || true)
    [ -z "$node_ip" ] || ip -n "$netns" addr add "$node_ip/32" dev lo
    local start
    start=$(now)
    # `ip netns exec` execs: the PID is svcproxy's.
    ip netns exec "$netns" "$svcproxy" --proxy-mode nftables --kubeconfig "$dir/kubeconfig" \
        --hostname-override "$hostname" --healthz-bind-address 127.0.0.1:10256 \
        >"$dir/svcproxy.out" 2>"$dir/svcproxy.err" &
    local proxy=$!
    pids+=("$proxy")
    wait_until "$label" "$proxy" "svcproxy's first sync" "$dir/svcproxy.err" \
        grep -q ' synced' "$dir/svcproxy.err"
    k_sync=$(elapsed "$start" "$(now)")
    k_hwm=$(mib VmHWM "$proxy")
    k_rss=$(mib VmRSS "$proxy")
    sleep "$((settle > 0 ? settle : 5))"
    k_settled=$(mib VmRSS "$proxy")
    # What the settled RSS is made of: the heap and stacks (anonymous) and the
    # binary's pages the process touched (file-backed, shared with page cache).
    k_anon=$(mib RssAnon "$proxy")
    k_file=$(mib RssFile "$proxy")
    echo "[$label] first sync after ${k_sync}s: VmHWM $k_hwm MiB, VmRSS $k_rss MiB" >&2
    stop "$proxy" "$api"
    ip netns delete "$netns"
    netns=
}

run_case baseline 0 0 0
base_hwm=$hwm base_rss=$rss base_ttfs=$ttfs base_settled=$rss_settled
run_case large "$services" "$endpoints" "$nodes"
if [ "$kernel" = 1 ]; then
    run_kernel_case "$services" "$endpoints" "$nodes"
fi

diff() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a") print "n/a"; else printf "%.1f", b - a }'; }
echo
echo "svcproxy memory: $services services x $endpoints endpoints ($((services * endpoints)) endpoints), $nodes nodes"
printf '%-10s %12s %12s %14s%s\n' case "VmHWM MiB" "VmRSS MiB" "first snap s" "$([ "$settle" -gt 0 ] && printf ' %14s' "RSS +${settle}s MiB")"
printf '%-10s %12s %12s %14s%s\n' baseline "$base_hwm" "$base_rss" "$base_ttfs" "$([ "$settle" -gt 0 ] && printf ' %14s' "$base_settled")"
printf '%-10s %12s %12s %14s%s\n' large "$hwm" "$rss" "$ttfs" "$([ "$settle" -gt 0 ] && printf ' %14s' "$rss_settled")"
printf '%-10s %12s %12s\n' difference "$(diff "$base_hwm" "$hwm")" "$(diff "$base_rss" "$rss")"
if [ "$kernel" = 1 ]; then
    echo
    echo "daemon (nftables mode, in a network namespace), same cluster:"
    printf '%-10s %12s %12s %14s %14s %12s %12s\n' case "VmHWM MiB" "VmRSS MiB" "first sync s" "RSS +$((settle > 0 ? settle : 5))s MiB" "anon MiB" "file MiB"
    printf '%-10s %12s %12s %14s %14s %12s %12s\n' kernel "$k_hwm" "$k_rss" "$k_sync" "$k_settled" "$k_anon" "$k_file"
fi
