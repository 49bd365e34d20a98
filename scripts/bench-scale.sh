#!/usr/bin/env bash
# What an operator waits for at scale: process start to rules in the kernel.
#
# For each size (Services, 10 endpoints each; scripts/gen-cluster.py writes the
# manifests directory) and each round, in fresh network namespaces this script
# creates and deletes:
# - the floor: `nft -f` of the ruleset svcproxy renders for that cluster (what the
#   kernel needs to load the same rules, with nothing parsed before);
# - the data floor: `nft -f` of a table holding only the same data, as plain as it
#   gets (a verdict map of the service ports, each to an empty chain of its own,
#   and one map of every endpoint under a number; the floor of cargo test
#   --release -p svcproxy-dataplane --test bench_sync);
# - `svcproxy --proxy-mode MODE --manifests DIR --once` for each mode (wall time
#   from exec to exit, which is after the rules are in; peak RSS); the ebpf mode
#   confined to a cgroup and a bpffs of this script's own, removed at the end;
# - with --daemon, the daemon itself (nftables mode): its RSS once its first sync
#   is in (the manifests source);
# - with --probe, nftables mode's cold start written in one transaction
#   (`--nft-cold-start single`) and in steps (the default), each with another
#   nftables writer beside it (scripts/nft-writer-probe.py, a transaction every
#   5 ms in the same namespace): the longest it waited, and its 99th percentile.
# - with --baseline PATH, another build (an earlier commit's) run the same way
#   right after each mode's run, in the same rounds: rows `baseline-MODE`.
# - with --affinity K, the same cluster with one Service in K given ClientIP
#   session affinity (K = 50 is fakeapi's 2% mix), each mode (and baseline) run on
#   it right after the plain cluster, in the same rounds: rows `MODE+aff`, and a
#   table of their ratio to the same mode without affinity.
# Prints each run, then per size and mode the median and its ratio to the floor's
# median of the same run.
#
#   scripts/bench-scale.sh [--sizes "10000 100000"] [--modes "nftables ebpf"]
#                          [--rounds 3] [--daemon] [--probe] [--bin PATH]
#                          [--baseline PATH] [--affinity K]
# As root (namespaces, nft, BPF); needs python3, nft, ip, /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes="10000 100000"
modes="nftables ebpf"
rounds=3
daemon=0
probe=0
bin=
baseline=
affinity=0
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) sizes=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --daemon) daemon=1; shift ;;
        --probe) probe=1; shift ;;
        --bin) bin=$2; shift 2 ;;
        --baseline) baseline=$2; shift 2 ;;
        --affinity) affinity=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
case "$affinity" in
    ''|*[!0-9]*) echo "--affinity takes a whole number (0: none), not '$affinity'" >&2; exit 2 ;;
esac
if [ -z "$bin" ]; then
    cargo build --release --locked -p svcproxy >&2
    bin=target/release/svcproxy
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/svcproxy-scale.XXXXXX")
ns=svcscale-$$
cgroup=
cgroup_mount=
bpffs=
cleanup() {
    if [ -s "$work/daemon.pid" ]; then
        kill "$(cat "$work/daemon.pid")" 2>/dev/null || true
    fi
    if [ -n "$bpffs" ] && mountpoint -q "$bpffs"; then
        ip netns exec "$ns" "$bin" cleanup --ebpf-cgroup "$cgroup" \
            --ebpf-bpffs "$bpffs/pins" >/dev/null 2>&1 || true
        umount "$bpffs" || true
    fi
    ip netns delete "$ns" 2>/dev/null || true
    [ -z "$cgroup" ] || rmdir "$cgroup" 2>/dev/null || true
    if [ -n "$cgroup_mount" ] && mountpoint -q "$cgroup_mount"; then
        umount "$cgroup_mount" || true
    fi
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ " $modes " == *" ebpf "* ]]; then
    # The cgroup v2 hierarchy mounted again under the work directory: `ip netns
    # exec` remounts /sys, where the host mounts it (../shared/EBPF-NOTES.md).
    cgroup_mount=$work/cgroup2
    mkdir "$cgroup_mount"
    mount -t cgroup2 none "$cgroup_mount"
    mkdir "$cgroup_mount/svcproxy-scale-$$"
    cgroup=$cgroup_mount/svcproxy-scale-$$
    bpffs=$work/bpffs
    mkdir "$bpffs"
    mount -t bpf bpf "$bpffs"
fi

# The previous run's tables are flushed (synchronously) before its namespace is
# deleted, and the kernel is given a second to free the rest: a namespace's
# cleanup runs in a kernel worker after `ip netns delete` returns, and at 100k
# Services it overlapped the next run's first seconds.
fresh_ns() {
    if ip netns exec "$ns" true 2>/dev/null; then
        ip netns exec "$ns" nft flush ruleset 2>/dev/null || true
        ip netns delete "$ns"
        sleep 1
    fi
    ip netns add "$ns"
    ip -n "$ns" link set lo up
}

