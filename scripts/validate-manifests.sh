#!/usr/bin/env bash
# Validates deploy/ offline, so that a typo in a manifest fails CI:
#
# - every Kubernetes object in deploy/*.yaml, and in each directory below deploy/ that
#   has a kustomization.yaml (deploy/dns/*), (multi-document YAML) strictly against the
#   API's JSON schemas bundled in kubernetes-validate (PyPI): unknown or misspelt
#   fields, wrong types, and an apiVersion/kind the API does not have all fail. Checked
#   against the newest Kubernetes version the package bundles and against 1.30, the
#   oldest this deploy/ supports;
# - duplicate keys (YAML silently keeps the last one);
# - kustomization.yaml: known fields only, lists exactly the manifests in deploy/, and
#   its image override names the image the DaemonSet uses;
# - the Prometheus Operator's objects (deploy/monitoring: ServiceMonitor,
#   PrometheusRule) against its schemas, from @kubernetes-models/prometheus-operator
#   (npm): its validators check types, enums and required fields, and TypeScript's
#   compiler, given each object as a literal of the package's type, refuses unknown
#   fields; a PrometheusRule's rules are also checked by promtool (Debian's
#   prometheus, which scripts/install-deps.sh --tests installs).
#
# The embedded KubeProxyConfiguration is checked by svcproxy's own parser in
# crates/svcproxy/tests/deploy.rs (cargo test), not here.
#
# The validators are installed once, pinned, under ${XDG_CACHE_HOME:-~/.cache}/svcproxy
# (a virtualenv, override SVCPROXY_VALIDATE_VENV; an npm prefix, override
# SVCPROXY_VALIDATE_NPM); later runs reuse them and need no network at all.
set -euo pipefail
cd "$(dirname "$0")/.."

# kubernetes-validate and its dependencies, pinned.
REQUIREMENTS='kubernetes-validate==1.37.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
referencing==0.37.0
rpds-py==2026.9.1
attrs==26.1.0
PyYAML==6.0.3
packaging==26.3
importlib_resources==7.1.0
typing_extensions==4.16.0'
OLDEST_SUPPORTED=1.30

venv=${SVCPROXY_VALIDATE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/svcproxy/validate-manifests-venv}
stamp="$venv/.svcproxy-requirements"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$REQUIREMENTS" ]; then
  echo "validate-manifests: installing kubernetes-validate into $venv" >&2
  rm -rf "$venv"
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
  printf '%s\n' "$REQUIREMENTS" >"$venv/requirements.txt"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-input \
    -r "$venv/requirements.txt"
  printf '%s' "$REQUIREMENTS" >"$stamp"
fi

PROGRAM=$(cat <<'PY'
import json
import pathlib
import sys

import yaml
from kubernetes_validate import utils as kv
from packaging.version import Version

deploy = pathlib.Path(sys.argv[1])
oldest = sys.argv[2]
# The Prometheus Operator's objects go to the npm validator (see the header).
deferred_dir = pathlib.Path(sys.argv[3])
newest = kv.latest_version()
if Version(newest) < Version(oldest):
    sys.exit(f"validate-manifests: kubernetes-validate bundles schemas up to {newest} only")
versions = sorted({kv.major_minor(newest), oldest}, key=Version)


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""


def construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep)


StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)

