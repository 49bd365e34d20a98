#!/usr/bin/env bash
# Soak: svcproxy (the daemon, release build) under steady endpoint churn for a long
# time, through the fake API server and through the manifests source.
#
# For each source: a generated cluster (default 1000 Services x 10 endpoints, 50
# Nodes) is served by svcproxy-fakeapi, or written by it as one manifest file per
# object; svcproxy runs against it in a network namespace this script creates and
# deletes (never the host's). After svcproxy's first sync, svcproxy-fakeapi replaces
# endpoints at --rate changes per second (each a new pod address, stamped with
# endpoints.kubernetes.io/last-change-trigger-time; in the files case, one slice
# file rewritten and renamed over per change) for --duration seconds. Meanwhile
# /healthz is read every second and svcproxy's VmRSS every --sample seconds.
#
# Reports per source: changes made, syncs and sync failures, the p50/p99 of
# kubeproxy_network_programming_duration_seconds (Prometheus' histogram_quantile
# interpolation), /healthz answers other than 200, VmRSS at the start, end and peak
# and its least-squares slope (MiB per hour) over the whole churn and over its second
# half, with the samples in WORKDIR (kept with --keep).
#
# In the ebpf and ipvs modes svcproxy gets a cgroup and a bpffs of the script's own
# (removed at the end, with svcproxy's pins), and the entries of its maps are counted
# in the kernel (bpftool) after the first sync and again after the churn: a map
# svcproxy fills must hold exactly the keys its own record says
# (svcproxy_ebpf_map_entries), every other map must come back to its count (no
# leaked lists, scheduler state, lc counts, service or reverse entries).
#
# Usage: scripts/soak.sh [--source api|manifests|both] [--services N]
#          [--endpoints-per-service M] [--nodes K] [--rate R] [--duration SECS]
#          [--sample SECS] [--mode nftables|iptables|ebpf|ipvs] [--keep] [--no-build]
# Needs root, ip, nft (or iptables), curl; bpftool and python3 in the ebpf and ipvs
# modes. Linux only (/proc).
set -euo pipefail
cd "$(dirname "$0")/.."

source_sel=both
services=1000
endpoints=10
nodes=50
rate=100
duration=600
sample=10
mode=nftables
keep=0
build=1
hostname=node-1

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --source) source_sel=$2; shift 2 ;;
        --services) services=$2; shift 2 ;;
        --endpoints-per-service) endpoints=$2; shift 2 ;;
        --nodes) nodes=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --duration) duration=$2; shift 2 ;;
        --sample) sample=$2; shift 2 ;;
        --mode) mode=$2; shift 2 ;;
        --keep) keep=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown argument: $1" >&2; usage >&2; exit 2 ;;
    esac
done
for v in "$services" "$endpoints" "$nodes" "$rate" "$duration" "$sample"; do
    case "$v" in ''|*[!0-9]*) echo "not a non-negative integer: $v" >&2; exit 2 ;; esac
done
[ "$sample" -gt 0 ] || { echo "--sample must be positive" >&2; exit 2; }
case "$source_sel" in api) sources=(api) ;; manifests) sources=(manifests) ;; both) sources=(api manifests) ;;
    *) echo "--source: api, manifests or both" >&2; exit 2 ;; esac
case "$mode" in nftables) failures_metric=kubeproxy_sync_proxy_rules_nftables_sync_failures_total ;;
    iptables) failures_metric=kubeproxy_sync_proxy_rules_iptables_restore_failures_total ;;
    ebpf|ipvs) failures_metric=svcproxy_sync_failures_total ;;
    *) echo "--mode: nftables, iptables, ebpf or ipvs" >&2; exit 2 ;; esac
ebpf=0
case "$mode" in ebpf|ipvs) ebpf=1 ;; esac
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 1; }

if [ "$build" = 1 ]; then
    cargo build --release -p svcproxy -p svcproxy-fakeapi >&2
fi
target_dir=${CARGO_TARGET_DIR:-target}
svcproxy=$(realpath "$target_dir/release/svcproxy")
fakeapi=$(realpath "$target_dir/release/svcproxy-fakeapi")

