#!/usr/bin/env bash
# The userspace proxy mode against HAProxy (TCP mode), in the same run, same
# namespaces, same backends.
#
# Three network namespaces it creates and removes: a client, a node (where the
# proxies run, forwarding between the two links) and a backend holding two
# addresses, each served by svcproxy-loadgen. Behind the node:
#   floor      the client straight to one backend address (routed by the node)
#   nftables   svcproxy --proxy-mode nftables: the kernel DNATs the cluster IP
#   userspace  svcproxy --proxy-mode userspace, 1 Service (relaying with splice)
#   us-copy    the same with --userspace-zero-copy=false (a buffer, no splice)
#   us-10k     the same as userspace with 10,000 Services (the measured one among them)
#   haproxy    Debian's haproxy, mode tcp, balance roundrobin, the same backends
#   haproxy-cap the same behind a redirect from the cluster IP (the capture's cost)
# Every row starts from a namespace without rules (svcproxy leaves its table in
# place at SIGTERM: each svcproxy row ends with `svcproxy cleanup`), so conntrack
# sees connections only where a row's own capture or DNAT needs it: the plain
# haproxy row has none, which makes each of its connections about 20% cheaper.
# Each proxy is pinned to CPU 0 (so HAProxy and svcproxy each have one CPU: one
# thread each), the client and the backends to CPU 1. For each:
#   bulk-1, bulk-16  download throughput over 1 and 16 streams (Gbit/s)
#   conn/s           new connections per second, 8 at a time, each one 32-byte
#                    request echoed (and its p50)
#   rr p50/p99       64-byte request/response latency on one open connection
# Prints a table, and each figure of userspace as a ratio to HAProxy's, and us-10k's
# to userspace's (the cost of holding 10k Services).
#
# Usage: scripts/bench-userspace.sh [--seconds S] [--repeat N] [--only NAME,...] [--tests T,...] [--no-build]
# (--repeat: every row N times, in turn, each figure the median of its N runs;
# these 2-core machines vary by 10-15% from one run to the next)
# (--only: just these rows, e.g. userspace,haproxy; --tests: just these of bulk-1,
# bulk-16, connect, rr)
# Needs haproxy (installed with apt-get when missing), iproute2, nft, python3,
# taskset. Nothing is left running; the root namespace is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=5
repeat=1
build=1
only=
tests=
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --repeat) repeat=$2; shift 2 ;;
        --only) only=",$2,"; shift 2 ;;
        --tests) tests=",$2,"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench-userspace: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if ! command -v haproxy >/dev/null; then
    apt-get install -y --no-install-recommends haproxy >/dev/null
fi
if [ "$build" = 1 ]; then
    cargo build --release -p svcproxy -p svcproxy-e2e --bin svcproxy --bin svcproxy-loadgen >&2
fi
bin=$PWD/target/release/svcproxy
load=$PWD/target/release/svcproxy-loadgen

tag=svb$$
C=$tag-c N=$tag-n B=$tag-b
work=$(mktemp -d /tmp/svcproxy-bench-us.XXXXXX)
pids=()
stop_all() { # the proxies (the backend runs until the end)
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_all
    [ -z "${backend:-}" ] || { kill "$backend" 2>/dev/null; wait "$backend" 2>/dev/null; } || true
    for ns in $C $N $B; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }
for ns in $C $N $B; do ip netns add "$ns"; nsx "$ns" ip link set lo up; done
ip link add "$tag-cn" netns "$C" type veth peer name "$tag-nc" netns "$N"
ip link add "$tag-nb" netns "$N" type veth peer name "$tag-bn" netns "$B"
nsx "$C" ip addr add 10.77.0.2/24 dev "$tag-cn"
nsx "$N" ip addr add 10.77.0.1/24 dev "$tag-nc"
nsx "$N" ip addr add 10.77.1.1/24 dev "$tag-nb"
nsx "$B" ip addr add 10.77.1.2/24 dev "$tag-bn"
nsx "$B" ip addr add 10.77.1.3/24 dev "$tag-bn"
for l in "$C $tag-cn" "$N $tag-nc" "$N $tag-nb" "$B $tag-bn"; do
    set -- $l; nsx "$1" ip link set "$2" up
done
nsx "$C" ip route add default via 10.77.0.1
nsx "$B" ip route add default via 10.77.1.1
nsx "$N" sysctl -qw net.ipv4.ip_forward=1

