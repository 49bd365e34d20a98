#!/usr/bin/env bash
# The cluster DNS's speed against an authoritative server's, in the same run.
#
# Generates a cluster (default: 10000 Services, half of them headless, 10 endpoints
# each, over 100 Nodes in 4 zones; the headless ones opt into topology with
# `svcproxy.io/topology-keys: topology.kubernetes.io/zone, *`) as manifests, and the
# same answers as a zone file for NSD (Debian's `nsd`): for the headless services,
# the endpoints of node-1's zone, which is what `svcproxy dns --dns-node-local` on
# node-1 answers. Then, for each server in turn, on 127.0.0.1, pinned to CPU 0 while
# dnsperf runs on CPU 1:
#   1. throughput: dnsperf for --seconds (default 10) with 20 clients and 200 queries
#      outstanding, over a query file mixing both kinds of service (A queries);
#   2. latency: dnsperf -v at a fixed rate (--latency-qps, default 5000) for 5 s: p50
#      and p99 from the per-query times.
# svcproxy runs twice: node-local (--dns-node-local on node-1) and central (the
# client's node found per query from its address; 127.0.0.0/8 is node-1's pod CIDR).
# Prints queries per second, CPU 0's busy share during the throughput run and so
# the queries per second of a whole CPU (dnsperf alone on CPU 1 can be the
# bottleneck: then qps is about the same for all), the queries per second with a
# busy loop sharing CPU 0 (the server, with about half a CPU, is the bottleneck),
# p50/p99, and svcproxy's ratios to NSD. Last, the memory of `svcproxy dns` fed by
# the API source instead (svcproxy-fakeapi serving a cluster of the same size, its
# own: plain ClusterIP services).
#
# Usage: scripts/bench-dns.sh [--services N] [--endpoints-per-service M]
#          [--seconds S] [--latency-qps Q] [--no-build]
# Needs dnsperf and nsd (apt-get install dnsperf nsd; installed here when missing
# and apt-get is available), python3, taskset. Loopback only; nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."

services=10000
endpoints=10
seconds=10
latency_qps=5000
build=1
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --services) services=$2; shift 2 ;;
        --endpoints-per-service) endpoints=$2; shift 2 ;;
        --seconds) seconds=$2; shift 2 ;;
        --latency-qps) latency_qps=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-dns: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if ! command -v dnsperf >/dev/null || ! command -v nsd >/dev/null; then
    apt-get install -y --no-install-recommends dnsperf nsd >/dev/null
fi
if [ "$build" = 1 ]; then
    cargo build --release --locked -p svcproxy -p svcproxy-fakeapi >&2
fi
bin=$PWD/target/release/svcproxy
fakeapi=$PWD/target/release/svcproxy-fakeapi

