#!/usr/bin/env bash
# What one nf_tables commit costs the kernel, by what it changes, on a table of
# svcproxy's nftables layout at scale: the cost model behind the nftables mode's
# layout (docs/benchmarks.md, "What one commit costs the kernel").
#
#   scripts/nft-cost-model.sh [--sizes "30000 100000"] [--repeat 5] [--bin PATH]
#                             [--cluster-cidr CIDR]
#
# As root. For each size: scripts/gen-cluster.py's cluster (N ClusterIP Services x
# 10 endpoints), `svcproxy render` of it (with --cluster-cidr, each Service's chain
# has its masquerade rule, as in a cluster whose pods are told by CIDR) loaded with `nft -f` into a throwaway
# network namespace, plus one fixed "flat" dispatch (a set of service addresses and
# one rule DNATing through a map keyed by address . protocol . port . random slot),
# then each kind of change below committed REPEAT times on its own, each time with
# new names. The figure is the kernel's: the duration of the `sendmsg` that carries
# the transaction (netlink runs the commit in the sender's context), from `strace
# -T`, median of the repeats. `nft`'s own time (its cache listing) is left out.
#
# Changes:
#   data-endpoint  one element into an existing endpoint map (a data map)
#   data-flat      a service in the flat dispatch: 10 map elements and 1 set element
#   link           one verdict map element `goto` an existing service chain
#   chain-plain    a new unlinked chain with a rule without a validating expression
#   chain-dnat     a new unlinked chain with one `dnat` rule
#   service        a service as the nftables mode adds one: chain, 2 rules, 10
#                  endpoint elements, the verdict map element
#
# The table measured is the layout before chainless cluster IP ports (a chain per
# service port, endpoint maps numbered): since d2f3e82 `svcproxy render` serves
# these ClusterIP Services without chains, so pass --bin of a build before it
# (`git worktree add /tmp/old d2f3e82~1 && cargo build --release` there). The
# "data-flat" row is what the chainless layout pays per service added.
#
# Only the namespace is touched; it is deleted at the end, even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

sizes="30000"
repeat=5
bin=target/release/svcproxy
cidr=()
usage() {
    echo "usage: $0 [--sizes \"N ...\"] [--repeat K] [--bin PATH] [--cluster-cidr CIDR]" >&2
    exit 2
}
while [ $# -gt 0 ]; do
    case "$1" in
    --sizes | --repeat | --bin | --cluster-cidr) [ $# -ge 2 ] || usage ;;&
    --sizes) sizes=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --cluster-cidr) cidr=(--cluster-cidr "$2"); shift 2 ;;
    *) usage ;;
    esac
done
[ -x "$bin" ] || { echo "no $bin: cargo build --release (or --bin PATH)" >&2; exit 1; }
for tool in nft strace ip python3; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done