ip netns exec "$B" taskset -c 1 "$load" serve --listen 10.77.1.2:9000,10.77.1.3:9000 > "$work/backend.log" 2>&1 &
backend=$!

manifests() { # DIR EXTRA_SERVICES
    local dir=$1 extra=$2
    mkdir -p "$dir"
    cat > "$dir/00-node.yaml" <<EOF
apiVersion: v1
kind: Node
metadata: {name: node-1}
status: {addresses: [{type: InternalIP, address: 10.77.0.1}]}
EOF
    cat > "$dir/10-web.yaml" <<EOF
apiVersion: v1
kind: Service
metadata: {name: web, namespace: bench}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 9000}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: bench, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 9000}]
endpoints:
- {addresses: [10.77.1.2], conditions: {ready: true}}
- {addresses: [10.77.1.3], conditions: {ready: true}}
EOF
    python3 - "$dir/20-more.yaml" "$extra" <<'EOF'
import sys
path, n = sys.argv[1], int(sys.argv[2])
with open(path, "w") as f:
    for i in range(n):
        ip = f"10.97.{i // 250}.{i % 250 + 1}"
        f.write(f"""---
apiVersion: v1
kind: Service
metadata: {{name: s{i}, namespace: bench}}
spec: {{clusterIP: {ip}, ports: [{{name: http, port: 80, targetPort: 9000}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: s{i}-1, namespace: bench, labels: {{kubernetes.io/service-name: s{i}}}}}
addressType: IPv4
ports: [{{name: http, port: 9000}}]
endpoints:
- {{addresses: [10.77.1.2], conditions: {{ready: true}}}}
""")
EOF
}
manifests "$work/one" 0
manifests "$work/many" 9999

cat > "$work/haproxy.cfg" <<EOF
global
    # Within this machine's open files limit (HAProxy wants 2 per connection).
    maxconn 4000
    nbthread 1
defaults
    mode tcp
    timeout connect 1s
    timeout client 60s
    timeout server 60s
listen web
    bind 10.77.0.1:8080
    balance roundrobin
    server b1 10.77.1.2:9000
    server b2 10.77.1.3:9000
EOF