work=$(mktemp -d /tmp/svcproxy-bench-dns.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# The cluster, the zone and the queries, from one description.
python3 - "$work" "$services" "$endpoints" <<'PY'
import pathlib, sys
work, services, per = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
zone = "cluster.local"
nodes = 100
zones = ["a", "b", "c", "d"]
node_zone = lambda n: zones[n % len(zones)]
here = node_zone(1)
m = work / "manifests"
m.mkdir()
with open(m / "nodes.yaml", "w") as f:
    for n in range(nodes):
        f.write(f"---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-{n}\n"
                f"  labels: {{topology.kubernetes.io/zone: {node_zone(n)}}}\n")
        # dnsperf asks from 127.0.0.1: a central server places it on node-1 by
        # this pod CIDR, and so chooses the same endpoints as node-1's own server.
        if n == 1:
            f.write("spec: {podCIDRs: [127.0.0.0/8]}\n")
zf = open(work / "cluster.zone", "w")
zf.write(f"$ORIGIN {zone}.\n$TTL 5\n@ IN SOA ns.dns.{zone}. hostmaster.{zone}. 1 7200 1800 86400 5\n"
         f"@ IN NS ns.dns.{zone}.\nns.dns IN A 127.0.0.1\n")
queries = []
with open(m / "services.yaml", "w") as f:
    for i in range(services):
        name = f"svc-{i}"
        headless = i % 2 == 1
        ip = f"10.{96 + i // 65536}.{(i // 256) % 256}.{i % 256}"
        f.write(f"---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: bench\n")
        if headless:
            f.write('  annotations: {svcproxy.io/topology-keys: "topology.kubernetes.io/zone, *"}\n')
            f.write("spec:\n  clusterIP: None\n  ports: [{name: http, port: 80}]\n")
        else:
            f.write(f"spec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80}}]\n")
            zf.write(f"{name}.bench.svc IN A {ip}\n")
        f.write(f"---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n"
                f"  name: {name}-1\n  namespace: bench\n  labels: {{kubernetes.io/service-name: {name}}}\n"
                f"addressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n")
        for e in range(per):
            n = (i + e) % nodes
            k = i * per + e
            epip = f"172.{16 + k // 65536 % 16}.{(k // 256) % 256}.{k % 256}"
            f.write(f"- {{addresses: [{epip}], nodeName: node-{n}, zone: {node_zone(n)}}}\n")
            if headless and node_zone(n) == here:
                zf.write(f"{name}.bench.svc IN A {epip}\n")
        queries.append(f"{name}.bench.svc.{zone} A")
zf.close()
(work / "queries.txt").write_text("\n".join(queries) + "\n")
(work / "nsd.conf").write_text(f"""server:
  ip-address: 127.0.0.1@5354
  server-count: 1
  # Debian builds NSD with response-rate limiting on (200/s per /24): off, as
  # svcproxy's is by default.
  rrl-ratelimit: 0
  rrl-whitelist-ratelimit: 0
  username: ""
  zonesdir: "{work}"
  database: ""
  pidfile: "{work}/nsd.pid"
  xfrdfile: "{work}/xfrd.state"
  zonelistfile: "{work}/zone.list"
  logfile: "{work}/nsd.log"
remote-control:
  control-enable: no
zone:
  name: {zone}
  zonefile: cluster.zone
""")
PY
# A manifests directory is not usually written the moment svcproxy starts: one
# younger than the source's settle time (0.5 s) is read again right after start,
# which leaves the allocator holding the second parse's pages (~440 MiB RSS
# instead of ~280 MiB here).
sleep 1

wait_answer() { # PORT NAME
    for _ in $(seq 1 600); do
        if printf '%s A\n' "$2" | dnsperf -s 127.0.0.1 -p "$1" -n 1 -v 2>/dev/null | grep -q '^> NOERROR'; then
            return 0
        fi
        sleep 0.2
    done
    echo "bench-dns: no answer on port $1" >&2
    tail -20 "$work"/*.log "$work"/*.out 2>/dev/null >&2 || true
    return 1
}

# CPU 0's busy and total jiffies (user, nice, system, irq, softirq, steal; all).
cpu0() { awk '$1 == "cpu0" {print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9}' /proc/stat; }

measure() { # LABEL PORT -> "qps p50_us p99_us lost answered cpu0_busy_percent qps_sharing_cpu0"
    local port=$2 out before after
    before=$(cpu0)
    out=$(taskset -c 1 dnsperf -s 127.0.0.1 -p "$port" -d "$work/queries.txt" \
        -l "$seconds" -c 20 -q 200 2>&1)
    after=$(cpu0)
    local qps lost busy
    qps=$(awk '/Queries per second:/ {print $4}' <<<"$out")
    lost=$(awk '/Queries lost:/ {print $3}' <<<"$out")
    busy=$(awk -v b="$before" -v a="$after" 'BEGIN {split(b, x, " "); split(a, y, " "); printf "%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2])}')
    # The same with a busy loop sharing CPU 0: the server, not dnsperf, is the
    # bottleneck (it gets about half the CPU).
    local burner shared
    taskset -c 0 sh -c 'while :; do :; done' &
    burner=$!
    shared=$(taskset -c 1 dnsperf -s 127.0.0.1 -p "$port" -d "$work/queries.txt" \
        -l "$seconds" -c 20 -q 200 2>&1 | awk '/Queries per second:/ {printf "%.0f", $4}')
    kill "$burner"
    wait "$burner" 2>/dev/null || true
    taskset -c 1 dnsperf -s 127.0.0.1 -p "$port" -d "$work/queries.txt" -l 5 \
        -Q "$latency_qps" -v >"$work/$1.latency" 2>&1 || true
    python3 - "$work/$1.latency" "$qps" "$lost" "$busy" "$shared" <<'PY'
import sys
times = []
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) >= 5 and parts[0] == ">" and parts[1] == "NOERROR":
        try:
            times.append(float(parts[-1]))
        except ValueError:
            pass
times.sort()
pick = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e6 if times else float("nan")
print(f"{float(sys.argv[2]):.0f} {pick(0.50):.0f} {pick(0.99):.0f} {sys.argv[3]} {len(times)} {sys.argv[4]} {sys.argv[5]}")
PY
}

# Waits (at most 20 s) until PID has used no CPU for half a second: measurements
# start from the steady state, not while start-up work is still finishing.
wait_idle() {
    local last now
    last=$(awk '{print $14 + $15}' "/proc/$1/stat")
    for _ in $(seq 1 40); do
        sleep 0.5
        now=$(awk '{print $14 + $15}' "/proc/$1/stat")
        [ "$now" = "$last" ] && return 0
        last=$now
    done
}

started_pid='' started_after=''
start_svcproxy() { # PORT [FLAGS...]: start, wait for an answer; sets started_pid, started_after
    local port=$1 t0
    shift
    taskset -c 0 "$bin" dns --manifests "$work/manifests" --hostname-override node-1 \
        --dns-bind-address "127.0.0.1:$port" --dns-upstream none "$@" \
        >"$work/svcproxy-$port.log" 2>&1 &
    started_pid=$!
    pids+=("$started_pid")
    t0=$(date +%s.%N)
    wait_answer "$port" svc-0.bench.svc.cluster.local
    started_after=$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")
    wait_idle "$started_pid"
}

# svcproxy dns node-local on node-1: topology chosen once per change, answers kept
# encoded.
start_svcproxy 5353 --dns-node-local
ready=$started_after
rss=$(awk '/VmRSS/ {print $2}' "/proc/$started_pid/status")
svc=$(measure svcproxy 5353)

# svcproxy dns central: each client's node found from its address, topology
# chosen per query (such answers are never kept).
start_svcproxy 5355
central_rss=$(awk '/VmRSS/ {print $2}' "/proc/$started_pid/status")
central=$(measure central 5355)

# NSD with the same answers.
taskset -c 0 nsd -d -c "$work/nsd.conf" >"$work/nsd.out" 2>&1 &
pids+=($!)
wait_answer 5354 svc-0.bench.svc.cluster.local
wait_idle "$!"
nsd_rss=$(awk '/VmRSS/ {print $2}' "/proc/$!/status")
ref=$(measure nsd 5354)

# Both answer the same: the A records of a plain and of two headless services.
python3 - <<'PY'
import socket, struct
def ask(port, name):
    q = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, ("127.0.0.1", port))
    r, _ = s.recvfrom(65535)
    n_an = struct.unpack(">H", r[6:8])[0]
    i = len(q)
    ips = []
    for _ in range(n_an):
        i += 2 if r[i] & 0xC0 == 0xC0 else r.index(b"\0", i) + 1 - i
        rtype, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if rtype == 1:
            ips.append(socket.inet_ntoa(r[i:i + rdlen]))
        i += rdlen
    return sorted(ips), bool(r[2] & 0x02)
for name in ["svc-0", "svc-1", "svc-3"]:
    fqdn = f"{name}.bench.svc.cluster.local"
    a, c, b = ask(5353, fqdn), ask(5355, fqdn), ask(5354, fqdn)
    assert a == b == c, f"{fqdn}: svcproxy {a}, central {c}, nsd {b}"
PY
# The API source: svcproxy dns against svcproxy-fakeapi (same numbers of Services,
# endpoints and Nodes), its RSS once every list is in and it is idle.
api_rss=''
if [ -x "$fakeapi" ]; then
    mkdir -p "$work/api"
    "$fakeapi" --listen 127.0.0.1:0 --kubeconfig-out "$work/api/kubeconfig" \
        --services "$services" --endpoints-per-service "$endpoints" --nodes 100 \
        >"$work/api/out" 2>"$work/api/err" &
    pids+=($!)
    for _ in $(seq 1 600); do grep -qx ready "$work/api/out" && break; sleep 0.1; done
    taskset -c 0 "$bin" dns --kubeconfig "$work/api/kubeconfig" --hostname-override node-1 \
        --dns-bind-address 127.0.0.1:5356 --dns-upstream none --dns-node-local \
        >"$work/svcproxy-api.log" 2>&1 &
    pids+=($!)
    api_pid=$!
    for _ in $(seq 1 600); do grep -q 'cluster DNS answering' "$work/svcproxy-api.log" && break; sleep 0.1; done
    wait_idle "$api_pid"
    api_rss=$(awk '/VmRSS/ {print $2}' "/proc/$api_pid/status")
fi

read -r s_qps s_p50 s_p99 s_lost s_n s_busy s_shared <<<"$svc"
read -r c_qps c_p50 c_p99 c_lost c_n c_busy c_shared <<<"$central"
read -r n_qps n_p50 n_p99 n_lost n_n n_busy n_shared <<<"$ref"
cap() { python3 -c "print(f'{$1 * 100 / max($2, 1):.0f}')"; }
row() { # LABEL QPS BUSY SHARED P50 P99 LOST RSS
    printf '%-26s %9s %8s%% %12s %11s %7s %7s %6s %9s\n' "$1" "$2" "$3" "$(cap "$2" "$3")" "$4" "$5" "$6" "$7" "$8"
}
echo "bench-dns: $services services ($((services / 2)) headless with topology keys), $endpoints endpoints each; server on CPU 0, dnsperf on CPU 1"
printf '%-26s %9s %9s %12s %11s %7s %7s %6s %9s\n' server qps cpu0_busy qps_per_cpu qps_shared p50_us p99_us lost rss_kib
row "svcproxy dns (node-local)" "$s_qps" "$s_busy" "$s_shared" "$s_p50" "$s_p99" "$s_lost" "$rss"
row "svcproxy dns (central)" "$c_qps" "$c_busy" "$c_shared" "$c_p50" "$c_p99" "$c_lost" "$central_rss"
row "nsd (zone file)" "$n_qps" "$n_busy" "$n_shared" "$n_p50" "$n_p99" "$n_lost" "$nsd_rss"
ratio() { # LABEL QPS BUSY SHARED P99
    python3 -c "print(f'$1 / nsd: qps {$2 / $n_qps:.2f}x, qps per CPU {($2 / max($3, 1)) / ($n_qps / max($n_busy, 1)):.2f}x, qps sharing CPU 0 {$4 / max($n_shared, 1):.2f}x, p99 {$5 / max($n_p99, 1):.2f}x')"
}
ratio "svcproxy node-local" "$s_qps" "$s_busy" "$s_shared" "$s_p99"
ratio "svcproxy central" "$c_qps" "$c_busy" "$c_shared" "$c_p99"
echo "svcproxy answered its first query $ready s after start"
if [ -n "$api_rss" ]; then
    echo "svcproxy dns through the API source (svcproxy-fakeapi, $services ClusterIP services x $endpoints endpoints, 100 nodes): rss_kib $api_rss"
fi
if [ "$s_busy" -lt 97 ] || [ "$n_busy" -lt 97 ]; then
    echo "note: below ~97% of CPU 0 a server was not the bottleneck (dnsperf, alone on CPU 1, was): qps_per_cpu (queries per second of a whole CPU) and qps_shared (a busy loop sharing CPU 0, so the server is the bottleneck) tell them apart"
fi