work=$(mktemp -d "${TMPDIR:-/tmp}/svcproxy-soak.XXXXXX")
pids=()
netns=
cgroot=
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    ebpf_teardown
    [ -z "$netns" ] || ip netns delete "$netns" 2>/dev/null || true
    [ -z "$cgroot" ] || { umount "$cgroot" 2>/dev/null || true; }
    if [ "$keep" = 1 ]; then echo "kept $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rss_kib() { awk '$1 == "VmRSS:" { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

# wait_for PID WHAT LOG SECS CMD...: polls CMD until it succeeds.
wait_for() {
    local pid=$1 what=$2 log=$3 deadline=$((SECONDS + $4))
    shift 4
    until "$@" 2>/dev/null; do
        kill -0 "$pid" 2>/dev/null || { echo "exited before $what:" >&2; tail -n 20 "$log" >&2; exit 1; }
        [ $SECONDS -lt $deadline ] || { echo "no $what in time:" >&2; tail -n 20 "$log" >&2; exit 1; }
        sleep 0.1
    done
}

# metric TEXT NAME [LABELS]: the sum of a metric's samples whose labels include
# LABELS (e.g. ip_family="IPv4"; 0 when absent).
metric() {
    awk -v n="$2" -v l="${3:-}" '($1 == n || index($1, n "{") == 1) && index($1, l) { s += $NF }
        END { printf "%g", s + 0 }' "$1"
}

# quantile TEXT NAME Q: histogram_quantile over NAME's buckets.
quantile() {
    awk -v n="$2_bucket" -v q="$3" '
        index($1, n "{") == 1 {
            le = $1; sub(/.*le="/, "", le); sub(/".*/, "", le)
            c[le] += $NF; if (!(le in seen)) { seen[le] = 1; les[++k] = le }
        }
        END {
            if (k == 0) { print "n/a"; exit }
            # Buckets in order of their bound (+Inf last).
            for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) {
                a = (les[i] == "+Inf") ? 1e300 : les[i] + 0; b = (les[j] == "+Inf") ? 1e300 : les[j] + 0
                if (b < a) { t = les[i]; les[i] = les[j]; les[j] = t }
            }
            total = c[les[k]]; if (total == 0) { print "n/a"; exit }
            rank = q * total; prev_le = 0; prev_c = 0
            for (i = 1; i <= k; i++) {
                le = les[i]; cnt = c[le]
                if (cnt >= rank) {
                    if (le == "+Inf") { printf "> %s", prev_le; exit }
                    if (cnt == prev_c) { printf "%.3f", le; exit }
                    printf "%.3f", prev_le + (le - prev_le) * (rank - prev_c) / (cnt - prev_c); exit
                }
                prev_le = le + 0; prev_c = cnt
            }
        }' "$1"
}

# slope FILE [FROM]: least-squares slope of the "seconds kib" lines from second FROM
# on, in MiB per hour.
slope() {
    awk -v from="${2:-0}" '$1 >= from { n++; sx += $1; sy += $2; sxx += $1 * $1; sxy += $1 * $2 }
         END { d = n * sxx - sx * sx; if (n < 2 || d == 0) print "n/a";
               else printf "%.2f", (n * sxy - sx * sy) / d / 1024 * 3600 }' "$1"
}