# Waits until a TCP connection to $1 from the client is accepted (bounded).
wait_open() {
    for _ in $(seq 1 600); do
        if nsx "$C" bash -c "exec 3<>/dev/tcp/${1%:*}/${1#*:}" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "bench-userspace: $1 never answered; logs:" >&2
    tail -n 20 "$work"/*.log >&2
    exit 1
}

results=$work/results.jsonl
# Whether row $1 is wanted (--only).
want() { [ -z "$only" ] || [[ "$only" == *",$1,"* ]]; }

measure() { # NAME TARGET
    local name=$1 target=$2
    wait_open "$target"
    for t in bulk-1 bulk-16 connect rr; do
        [ -z "$tests" ] || [[ "$tests" == *",$t,"* ]] || continue
        case $t in
            bulk-1) args="bulk --streams 1" ;;
            bulk-16) args="bulk --streams 16" ;;
            connect) args="connect --concurrency 8" ;;
            rr) args="rr --concurrency 1" ;;
        esac
        # shellcheck disable=SC2086
        nsx "$C" taskset -c 1 "$load" $args --target "$target" --seconds "$seconds" \
            | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); d["name"]=sys.argv[1]; print(json.dumps(d))' "$name" >> "$results"
    done
    echo "bench-userspace: $name done (run $rep of $repeat)" >&2
}

svcproxy() { # MODE DIR [FLAGS...]
    local mode=$1 dir=$2
    shift 2
    ip netns exec "$N" taskset -c 0 "$bin" --proxy-mode "$mode" --manifests "$dir" --hostname-override node-1 \
        --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256 "$@" \
        >> "$work/svcproxy-$mode.log" 2>&1 &
    pids+=($!)
}

rss_10k=0
for rep in $(seq 1 "$repeat"); do
    want floor && measure floor 10.77.1.2:9000

    if want nftables; then
        svcproxy nftables "$work/one"
        measure nftables 10.96.0.10:80
        stop_all
        nsx "$N" "$bin" cleanup >/dev/null 2>&1
    fi

    if want userspace; then
        svcproxy userspace "$work/one"
        measure userspace 10.96.0.10:80
        stop_all
        nsx "$N" "$bin" cleanup >/dev/null 2>&1
    fi

    if want us-copy; then
        svcproxy userspace "$work/one" --userspace-zero-copy=false
        measure us-copy 10.96.0.10:80
        stop_all
        nsx "$N" "$bin" cleanup >/dev/null 2>&1
    fi

    if want us-10k; then
        svcproxy userspace "$work/many"
        measure us-10k 10.96.0.10:80
        # The last proxy started (ip netns exec and taskset exec it: its own pid).
        rss_10k=$(awk '/^VmRSS/ {print $2}' "/proc/${pids[-1]}/status")
        stop_all
        nsx "$N" "$bin" cleanup >/dev/null 2>&1
    fi

    if want haproxy; then
        ip netns exec "$N" taskset -c 0 haproxy -f "$work/haproxy.cfg" -db > "$work/haproxy.log" 2>&1 &
        pids+=($!)
        measure haproxy 10.77.0.1:8080
        stop_all
    fi

    if want haproxy-cap; then
        # HAProxy behind the same kind of capture as the userspace mode (a redirect
        # from the cluster IP, so conntrack and NAT see every connection): the
        # proxies' own costs compared alone.
        nsx "$N" nft -f - <<'NFT'
table ip bench-cap {
    chain prerouting {
        type nat hook prerouting priority dstnat;
        ip daddr 10.96.0.10 tcp dport 80 redirect to :8080
    }
}
NFT
        ip netns exec "$N" taskset -c 0 haproxy -f "$work/haproxy.cfg" -db > "$work/haproxy.log" 2>&1 &
        pids+=($!)
        measure haproxy-cap 10.96.0.10:80
        stop_all
        nsx "$N" nft delete table ip bench-cap
    fi
done
kill "$backend" 2>/dev/null || true

python3 - "$results" "$rss_10k" <<'EOF'
import json, sys
import statistics
runs = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    r = runs.setdefault(d["name"], {})
    def add(col, v):
        r.setdefault(col, []).append(v)
    if d["test"] == "bulk":
        add(f"bulk-{d['streams']}", d["gbit_per_s"])
    elif d["test"] == "connect":
        add("conn/s", d["per_s"]); add("conn p50", d["p50_us"])
    else:
        add("rr p50", d["p50_us"]); add("rr p99", d["p99_us"])
# Each figure: the median of its runs.
rows = {n: {c: statistics.median(v) for c, v in r.items()} for n, r in runs.items()}
cols = ["bulk-1", "bulk-16", "conn/s", "conn p50", "rr p50", "rr p99"]
units = {"bulk-1": "Gbit/s", "bulk-16": "Gbit/s", "conn/s": "", "conn p50": "µs", "rr p50": "µs", "rr p99": "µs"}
print("| | " + " | ".join(f"{c} {units[c]}".strip() for c in cols) + " |")
print("|---" * (len(cols) + 1) + "|")
for name in ["floor", "nftables", "userspace", "us-copy", "us-10k", "haproxy", "haproxy-cap"]:
    r = rows.get(name, {})
    if name not in rows:
        continue
    print(f"| {name} | " + " | ".join(f"{r.get(c, 0):.2f}" if c.startswith("bulk") else f"{r.get(c, 0):.0f}" for c in cols) + " |")
def ratio(a, b, c):
    x, y = rows.get(a, {}).get(c, 0), rows.get(b, {}).get(c, 0)
    if not y or not x:
        return "n/a"
    # Higher is better for throughput and rates; lower for latencies: always print
    # "how many times as good".
    return f"{x / y:.2f}" if not c.endswith(("p50", "p99")) else f"{y / x:.2f}"
print()
print("| ratio (higher is better) | " + " | ".join(cols) + " |")
print("|---" * (len(cols) + 1) + "|")
print("| userspace / haproxy | " + " | ".join(ratio("userspace", "haproxy", c) for c in cols) + " |")
print("| us-copy / haproxy | " + " | ".join(ratio("us-copy", "haproxy", c) for c in cols) + " |")
print("| userspace / haproxy-cap | " + " | ".join(ratio("userspace", "haproxy-cap", c) for c in cols) + " |")
print("| us-10k / userspace | " + " | ".join(ratio("us-10k", "userspace", c) for c in cols) + " |")
if int(sys.argv[2]):
    print(f"\nsvcproxy userspace RSS with 10k Services: {int(sys.argv[2]) / 1024:.0f} MiB")
EOF
