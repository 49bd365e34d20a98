#!/usr/bin/env bash
# Reading a manifests directory of block-style YAML: SERVICES Services with 10
# endpoints each (one EndpointSlice each), 100 Services to a file, 10 Nodes, read by
# `svcproxy snapshot --manifests DIR --format json` (parse, convert, snapshot,
# print; no kernel), each binary given run ROUNDS times, alternately; prints each
# run's wall time and peak RSS, then each binary's median. Compare two builds in the
# same run (e.g. before and after a parser change):
#   ./scripts/bench-parse.sh [SERVICES] [ROUNDS] BINARY...
# (default: 10000 services, 5 rounds, target/release/svcproxy, built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
services=${1:-10000}
rounds=${2:-5}
shift $(( $# >= 2 ? 2 : $# ))
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  [ -x target/release/svcproxy ] || cargo build --release --locked -p svcproxy >&2
  bins=(target/release/svcproxy)
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/svcproxy-parse.XXXXXX")
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" "$services" <<'PY'
import sys
d, n = sys.argv[1], int(sys.argv[2])
per = 100
def service(i):
    a, b = (i >> 8) & 255, i & 255
    return f"""apiVersion: v1
kind: Service
metadata:
  name: svc-{i}
  namespace: bench
  labels:
    app: svc-{i}
spec:
  type: ClusterIP
  clusterIP: 10.96.{a}.{b}
  clusterIPs:
  - 10.96.{a}.{b}
  ipFamilies:
  - IPv4
  selector:
    app: svc-{i}
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
"""
def endpoint(i, e):
    return f"""- addresses:
  - 10.{100 + i % 100}.{(i // 100) % 256}.{e + 1}
  conditions:
    ready: true
    serving: true
    terminating: false
  nodeName: node-{e}
  zone: zone-{e % 3}
"""
def slice_(i):
    eps = "".join(endpoint(i, e) for e in range(10))
    return f"""apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: svc-{i}-abcde
  namespace: bench
  labels:
    kubernetes.io/service-name: svc-{i}
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
{eps}"""
for f in range((n + per - 1) // per):
    docs = []
    for i in range(f * per, min(n, (f + 1) * per)):
        docs += [service(i), slice_(i)]
    open(f"{d}/svc-{f:04d}.yaml", "w").write("---\n".join(docs))
nodes = [f"""apiVersion: v1
kind: Node
metadata:
  name: node-{e}
  labels:
    topology.kubernetes.io/zone: zone-{e % 3}
""" for e in range(10)]
open(f"{d}/nodes.yaml", "w").write("---\n".join(nodes))
PY
echo "$services services x 10 endpoints, $(du -sh "$dir" | cut -f1) of YAML; $rounds rounds" >&2
declare -A times
for _ in $(seq "$rounds"); do
  for bin in "${bins[@]}"; do
    /usr/bin/time -o "$dir/time" -f "%e %M" "$bin" snapshot --manifests "$dir" \
      --hostname-override node-1 --format json >/dev/null 2>/dev/null
    out=$(tail -n 1 "$dir/time")
    echo "$bin: ${out% *} s, peak RSS $(( ${out#* } / 1024 )) MiB"
    times[$bin]+="${out% *} "
  done
done
for bin in "${bins[@]}"; do
  median=$(printf '%s\n' ${times[$bin]} | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  echo "$bin: median $median s"
done