# The ebpf and ipvs modes' own cgroup and bpffs: a cgroup v2 hierarchy mounted
# under the work directory (`ip netns exec` hides /sys/fs/cgroup) with a child of
# the script's, and a bpffs mounted there too; never the host's.
ebpf_dirs=
ebpf_setup() {
    [ "$ebpf" = 1 ] || return 0
    if [ -z "$cgroot" ]; then
        cgroot=$work/cgroup2
        mkdir -p "$cgroot"
        mount -t cgroup2 none "$cgroot"
    fi
    local dir=$1
    mkdir -p "$cgroot/svcproxy-soak-$$" "$dir/bpffs"
    mount -t bpf bpf "$dir/bpffs"
    ebpf_dirs=$dir
    mode_args=(--ebpf-cgroup "$cgroot/svcproxy-soak-$$" --ebpf-bpffs "$dir/bpffs/svcproxy")
}
ebpf_teardown() {
    [ -n "$ebpf_dirs" ] || return 0
    local dir=$ebpf_dirs
    ebpf_dirs=
    [ -z "$netns" ] || ip netns exec "$netns" "$svcproxy" cleanup --proxy-mode "$mode" \
        "${mode_args[@]}" >/dev/null 2>&1 || true
    umount "$dir/bpffs" 2>/dev/null || true
    rmdir "$cgroot/svcproxy-soak-$$" 2>/dev/null || true
}
# map_counts DIR METRICS OUT: each pinned map's entries in the kernel, and the keys
# svcproxy's own record says it holds there (svcproxy_ebpf_map_entries in METRICS;
# "-" for the maps it does not fill: scheduler state, counts, connections), as
# "name kernel record" lines.
map_counts() {
    local pin name n rec
    : >"$3"
    for pin in "$1"/bpffs/svcproxy/svcproxy_*; do
        [ -f "$pin" ] || continue
        name=$(basename "$pin")
        n=$(bpftool -j map dump pinned "$pin" 2>/dev/null |
            python3 -c 'import json, sys; print(len(json.load(sys.stdin)))' 2>/dev/null) || n=
        rec=$(awk -v m="svcproxy_ebpf_map_entries{map=\"$name\"}" '$1 == m { print $2 }' "$2")
        printf '%s %s %s\n' "$name" "${n:-?}" "${rec:--}" >>"$3"
    done
}

