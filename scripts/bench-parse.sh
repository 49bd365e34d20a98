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
python3 scripts/gen-cluster.py "$dir" "$services"
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
