#!/usr/bin/env bash
# Validates the Prometheus Operator's objects that scripts/validate-manifests.sh set
# aside (DIR: one JSON file each, {"file": ..., "object": ...}):
#
# - against the operator's schemas, from @kubernetes-models/prometheus-operator (npm,
#   generated from the operator's CRDs): its validators check types, enums, patterns
#   and required fields;
# - for unknown or misspelt fields, which those validators let through: each object
#   is written as a TypeScript literal of the package's type and compiled, and
#   TypeScript refuses a property the type does not have;
# - a PrometheusRule's groups with `promtool check rules` (PromQL syntax, templates,
#   durations).
#
# The npm packages are installed once, pinned, under
# ${XDG_CACHE_HOME:-~/.cache}/svcproxy/validate-monitoring-npm (override:
# SVCPROXY_VALIDATE_NPM); later runs need no network.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: validate-monitoring.sh DIR}

PACKAGES='@kubernetes-models/prometheus-operator@6.0.0 typescript@5.9.3'
prefix=${SVCPROXY_VALIDATE_NPM:-${XDG_CACHE_HOME:-$HOME/.cache}/svcproxy/validate-monitoring-npm}
for tool in node npm promtool; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "validate-monitoring: $tool not found (node and npm: Debian's nodejs and npm;" \
      "promtool: scripts/install-deps.sh --tests)" >&2
    exit 1
  fi
done
stamp="$prefix/.svcproxy-packages"
if [ ! -d "$prefix/node_modules" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$PACKAGES" ]; then
  echo "validate-monitoring: installing $PACKAGES into $prefix" >&2
  rm -rf "$prefix"
  mkdir -p "$prefix"
  # shellcheck disable=SC2086
  (cd "$prefix" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund $PACKAGES)
  printf '%s' "$PACKAGES" >"$stamp"
fi

work=$(mktemp -d "$prefix/check-XXXXXX")
trap 'rm -rf "$work"' EXIT

# Schema validation, and the TypeScript source and rule files for the next steps.
cat >"$work/validate.mjs" <<'JS'
import fs from "node:fs";
import path from "node:path";
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const [dir, work] = process.argv.slice(2);
const kinds = { ServiceMonitor: v1.ServiceMonitor, PrometheusRule: v1.PrometheusRule };
let errors = 0;
const ts = [];
const rules = [];
for (const name of fs.readdirSync(dir).sort()) {
  const { file, object } = JSON.parse(fs.readFileSync(path.join(dir, name), "utf8"));
  const what = `${file}: ${object.kind} ${object.metadata?.name}`;
  const Model = object.apiVersion === "monitoring.coreos.com/v1" && kinds[object.kind];
  if (!Model) {
    console.error(`ERROR ${what}: not a kind this check knows (${object.apiVersion} ${object.kind})`);
    errors++;
    continue;
  }
  try {
    new Model(object).validate();
  } catch (e) {
    console.error(`ERROR ${what}: ${e.message}`);
    errors++;
    continue;
  }
  const i = ts.length;
  ts.push(
    `import type { I${object.kind} as T${i} } from ` +
      `"@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${object.kind}";\n` +
      `// ${what}\nexport const o${i}: T${i} = ${JSON.stringify(object, null, 2)};\n`,
  );
  if (object.kind === "PrometheusRule") {
    const out = path.join(work, `rules-${i}.json`);
    fs.writeFileSync(out, JSON.stringify({ groups: object.spec.groups }));
    rules.push(`${out}\t${what}`);
  }
  console.log(`ok ${what} (schema)`);
}
fs.writeFileSync(path.join(work, "objects.ts"), ts.join("\n"));
fs.writeFileSync(path.join(work, "rules.tsv"), rules.join("\n"));
process.exit(errors ? 1 : 0);
JS
cat >"$work/tsconfig.json" <<'JSON'
{
  "compilerOptions": {
    "strict": true,
    "noEmit": true,
    "module": "nodenext",
    "moduleResolution": "nodenext",
    "target": "es2022",
    "skipLibCheck": true
  },
  "files": ["objects.ts"]
}
JSON
ln -s "$prefix/node_modules" "$work/node_modules"
node "$work/validate.mjs" "$dir" "$work"
if ! "$prefix/node_modules/.bin/tsc" -p "$work/tsconfig.json" >"$work/tsc.out"; then
  # Point at the object, not at the generated file's line.
  sed 's/^/ERROR (unknown or mistyped field) /' "$work/tsc.out" >&2
  grep -n '^// ' "$work/objects.ts" >&2
  exit 1
fi
echo "ok: no unknown fields (TypeScript against the operator's types)"
while IFS=$'\t' read -r file what || [ -n "$file" ]; do
  [ -n "$file" ] || continue
  # promtool reads YAML, of which JSON is a subset.
  if ! out=$(promtool check rules "$file" 2>&1); then
    echo "ERROR $what: promtool check rules:" >&2
    echo "$out" >&2
    exit 1
  fi
  echo "ok $what (promtool: $(echo "$out" | grep -o 'SUCCESS: [0-9]* rules found' | head -1))"
done <"$work/rules.tsv"