run() {
    local src=$1 dir=$work/$1
    mkdir -p "$dir"
    netns=svcproxy-soak-$$
    ip netns add "$netns"
    ip -n "$netns" link set lo up
    local fake_args=(--listen 127.0.0.1:0 --kubeconfig-out "$dir/kubeconfig"
        --services "$services" --endpoints-per-service "$endpoints" --nodes "$nodes"
        --churn "$rate" --churn-for "$duration")
    [ "$src" = manifests ] && fake_args+=(--manifests-out "$dir/manifests")
    ip netns exec "$netns" "$fakeapi" "${fake_args[@]}" >"$dir/fakeapi.out" 2>"$dir/fakeapi.err" &
    local api=$!
    pids+=("$api")
    wait_for "$api" "svcproxy-fakeapi serving" "$dir/fakeapi.err" 300 grep -qx ready "$dir/fakeapi.out"
    local source_args
    if [ "$src" = api ]; then
        source_args=(--kubeconfig "$dir/kubeconfig")
    else
        source_args=(--manifests "$dir/manifests")
    fi
    # The node's InternalIP, so that its healthCheckNodePort servers can listen.
    local node_ip server
    server=$(sed -n 's/^ *server: *//p' "$dir/kubeconfig" | head -n 1)
    node_ip=$(ip netns exec "$netns" curl -sf "$server/api/v1/nodes/$hostname" | tr -d ' \n' |
        sed -nE 's/.*"address":"([^"]*)","type":"InternalIP".*/\1/p; t; s/.*"type":"InternalIP","address":"([^"]*)".*/\1/p' |
        head -n 1 || true)
    [ -z "$node_ip" ] || ip -n "$netns" addr add "$node_ip/32" dev lo
    mode_args=()
    ebpf_setup "$dir"
    ip netns exec "$netns" "$svcproxy" "${source_args[@]}" --proxy-mode "$mode" "${mode_args[@]}" \
        --hostname-override "$hostname" --healthz-bind-address 127.0.0.1:10256 \
        --metrics-bind-address 127.0.0.1:10249 >"$dir/svcproxy.out" 2>"$dir/svcproxy.err" &
    local proxy=$!
    pids+=("$proxy")
    wait_for "$proxy" "the first sync" "$dir/svcproxy.err" 300 \
        sh -c "ip netns exec $netns curl -sf -o /dev/null http://127.0.0.1:10256/healthz"
    sleep 5
    ip netns exec "$netns" curl -sf http://127.0.0.1:10249/metrics >"$dir/metrics.before"
    [ "$ebpf" = 0 ] || map_counts "$dir" "$dir/metrics.before" "$dir/maps.before"
    kill -USR1 "$api"
    local start=$SECONDS last_sample=-"$sample" not_ok=0 checks=0 code
    : >"$dir/rss"
    echo "[$src] churning $rate changes/s for ${duration}s..." >&2
    while [ $((SECONDS - start)) -lt "$duration" ]; do
        kill -0 "$proxy" 2>/dev/null || { echo "[$src] svcproxy exited:" >&2; tail -n 20 "$dir/svcproxy.err" >&2; exit 1; }
        code=$(ip netns exec "$netns" curl -s -o /dev/null -m 2 -w '%{http_code}' http://127.0.0.1:10256/healthz || true)
        checks=$((checks + 1))
        if [ "$code" != 200 ]; then
            not_ok=$((not_ok + 1))
            echo "$((SECONDS - start)) $code" >>"$dir/healthz-not-ok"
        fi
        if [ $((SECONDS - start - last_sample)) -ge "$sample" ]; then
            last_sample=$((SECONDS - start))
            echo "$last_sample $(rss_kib "$proxy")" >>"$dir/rss"
        fi
        sleep 1
    done
    # Let the last changes land.
    sleep 5
    echo "$((SECONDS - start)) $(rss_kib "$proxy")" >>"$dir/rss"
    ip netns exec "$netns" curl -sf http://127.0.0.1:10249/metrics >"$dir/metrics"
    local maps=-
    if [ "$ebpf" = 1 ]; then
        map_counts "$dir" "$dir/metrics" "$dir/maps.after"
        # A map svcproxy fills must hold exactly what its record says (the churn
        # may move endpoints onto or off the node: a Local policy's lists change
        # size); every other map must be back to its count after the first sync.
        maps=$(join "$dir/maps.before" "$dir/maps.after" |
            awk '{ bad = ($5 != "-") ? ($4 != $5) : ($2 != $4) }
                 bad { printf "%s%s %s->%s (record %s)", sep, $1, $2, $4, $5; sep = ", " }
                 END { if (NR && !sep) printf "all %d as recorded", NR }')
        echo "[$src] map entries (kernel, svcproxy's record) after the first sync, and after the churn:" >&2
        join "$dir/maps.before" "$dir/maps.after" | column -t >&2
    fi
    local made
    made=$(sed -n 's/.*churn done: \([0-9]*\) changes.*/\1/p' "$dir/fakeapi.err")
    local syncs failures p50 p99 count
    # One pass syncs both families: count the IPv4 series' observations.
    local v4='ip_family="IPv4"'
    syncs=$(awk -v a="$(metric "$dir/metrics.before" kubeproxy_sync_proxy_rules_duration_seconds_count "$v4")" \
        -v b="$(metric "$dir/metrics" kubeproxy_sync_proxy_rules_duration_seconds_count "$v4")" 'BEGIN { print b - a }')
    failures=$(metric "$dir/metrics" "$failures_metric" "$v4")
    p50=$(quantile "$dir/metrics" kubeproxy_network_programming_duration_seconds 0.5)
    p99=$(quantile "$dir/metrics" kubeproxy_network_programming_duration_seconds 0.99)
    count=$(metric "$dir/metrics" kubeproxy_network_programming_duration_seconds_count)
    local rss_start rss_end rss_peak
    rss_start=$(awk 'NR == 1 { printf "%.1f", $2 / 1024 }' "$dir/rss")
    rss_end=$(awk 'END { printf "%.1f", $2 / 1024 }' "$dir/rss")
    rss_peak=$(awk '$2 > m { m = $2 } END { printf "%.1f", m / 1024 }' "$dir/rss")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$src" "${made:-?}" "$count" "$syncs" \
        "$failures" "$p50" "$p99" "$not_ok/$checks" "$rss_start" "$rss_end" "$rss_peak" \
        "$(slope "$dir/rss")" "$(slope "$dir/rss" $((duration / 2)))" "$maps" >>"$work/results"
    kill "$proxy" "$api" 2>/dev/null || true
    wait "$proxy" "$api" 2>/dev/null || true
    pids=()
    ebpf_teardown
    ip netns delete "$netns"
    netns=
}

: >"$work/results"
for s in "${sources[@]}"; do run "$s"; done
echo
echo "svcproxy soak ($mode): $services services x $endpoints endpoints, $nodes nodes; $rate endpoint changes/s for ${duration}s"
{
    printf 'source\tchanges\tlatencies\tsyncs\tsync failures\tp50 s\tp99 s\thealthz not 200\tRSS start MiB\tRSS end MiB\tRSS peak MiB\tRSS slope MiB/h\t2nd half MiB/h\tmap entries\n'
    cat "$work/results"
} | column -t -s "$(printf '\t')"