# run LABEL CMD...: one timed run in a fresh namespace; prints "LABEL SECONDS MIB".
run() {
    local label=$1
    shift
    fresh_ns
    /usr/bin/time -f "%e %M" -o "$work/time" ip netns exec "$ns" "$@" \
        >"$work/out" 2>"$work/err" || {
        echo "$label failed:" >&2; tail -n 20 "$work/err" >&2; exit 1; }
    read -r secs kib <"$work/time"
    echo "$label $secs $((kib / 1024))"
}

# daemon_rss DIR: the daemon's VmRSS once its first sync is logged, and 5 s later.
daemon_rss() {
    fresh_ns
    ip netns exec "$ns" "$bin" --proxy-mode nftables --manifests "$1" \
        --hostname-override node-1 >"$work/daemon.out" 2>"$work/daemon.err" &
    local pid=$! deadline=$((SECONDS + 600))
    # This runs in a subshell ($(...)): the trap finds the daemon by this file.
    echo "$pid" >"$work/daemon.pid"
    until grep -q 'synced mode=' "$work/daemon.err"; do
        kill -0 "$pid" 2>/dev/null || { tail -n 20 "$work/daemon.err" >&2; exit 1; }
        [ $SECONDS -lt $deadline ] || { echo "no first sync" >&2; kill "$pid"; exit 1; }
        sleep 0.1
    done
    local pidof
    pidof=$(pgrep -P "$pid" -x svcproxy || echo "$pid")
    local first later
    first=$(awk '$1 == "VmRSS:" { printf "%.0f", $2 / 1024 }' "/proc/$pidof/status")
    sleep 5
    later=$(awk '$1 == "VmRSS:" { printf "%.0f", $2 / 1024 }' "/proc/$pidof/status")
    local peak
    peak=$(awk '$1 == "VmHWM:" { printf "%.0f", $2 / 1024 }' "/proc/$pidof/status")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    : >"$work/daemon.pid"
    echo "daemon-rss $first $later $peak"
}