work=$(mktemp -d)
ns=svcp-cost-$$
cleanup() {
    ip netns delete "$ns" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The kernel's time for the transaction in FILE: the longest netlink sendmsg.
commit_ms() {
    ip netns exec "$ns" strace -T -e trace=sendmsg nft -f "$1" 2>&1 >/dev/null |
        awk -F'<' '/sendmsg/ { t = $NF; sub(">", "", t); if (t + 0 > m) m = t + 0 }
                   END { printf "%.2f\n", m * 1000 }'
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for n in $sizes; do
    dir=$work/cluster-$n
    mkdir -p "$dir"
    python3 scripts/gen-cluster.py "$dir" "$n"
    "$bin" render --proxy-mode nftables --manifests "$dir" --hostname-override node-1 \
        ${cidr[@]+"${cidr[@]}"} >"$work/rules.nft"
    ip netns delete "$ns" 2>/dev/null || true
    ip netns add "$ns"
    start=$(date +%s%N)
    ip netns exec "$ns" nft -f "$work/rules.nft"
    load=$(( ($(date +%s%N) - start) / 1000000 ))
    # The flat dispatch, and names the changes reuse.
    python3 - "$work" "$n" "$repeat" "${cidr[1]-}" <<'EOF'
import re, sys
work, n, repeat, cidr = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rules = open(f"{work}/rules.nft").read()
emap = re.search(r"map (endpoint-dnat-tcp-[0-9a-f]+) ", rules)
chain = re.search(r"chain (service-[0-9a-f]+) ", rules)
if not emap or not chain:
    sys.exit("nft-cost-model: the rendered table has no service chain or endpoint map "
             "(chainless cluster IP ports): --bin a build before d2f3e82")
emap, chain = emap.group(1), chain.group(1)
open(f"{work}/flat.nft", "w").write(
    "add map ip svcproxy flat-dnat { typeof ip daddr . meta l4proto . th dport . numgen random mod 10 : ip daddr . tcp dport ; }\n"
    "add set ip svcproxy flat-10 { type ipv4_addr . inet_proto . inet_service ; }\n"
    "add rule ip svcproxy services ip daddr . meta l4proto . th dport @flat-10 "
    "meta l4proto tcp dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 10 map @flat-dnat\n")
eps = lambda r: ", ".join(f"10.250.{r}.{k + 1} . 8080" for k in range(10))
for r in range(repeat):
    vip = f"10.251.{r}.1"
    key = 4_000_000 + r * 10
    c = {
        "data-endpoint": f"add element ip svcproxy {emap} {{ {key} : 10.250.{r}.1 . 8080 }}\n",
        "data-flat": f"add element ip svcproxy flat-dnat {{ "
        + ", ".join(f"{vip} . tcp . 80 . {k} : 10.250.{r}.{k + 1} . 8080" for k in range(10))
        + f" }}\nadd element ip svcproxy flat-10 {{ {vip} . tcp . 80 }}\n",
        "link": f"add element ip svcproxy service-ips {{ 10.252.{r}.1 . tcp . 80 : goto {chain} }}\n",
        "chain-plain": f"add chain ip svcproxy cost-plain-{r}\nadd rule ip svcproxy cost-plain-{r} ip daddr 10.253.{r}.1 counter\n",
        "chain-dnat": f"add chain ip svcproxy cost-dnat-{r}\nadd rule ip svcproxy cost-dnat-{r} meta l4proto tcp dnat ip to 10.250.{r}.1 . 8080\n".replace(" . 8080", ":8080"),
        "service": f"add chain ip svcproxy cost-svc-{r}\n"
        + (f"add rule ip svcproxy cost-svc-{r} ip daddr 10.254.{r}.1 tcp dport 80 ip saddr != {cidr} jump mark-for-masquerade\n" if cidr else "")
        + f"add rule ip svcproxy cost-svc-{r} meta l4proto tcp dnat ip to numgen random mod 10 offset {key + 100} map @{emap}\n"
        f"add element ip svcproxy {emap} {{ "
        + ", ".join(f"{key + 100 + k} : 10.250.{r}.{k + 1} . 8080" for k in range(10))
        + f" }}\nadd element ip svcproxy service-ips {{ 10.254.{r}.1 . tcp . 80 : goto cost-svc-{r} }}\n",
    }
    for kind, text in c.items():
        open(f"{work}/{kind}-{r}.nft", "w").write(text)
EOF
    ip netns exec "$ns" nft -f "$work/flat.nft"
    echo "== $n services x 10 endpoints: $(wc -c <"$work/rules.nft") bytes of rules, loaded in ${load} ms"
    for kind in data-endpoint data-flat link chain-plain chain-dnat service; do
        for r in $(seq 0 $((repeat - 1))); do
            commit_ms "$work/$kind-$r.nft"
        done >"$work/$kind.ms"
        printf '%-14s median %8s ms   (%s)\n' "$kind" "$(median <"$work/$kind.ms")" \
            "$(tr '\n' ' ' <"$work/$kind.ms")"
    done
    ip netns delete "$ns"
done
