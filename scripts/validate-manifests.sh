#!/usr/bin/env bash
# Validates deploy/ offline, so that a typo in a manifest fails CI:
#
# - every Kubernetes object in deploy/, and in each directory below deploy/ that has a
#   kustomization.yaml (deploy/base, deploy/dns/*), (multi-document YAML) strictly against the
#   API's JSON schemas bundled in kubernetes-validate (PyPI): unknown or misspelt
#   fields, wrong types, and an apiVersion/kind the API does not have all fail. Checked
#   against the newest Kubernetes version the package bundles and against 1.30, the
#   oldest this deploy/ supports;
# - duplicate keys (YAML silently keeps the last one);
# - kustomization.yaml: known fields only, lists exactly the manifests in its directory,
#   and its image override names the image the DaemonSet uses;
# - an overlay (deploy/ebpf, deploy/ipvs: a base with a Component's and its own JSON
#   patches) as what it builds: this script applies the patches itself and validates
#   every resulting object strictly; where kubectl is installed, its kustomize must
#   build the same objects;
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


def kustomization_of(d):
    """The kustomization (or component) of directory `d`, parsed; None without one."""
    for name in ("kustomization.yaml", "kustomization.yml"):
        if (d / name).is_file():
            docs = list(yaml.load_all((d / name).read_text(), Loader=StrictLoader))
            return docs[0] if len(docs) == 1 and isinstance(docs[0], dict) else {}
    return None


def patch_paths(k):
    return [p["path"] for p in (k or {}).get("patches") or [] if isinstance(p, dict) and "path" in p]


def json_patch(doc, ops, where):
    """`doc` with the RFC 6902 operations `ops` (add, replace, remove) applied."""
    import copy
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        kind = op["op"]
        if kind not in ("add", "replace", "remove"):
            raise ValueError(f"{where}: unsupported operation {kind!r}")
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if kind == "add":
                parent.insert(i, op["value"])
            elif kind == "replace":
                parent[i] = op["value"]
            else:
                del parent[i]
        else:
            if kind in ("replace", "remove") and last not in parent:
                raise ValueError(f"{where}: {op['path']} does not exist")
            if kind == "remove":
                del parent[last]
            else:
                parent[last] = op["value"]
    return doc


def apply_patches(d, k, objs):
    for p in (k or {}).get("patches") or []:
        target = p.get("target") or {}
        ops = yaml.load((d / p["path"]).read_text(), Loader=StrictLoader)
        if not isinstance(ops, list) or not all(isinstance(o, dict) and "op" in o and "path" in o for o in ops):
            raise ValueError(f"{d / p['path']}: not a JSON patch (a list of operations with op and path)")
        hits = 0
        for i, o in enumerate(objs):
            if o.get("kind") == target.get("kind") and (o.get("metadata") or {}).get("name") == target.get("name"):
                objs[i] = json_patch(o, ops, str(d / p["path"]))
                hits += 1
        if hits != 1:
            raise ValueError(f"{d / p['path']}: its target {target} matched {hits} objects, not one")
    return objs


def render(d):
    """The objects kustomize builds from directory `d` (resources, components,
    patches, images: what deploy/ uses of it)."""
    k = kustomization_of(d) or {}
    objs = []
    for r in k.get("resources") or []:
        if (d / r).is_dir():
            objs += render(d / r)
        else:
            objs += [x for x in yaml.load_all((d / r).read_text(), Loader=StrictLoader) if x]
    for c in k.get("components") or []:
        objs = apply_patches(d / c, kustomization_of(d / c), objs)
    objs = apply_patches(d, k, objs)
    for img in k.get("images") or []:
        for o in objs:
            pod = ((o.get("spec") or {}).get("template") or {}).get("spec") or {}
            for c in pod.get("containers") or []:
                name, _, tag = c["image"].partition(":")
                if name == img["name"]:
                    c["image"] = f"{img.get('newName', name)}:{img.get('newTag', tag)}"
    return objs