# probed LABEL CMD...: `run`, with the writer probe in the same namespace; prints
# "LABEL SECONDS MIB MAX_WAIT_MS P99_WAIT_MS".
probed() {
    local label=$1
    shift
    fresh_ns
    rm -f "$work/probe.stop"
    ip netns exec "$ns" python3 scripts/nft-writer-probe.py --stop "$work/probe.stop" \
        >"$work/probe.out" &
    local pp=$!
    sleep 0.5
    /usr/bin/time -f "%e %M" -o "$work/time" ip netns exec "$ns" "$@" \
        >"$work/out" 2>"$work/err" || {
        echo "$label failed:" >&2; tail -n 20 "$work/err" >&2; kill "$pp"; exit 1; }
    touch "$work/probe.stop"
    wait "$pp"
    read -r secs kib <"$work/time"
    local max p99
    max=$(awk '{ for (i = 1; i < NF; i++) if ($i == "max_ms") print $(i + 1) }' "$work/probe.out")
    p99=$(awk '{ for (i = 1; i < NF; i++) if ($i == "p99_ms") print $(i + 1) }' "$work/probe.out")
    echo "$label $secs $((kib / 1024)) $max $p99"
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

results=$work/results
: >"$results"
for n in $sizes; do
    dir=$work/cluster-$n
    mkdir -p "$dir"
    python3 scripts/gen-cluster.py "$dir" "$n"
    if [ "$affinity" != 0 ]; then
        mkdir -p "$dir-aff"
        python3 scripts/gen-cluster.py "$dir-aff" "$n" 10 "$affinity"
    fi
    "$bin" render --proxy-mode nftables --manifests "$dir" --hostname-override node-1 \
        >"$work/rules.nft" 2>/dev/null
    echo "== $n services x 10 endpoints: $(du -sh "$dir" | cut -f1) of YAML," \
        "$(wc -c <"$work/rules.nft") bytes of rules" >&2
    python3 - "$n" >"$work/data.nft" <<'PY'
import sys
n, eps = int(sys.argv[1]), 10
out = sys.stdout
out.write("table ip bench {\n map vips { type ipv4_addr . inet_proto . inet_service : verdict; }\n"
          " map eps { typeof numgen random mod 1 : ip daddr . tcp dport; }\n}\n")
for i in range(n):
    out.write(f"add chain ip bench s{i}\n")
def vip(i):
    return f"10.{96 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"
for start in range(0, n, 10000):
    out.write("add element ip bench vips { " + ", ".join(
        f"{vip(i)} . tcp . 80 : goto s{i}" for i in range(start, min(n, start + 10000))) + " }\n")
for start in range(0, n * eps, 10000):
    out.write("add element ip bench eps { " + ", ".join(
        f"{k} : 10.{100 + (k // eps) % 100}.{(k // eps // 100) % 256}.{k % eps + 1} . 8080"
        for k in range(start, min(n * eps, start + 10000))) + " }\n")
PY
    for r in $(seq "$rounds"); do
        line=$(run floor nft -f "$work/rules.nft")
        echo "$n round $r $line" | tee -a "$results"
        line=$(run data-floor nft -f "$work/data.nft")
        echo "$n round $r $line" | tee -a "$results"
        for m in $modes; do
            extra=()
            if [ "$m" = ebpf ]; then
                extra=(--ebpf-cgroup "$cgroup" --ebpf-bpffs "$bpffs/pins")
            fi
            variants=("$m:$dir")
            [ "$affinity" = 0 ] || variants+=("$m+aff:$dir-aff")
            for v in "${variants[@]}"; do
                label=${v%%:*}
                cluster=${v#*:}
                builds=("$label:$bin")
                [ -z "$baseline" ] || builds+=("baseline-$label:$baseline")
                for b in "${builds[@]}"; do
                    exe=${b#*:}
                    line=$(run "${b%%:*}" "$exe" --proxy-mode "$m" --manifests "$cluster" \
                        --hostname-override node-1 --once "${extra[@]}")
                    echo "$n round $r $line" | tee -a "$results"
                    if [ "$m" = ebpf ]; then
                        ip netns exec "$ns" "$exe" cleanup "${extra[@]}" >/dev/null 2>&1
                    fi
                done
            done
        done
    done
    if [ "$probe" = 1 ]; then
        for r in $(seq "$rounds"); do
            for how in single steps; do
                line=$(probed "probe-$how" "$bin" --proxy-mode nftables --manifests "$dir" \
                    --hostname-override node-1 --once --nft-cold-start "$how")
                echo "$n round $r $line" | tee -a "$work/probes"
            done
        done
    fi
    if [ "$daemon" = 1 ]; then
        line=$(daemon_rss "$dir")
        echo "$n $line (MiB: after the first sync, 5 s later, peak)" | tee -a "$results"
    fi
    rm -rf "$dir" "$dir-aff"
done

echo
echo "| services x 10 endpoints | row | median wall s | x floor | x data floor | median peak RSS MiB |"
echo "|---|---|---|---|---|---|"
for n in $sizes; do
    floor=$(awk -v n="$n" '$1 == n && $4 == "floor" { print $5 }' "$results" | median)
    data=$(awk -v n="$n" '$1 == n && $4 == "data-floor" { print $5 }' "$results" | median)
    labels="floor data-floor"
    for m in $modes; do
        labels="$labels $m"
        [ "$affinity" = 0 ] || labels="$labels $m+aff"
    done
    if [ -n "$baseline" ]; then
        for m in $modes; do
            labels="$labels baseline-$m"
            [ "$affinity" = 0 ] || labels="$labels baseline-$m+aff"
        done
    fi
    for label in $labels; do
        secs=$(awk -v n="$n" -v l="$label" '$1 == n && $4 == l { print $5 }' "$results" | median)
        mib=$(awk -v n="$n" -v l="$label" '$1 == n && $4 == l { print $6 }' "$results" | median)
        ratio=$(awk -v a="$secs" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')
        dratio=$(awk -v a="$secs" -v b="$data" 'BEGIN { printf "%.2f", a / b }')
        echo "| $n | $label | $secs | $ratio | $dratio | $mib |"
    done
done
if [ "$affinity" != 0 ]; then
    echo
    echo "| services x 10 endpoints | build and mode | no affinity, median s | 1 in $affinity with affinity, median s | ratio |"
    echo "|---|---|---|---|---|"
    for n in $sizes; do
        for m in $modes; do
            for pre in "" ${baseline:+baseline-}; do
                plain=$(awk -v n="$n" -v l="$pre$m" '$1 == n && $4 == l { print $5 }' "$results" | median)
                aff=$(awk -v n="$n" -v l="$pre$m+aff" '$1 == n && $4 == l { print $5 }' "$results" | median)
                ratio=$(awk -v a="$aff" -v b="$plain" 'BEGIN { printf "%.2f", a / b }')
                echo "| $n | $pre$m | $plain | $aff | $ratio |"
            done
        done
    done
fi
if [ "$probe" = 1 ]; then
    echo
    echo "| services x 10 endpoints | nftables cold start | median wall s | another writer's longest wait, ms (median of rounds) | its p99, ms |"
    echo "|---|---|---|---|---|"
    for n in $sizes; do
        for how in single steps; do
            col() { awk -v n="$n" -v l="probe-$how" -v c="$1" '$1 == n && $4 == l { print $c }' "$work/probes" | median; }
            echo "| $n | $how | $(col 5) | $(col 7) | $(col 8) |"
        done
    done
fi