errors = []
checked = 0
manifests = []
tool_configs = set()
kustomization = None
images = set()
files = sorted(p for p in deploy.iterdir() if p.suffix in (".yaml", ".yml"))
unparsed = False
for path in files:
    is_kustomization = path.name in ("kustomization.yaml", "kustomization.yml")
    if not is_kustomization:
        manifests.append(path.name)
    try:
        docs = [d for d in yaml.load_all(path.read_text(), Loader=StrictLoader) if d is not None]
    except yaml.YAMLError as e:
        errors.append(f"{path}: {e}")
        unparsed = True
        continue
    if is_kustomization:
        kustomization = (path, docs)
        continue
    if not docs:
        errors.append(f"{path}: no Kubernetes objects")
    for i, doc in enumerate(docs):
        where = f"{path} (document {i + 1})"
        if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
            errors.append(f"{where}: not a Kubernetes object (apiVersion and kind required)")
            continue
        if str(doc["apiVersion"]).startswith("kind.x-k8s.io/"):
            # kind's own cluster config (examples/kind): not an API object, and not
            # a resource of the kustomization.
            tool_configs.add(path.name)
            print(f"ok {path}: kind {doc['kind']} (kind's configuration, not an API object)")
            continue
        name = (doc.get("metadata") or {}).get("name")
        if not name:
            errors.append(f"{where}: metadata.name is required")
            continue
        what = f"{path}: {doc['kind']} {name}"
        if str(doc["apiVersion"]).startswith("monitoring.coreos.com/"):
            out = deferred_dir / f"{len(list(deferred_dir.iterdir())):03d}.json"
            out.write_text(json.dumps({"file": str(path), "object": doc}))
            continue
        pod = ((doc.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in pod.get("containers") or []:
            if isinstance(c, dict) and isinstance(c.get("image"), str):
                images.add(c["image"].split("@")[0].rsplit(":", 1)[0])
        before = len(errors)
        for version in versions:
            try:
                kv.validate(doc, version, strict=True)
                checked += 1
            except kv.ValidationError as e:
                errors.append(f"{what}: Kubernetes {e.version}: "
                              f"{'.'.join(str(p) for p in e.path) or '(root)'}: {e.message}")
            except kv.SchemaNotFoundError as e:
                errors.append(f"{what}: Kubernetes {version} has no {e.kind} in {e.api_version}")
        if len(errors) == before:
            print(f"ok {what} (Kubernetes {', '.join(versions)})")

if kustomization is None and not unparsed:
    errors.append(f"{deploy}/kustomization.yaml is missing")
elif kustomization is not None:
    path, docs = kustomization
    k = docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else None
    if k is None:
        errors.append(f"{path}: expected one Kustomization")
    else:
        known = {"apiVersion", "kind", "resources", "images", "namespace", "labels",
                 "commonLabels", "commonAnnotations", "patches", "configMapGenerator",
                 "secretGenerator", "generatorOptions", "components", "replicas", "namePrefix",
                 "nameSuffix", "buildMetadata"}
        for key in sorted(set(k) - known):
            errors.append(f"{path}: unknown field {key!r}")
        if (k.get("apiVersion"), k.get("kind")) != ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
            errors.append(f"{path}: expected apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization")
        manifests = [m for m in manifests if m not in tool_configs]
        listed = k.get("resources") or []
        # An overlay names its base directory (which must have a kustomization);
        # the base's images may be overridden here.
        bases = [r for r in listed if (deploy / r).is_dir()]
        for base in bases:
            if not (deploy / base / "kustomization.yaml").is_file():
                errors.append(f"{path}: resource {base!r} is a directory without a kustomization.yaml")
                continue
            for bp in sorted((deploy / base).glob("*.yaml")):
                for bd in yaml.load_all(bp.read_text(), Loader=StrictLoader):
                    pod = (((bd or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                    for c in pod.get("containers") or []:
                        if isinstance(c, dict) and isinstance(c.get("image"), str):
                            images.add(c["image"].split("@")[0].rsplit(":", 1)[0])
        for r in sorted(set(listed) - set(manifests) - set(bases)):
            errors.append(f"{path}: resource {r!r} is not a manifest in {deploy}/")
        for r in sorted(set(manifests) - set(listed)):
            errors.append(f"{path}: {r} is not listed in resources")
        for img in k.get("images") or []:
            for key in sorted(set(img) - {"name", "newName", "newTag", "digest"}):
                errors.append(f"{path}: images: unknown field {key!r}")
            if not unparsed and img.get("name") not in images:
                errors.append(f"{path}: images: {img.get('name')!r} is not an image the manifests use ({', '.join(sorted(images))})")
        if not any(e.startswith(f"{path}:") for e in errors):
            print(f"ok {path}")

for e in errors:
    print(f"ERROR {e}", file=sys.stderr)
if errors:
    sys.exit(f"validate-manifests: {len(errors)} error(s)")
print(f"validate-manifests: {deploy}: {checked} object validations passed (strict, Kubernetes {', '.join(versions)})")
PY
)
# deploy/ itself (the proxy), every kustomization below it (the cluster DNS's
# node-local and central shapes, the monitoring objects), and the kind example's
# overlay of deploy/, each checked as a whole.
dirs=(deploy examples/kind)
while IFS= read -r d; do dirs+=("$d"); done < <(find deploy -mindepth 2 -name kustomization.yaml -printf '%h\n' | sort)
deferred=$(mktemp -d)
trap 'rm -rf "$deferred"' EXIT
for d in "${dirs[@]}"; do
  "$venv/bin/python" -c "$PROGRAM" "$d" "$OLDEST_SUPPORTED" "$deferred"
done
if [ -n "$(ls -A "$deferred")" ]; then
  bash scripts/validate-monitoring.sh "$deferred"
fi