own = kustomization_of(deploy)
# JSON patches (RFC 6902) the kustomization applies are checked as patches below,
# and their results as objects, not as objects themselves.
patch_files = set(patch_paths(own))
for path in files:
    if path.name in patch_files:
        continue
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
        if (k.get("apiVersion"), k.get("kind")) not in (
            ("kustomize.config.k8s.io/v1beta1", "Kustomization"),
            ("kustomize.config.k8s.io/v1alpha1", "Component"),
        ):
            errors.append(f"{path}: expected a Kustomization (kustomize.config.k8s.io/v1beta1) "
                          "or a Component (kustomize.config.k8s.io/v1alpha1)")
        manifests = [m for m in manifests if m not in tool_configs]
        listed = k.get("resources") or []
        for c in k.get("components") or []:
            comp = kustomization_of(deploy / c)
            if comp is None or comp.get("kind") != "Component":
                errors.append(f"{path}: component {c!r} is not a directory with a Component")
        # An overlay names its base directory (which must have a kustomization);
        # the base's images may be overridden here.
        bases = [r for r in listed if (deploy / r).is_dir()]
        for base in bases:
            if not (deploy / base / "kustomization.yaml").is_file():
                errors.append(f"{path}: resource {base!r} is a directory without a kustomization.yaml")
                continue
            for bd in render(deploy / base):
                pod = (((bd or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
                for c in pod.get("containers") or []:
                    if isinstance(c, dict) and isinstance(c.get("image"), str):
                        images.add(c["image"].split("@")[0].rsplit(":", 1)[0])
        for r in sorted(set(listed) - set(manifests) - set(bases)):
            errors.append(f"{path}: resource {r!r} is not a manifest in {deploy}/")
        for r in sorted(set(manifests) - set(listed)):
            errors.append(f"{path}: {r} is not listed in resources")
        for pp in patch_paths(k):
            if not (deploy / pp).is_file():
                errors.append(f"{path}: patch {pp!r} is not a file in {deploy}/")
        # Generated ConfigMaps (the Grafana dashboard): each file exists, and a JSON
        # one parses.
        for gen in k.get("configMapGenerator") or []:
            for key in sorted(set(gen) - {"name", "namespace", "files", "literals", "envs", "behavior", "options"}):
                errors.append(f"{path}: configMapGenerator: unknown field {key!r}")
            for f in gen.get("files") or []:
                src = deploy / str(f).split("=", 1)[-1]
                if not src.is_file():
                    errors.append(f"{path}: configMapGenerator {gen.get('name')!r}: {f!r} is not a file in {deploy}/")
                elif src.suffix == ".json":
                    import json
                    try:
                        json.loads(src.read_text())
                    except ValueError as e:
                        errors.append(f"{path}: {src.name}: not JSON: {e}")
        for img in k.get("images") or []:
            for key in sorted(set(img) - {"name", "newName", "newTag", "digest"}):
                errors.append(f"{path}: images: unknown field {key!r}")
            if not unparsed and img.get("name") not in images:
                errors.append(f"{path}: images: {img.get('name')!r} is not an image the manifests use ({', '.join(sorted(images))})")
        if not any(e.startswith(f"{path}:") for e in errors):
            print(f"ok {path}")



# An overlay (a base with patches or components) is validated as what it builds:
# every object after the patches, strictly, as the manifests above; and where
# kubectl is installed, its kustomize must build the same.
if own is not None and own.get("kind") == "Kustomization" and (own.get("patches") or own.get("components")):
    try:
        built = render(deploy)
    except (ValueError, KeyError, IndexError, yaml.YAMLError) as e:
        errors.append(f"{deploy}: cannot build: {e}")
        built = []
    for doc in built:
        what = f"{deploy} (built): {doc.get('kind')} {(doc.get('metadata') or {}).get('name')}"
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
    import shutil
    import subprocess
    if built and shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", str(deploy)], capture_output=True, text=True)
        if out.returncode != 0:
            errors.append(f"{deploy}: kubectl kustomize failed: {out.stderr.strip()}")
        else:
            theirs = [x for x in yaml.safe_load_all(out.stdout) if x]
            key = lambda o: (o.get("kind"), (o.get("metadata") or {}).get("name"))
            if sorted(theirs, key=key) != sorted(built, key=key):
                errors.append(f"{deploy}: kubectl kustomize builds other objects than this check")
            else:
                print(f"ok {deploy}: kubectl kustomize builds the same objects")

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
dirs=(deploy examples/kind examples/kind/ebpf)
while IFS= read -r d; do dirs+=("$d"); done < <(find deploy -mindepth 2 -name kustomization.yaml -printf '%h\n' | sort)
deferred=$(mktemp -d)
trap 'rm -rf "$deferred"' EXIT
for d in "${dirs[@]}"; do
  "$venv/bin/python" -c "$PROGRAM" "$d" "$OLDEST_SUPPORTED" "$deferred"
done
if [ -n "$(ls -A "$deferred")" ]; then
  bash scripts/validate-monitoring.sh "$deferred"
fi
