//! The manifests in `deploy/` against svcproxy itself, in each of its shapes: `deploy/`
//! (nftables mode, the objects of `deploy/base`), `deploy/ebpf` and `deploy/ipvs` (the
//! same with the eBPF data plane's component and their own configuration, built here
//! by applying their JSON patches as kustomize does).
//!
//! `scripts/validate-manifests.sh` checks them against the Kubernetes API schemas, but
//! those do not cover the KubeProxyConfiguration embedded in the ConfigMap, nor whether
//! the DaemonSet agrees with it. Here: the embedded config goes through the real binary
//! (strict parsing, resolution, a full render) without a warning, and the DaemonSet
//! mounts it where `--config` looks, probes the port `healthzBindAddress` binds, and
//! runs with the identity and least privileges the mode needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize as _;
use yaml_serde::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// deploy/'s shapes: the directory `kubectl apply -k` takes, and the mode its
/// configuration runs.
const SHAPES: [(&str, &str); 3] = [
    ("deploy", "nftables"),
    ("deploy/ebpf", "ebpf"),
    ("deploy/ipvs", "ipvs"),
];

/// Every document of a YAML file (multi-document), nulls left out.
fn documents(path: &Path) -> Vec<Value> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .filter(|v| !v.is_null())
        .collect()
}

/// `doc` with the RFC 6902 operations `ops` (add, replace, remove) applied, as
/// kustomize applies a JSON patch.
fn json_patch(doc: &mut Value, ops: &Value, what: &str) {
    for op in seq(ops, what) {
        let path = str_of(&op["path"], "a patch's path");
        let parts: Vec<String> = path
            .split('/')
            .skip(1)
            .map(|p| p.replace("~1", "/").replace("~0", "~"))
            .collect();
        let (last, init) = parts.split_last().expect("a path below the root");
        let mut parent = &mut *doc;
        for p in init {
            parent = match parent {
                Value::Sequence(s) => &mut s[p.parse::<usize>().unwrap()],
                v => v
                    .get_mut(p.as_str())
                    .unwrap_or_else(|| panic!("{what}: {path}: no {p:?}")),
            };
        }
        let value = op["value"].clone();
        match (str_of(&op["op"], "a patch's op"), parent) {
            ("add", Value::Sequence(s)) if last == "-" => s.push(value),
            ("add", Value::Sequence(s)) => s.insert(last.parse().unwrap(), value),
            ("replace", Value::Sequence(s)) => s[last.parse::<usize>().unwrap()] = value,
            ("remove", Value::Sequence(s)) => {
                s.remove(last.parse().unwrap());
            }
            ("add" | "replace", Value::Mapping(m)) => {
                m.insert(Value::String(last.clone()), value);
            }
            ("remove", Value::Mapping(m)) => {
                m.remove(last.as_str());
            }
            (o, v) => panic!("{what}: {path}: cannot {o} in {v:?}"),
        }
    }
}

/// A kustomization's (or component's) JSON patches applied to `objects`: each
/// patch to the one object its target names.
fn apply_patches(dir: &Path, objects: &mut [Value]) {
    let k = documents(&dir.join("kustomization.yaml")).remove(0);
    for p in k["patches"].as_sequence().into_iter().flatten() {
        let file = dir.join(str_of(&p["path"], "patches[].path"));
        let ops = documents(&file).remove(0);
        let targets: Vec<&mut Value> = objects
            .iter_mut()
            .filter(|o| {
                o["kind"] == p["target"]["kind"] && o["metadata"]["name"] == p["target"]["name"]
            })
            .collect();
        assert_eq!(targets.len(), 1, "{}: one target", file.display());
        for t in targets {
            json_patch(t, &ops, &file.display().to_string());
        }
    }
}

/// Every object `kubectl apply -k DIR` applies (`dir` relative to the repository):
/// its resources (files, or directories built alike), then its components'
/// patches and its own.
fn objects_of(dir: &str) -> Vec<Value> {
    let dir = repo().join(dir);
    let k = documents(&dir.join("kustomization.yaml")).remove(0);
    let mut objects = Vec::new();
    for r in strings(&k["resources"], "resources") {
        let path = dir.join(&r);
        if path.is_dir() {
            let rel = path
                .strip_prefix(repo())
                .unwrap()
                .to_string_lossy()
                .into_owned();
            objects.extend(objects_of(&rel));
        } else {
            objects.extend(documents(&path));
        }
    }
    for c in k["components"].as_sequence().into_iter().flatten() {
        apply_patches(&dir.join(str_of(c, "components[]")), &mut objects);
    }
    apply_patches(&dir, &mut objects);
    objects
}

/// The one object of `kind` that `shape` applies.
fn the_in(shape: &str, kind: &str) -> Value {
    let found: Vec<Value> = objects_of(shape)
        .into_iter()
        .filter(|v| v["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} in {shape}");
    found.into_iter().next().unwrap()
}

/// The one object of `kind` in deploy/ (nftables mode).
fn the(kind: &str) -> Value {
    the_in("deploy", kind)
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v:?}"))
}

fn seq<'a>(v: &'a Value, what: &str) -> &'a [Value] {
    v.as_sequence()
        .map(Vec::as_slice)
        .unwrap_or_else(|| panic!("{what}: expected a list, got {v:?}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    seq(v, what)
        .iter()
        .map(|s| str_of(s, what).to_string())
        .collect()
}

fn container(ds: &Value) -> &Value {
    let cs = seq(&ds["spec"]["template"]["spec"]["containers"], "containers");
    assert_eq!(cs.len(), 1, "the DaemonSet should run one container");
    &cs[0]
}

/// The value of `--NAME=VALUE` or `--NAME VALUE` in the container's command line.
fn flag(c: &Value, name: &str) -> Option<String> {
    let mut argv = Vec::new();
    for key in ["command", "args"] {
        if !c[key].is_null() {
            argv.extend(strings(&c[key], key));
        }
    }
    let long = format!("--{name}");
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            return Some(v.to_string());
        }
        if *a == long {
            return it.next().cloned();
        }
    }
    None
}

/// The ConfigMap key the DaemonSet's `--config` reads, with the ConfigMap: the path
/// must be inside a read-only mount of a volume built from that ConfigMap.
fn mounted_config(shape: &str, ds: &Value) -> (Value, String) {
    let c = container(ds);
    let config = flag(c, "config").expect("the DaemonSet passes no --config");
    let config = Path::new(&config);
    let pod = &ds["spec"]["template"]["spec"];
    for m in seq(&c["volumeMounts"], "volumeMounts") {
        let mount = Path::new(str_of(&m["mountPath"], "mountPath"));
        let Ok(rel) = config.strip_prefix(mount) else {
            continue;
        };
        let rel = rel.to_str().unwrap().to_string();
        assert_eq!(m["readOnly"], true, "the config mount should be read-only");
        let vol_name = &m["name"];
        let vol = seq(&pod["volumes"], "volumes")
            .iter()
            .find(|v| v["name"] == *vol_name)
            .unwrap_or_else(|| panic!("volumeMount {vol_name:?} has no volume"));
        let cm_name = str_of(&vol["configMap"]["name"], "volume's configMap.name");
        let cm = the_in(shape, "ConfigMap");
        assert_eq!(
            cm["metadata"]["name"], cm_name,
            "the config volume names ConfigMap {cm_name:?}, {shape} has another"
        );
        // A volume with `items` maps keys to paths; without, each key is a file.
        let key = match vol["configMap"]["items"].as_sequence() {
            Some(items) => str_of(
                &items
                    .iter()
                    .find(|i| i["path"] == rel.as_str())
                    .unwrap_or_else(|| panic!("no configMap item has path {rel:?}"))["key"],
                "items[].key",
            )
            .to_string(),
            None => rel,
        };
        assert!(
            cm["data"][key.as_str()].is_string(),
            "--config={} reads key {key:?}, which ConfigMap {cm_name} does not have",
            config.display()
        );
        return (cm, key);
    }
    panic!(
        "--config={} is not inside any volumeMount",
        config.display()
    );
}

/// The embedded KubeProxyConfiguration's text, as `shape` applies it.
fn config_text(shape: &str) -> String {
    let (cm, key) = mounted_config(shape, &the_in(shape, "DaemonSet"));
    str_of(&cm["data"][key.as_str()], "config").to_string()
}

/// The port `healthzBindAddress` binds (kube-proxy's rules: empty means 0.0.0.0:10256,
/// a bare IP means port 10256), and whether it binds a loopback address.
fn healthz_bind(config: &Value) -> (String, u16) {
    let addr = config["healthzBindAddress"].as_str().unwrap_or("");
    if addr.is_empty() {
        return ("0.0.0.0".into(), 10256);
    }
    if let Ok(sa) = addr.parse::<std::net::SocketAddr>() {
        return (sa.ip().to_string(), sa.port());
    }
    let ip: std::net::IpAddr = addr
        .parse()
        .unwrap_or_else(|_| panic!("healthzBindAddress {addr:?} is not IP[:PORT]"));
    (ip.to_string(), 10256)
}

#[test]
fn configmap_config_is_accepted_by_svcproxy_without_warnings() {
    for (shape, mode) in SHAPES {
        let text = config_text(shape);
        let config: Value = yaml_serde::from_str(&text).unwrap();
        assert_eq!(
            config["mode"], mode,
            "{shape}'s configuration runs {mode} mode"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_svcproxy"))
            .current_dir(repo())
            .arg("render")
            .arg("--config")
            .arg(&file)
            .args(["--hostname-override", "node-a"])
            .args(["--manifests", "examples/cluster"])
            // The verbosity the config asks for, not the developer's.
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "svcproxy render with {shape}'s config failed ({}):\n{stderr}",
            out.status
        );
        let complaints: Vec<&str> = stderr
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("warn") || l.contains("unknown") || l.contains("ignor")
            })
            .collect();
        assert!(
            complaints.is_empty(),
            "svcproxy complains about {shape}'s config:\n{}",
            complaints.join("\n")
        );
        // The mode's own render: nftables' ruleset, the eBPF maps' contents (with
        // ipvs mode's round robin).
        let rendered = match mode {
            "nftables" => stdout.contains("table ip svcproxy"),
            "ipvs" => stdout.contains("service ") && stdout.contains(" [rr]"),
            _ => stdout.contains("service 198.19.0.10:80/tcp"),
        };
        assert!(
            rendered,
            "{shape}: render printed no {mode} plan:\n{stdout}"
        );
    }
}

/// ebpf's and ipvs's configurations are deploy/'s but for what their mode reads:
/// the mode, and in ipvs mode the iptables and ipvs sections (upstream's ipvs mode
/// reads its masquerade settings and sync periods there) in place of nftables'.
#[test]
fn the_modes_configurations_differ_from_deploys_only_where_their_mode_reads() {
    let strip = |shape: &str| -> Value {
        let mut v: Value = yaml_serde::from_str(&config_text(shape)).unwrap();
        let m = v.as_mapping_mut().unwrap();
        for key in ["mode", "nftables", "iptables", "ipvs"] {
            m.remove(key);
        }
        v
    };
    let base = strip("deploy");
    for (shape, _) in &SHAPES[1..] {
        assert_eq!(
            strip(shape),
            base,
            "{shape}'s configuration drifted from deploy/'s"
        );
    }
    let ipvs: Value = yaml_serde::from_str(&config_text("deploy/ipvs")).unwrap();
    let nft: Value = yaml_serde::from_str(&config_text("deploy")).unwrap();
    for key in ["masqueradeAll", "masqueradeBit"] {
        assert_eq!(
            ipvs["iptables"][key], nft["nftables"][key],
            "ipvs mode's {key}"
        );
    }
    for key in ["syncPeriod", "minSyncPeriod"] {
        assert_eq!(ipvs["ipvs"][key], nft["nftables"][key], "ipvs mode's {key}");
    }
}

#[test]
fn configmap_config_leaves_conntrack_sysctls_alone() {
    // Without privileges /proc/sys is read-only in the container: a config that asks
    // for conntrack tuning would fail (or warn) on every start.
    for (shape, _) in SHAPES {
        let config: Value = yaml_serde::from_str(&config_text(shape)).unwrap();
        let ct = &config["conntrack"];
        assert_eq!(ct["maxPerCore"], 0, "conntrack.maxPerCore must be 0");
        for field in [
            "tcpEstablishedTimeout",
            "tcpCloseWaitTimeout",
            "udpTimeout",
            "udpStreamTimeout",
        ] {
            assert_eq!(ct[field], "0s", "conntrack.{field} must be 0s");
        }
        assert_ne!(
            ct["tcpBeLiberal"], true,
            "conntrack.tcpBeLiberal writes a sysctl"
        );
    }
}

#[test]
fn daemonset_agrees_with_configmap() {
    for (shape, _) in SHAPES {
        daemonset_agrees_with_configmap_in(shape);
    }
}

fn daemonset_agrees_with_configmap_in(shape: &str) {
    let ds = the_in(shape, "DaemonSet");
    let c = container(&ds);
    let config: Value = yaml_serde::from_str(&config_text(shape)).unwrap();

    // The node name from the downward API.
    assert_eq!(
        flag(c, "hostname-override").as_deref(),
        Some("$(NODE_NAME)")
    );
    let node_name = seq(&c["env"], "env")
        .iter()
        .find(|e| e["name"] == "NODE_NAME")
        .expect("no NODE_NAME env");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    // Flags the config file replaces would be ignored (with a warning): keep them out.
    for f in [
        "healthz-bind-address",
        "metrics-bind-address",
        "proxy-mode",
        "cluster-cidr",
    ] {
        assert_eq!(
            flag(c, f),
            None,
            "--{f} is ignored with --config; set it in the ConfigMap"
        );
    }

    // The probes hit the health server where the config binds it.
    let (ip, port) = healthz_bind(&config);
    let loopback = ip.parse::<std::net::IpAddr>().unwrap().is_loopback();
    assert!(
        !loopback,
        "healthzBindAddress {ip} is unreachable by the kubelet's probes"
    );
    let port_of = |probe: &Value, what: &str| -> u16 {
        let p = &probe["httpGet"]["port"];
        if let Some(n) = p.as_u64() {
            return n as u16;
        }
        let name = str_of(p, what);
        let named = seq(&c["ports"], "ports")
            .iter()
            .find(|cp| cp["name"] == name)
            .unwrap_or_else(|| panic!("{what}: no container port named {name:?}"));
        named["containerPort"].as_u64().unwrap() as u16
    };
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/healthz")] {
        let p = &c[probe];
        assert_eq!(p["httpGet"]["path"], path, "{probe} path");
        assert_eq!(
            port_of(p, probe),
            port,
            "{probe} probes a port that healthzBindAddress ({ip}:{port}) does not bind"
        );
        assert!(
            p["httpGet"]["scheme"].is_null() || p["httpGet"]["scheme"] == "HTTP",
            "{probe}: the health server speaks plain HTTP"
        );
    }
    for cp in c["ports"].as_sequence().into_iter().flatten() {
        if cp["name"] == "healthz" {
            assert_eq!(cp["containerPort"].as_u64(), Some(port.into()));
        }
    }
}

#[test]
fn daemonset_rolls_with_a_surge_pod_that_can_be_scheduled_beside_the_old_one() {
    let ds = the("DaemonSet");
    let rolling = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    // The new pod stands by beside the old one, which hands over at SIGTERM.
    assert_eq!(rolling["maxSurge"].as_u64(), Some(1), "{rolling:?}");
    assert_eq!(rolling["maxUnavailable"].as_u64(), Some(0), "{rolling:?}");
    // In a hostNetwork pod every declared port is a hostPort: the scheduler would
    // keep the surge pod off a node whose old pod holds it.
    let c = container(&ds);
    assert!(
        c["ports"].as_sequence().is_none_or(Vec::is_empty),
        "declared ports block the surge pod: {:?}",
        c["ports"]
    );
    // Long enough for the hand-over's wait (20 s) and the userspace mode's drain
    // (25 s) before the SIGKILL.
    let grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap_or(30);
    assert!(grace >= 45, "terminationGracePeriodSeconds {grace}");
}

#[test]
fn daemonset_runs_as_its_service_account_with_only_network_privileges() {
    let ds = the("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let c = container(&ds);
    assert_eq!(
        pod["hostNetwork"], true,
        "the rules live in the node's netns"
    );

    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    let mut add = strings(&sc["capabilities"]["add"], "capabilities.add");
    add.sort();
    assert_eq!(add, ["NET_ADMIN", "NET_RAW"]);
    assert_eq!(
        strings(&sc["capabilities"]["drop"], "capabilities.drop"),
        ["ALL"]
    );
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    // What operations.rs's runs_with_only_the_daemonsets_privileges emulates.
    for v in seq(&pod["volumes"], "volumes") {
        assert!(v["hostPath"].is_null(), "no host paths are needed: {v:?}");
    }
    ebpf_shapes_add_only_what_the_data_plane_needs(&ds);

    // The ServiceAccount exists and is what the ClusterRoleBinding binds.
    let sa_name = str_of(&pod["serviceAccountName"], "serviceAccountName");
    let sa = the("ServiceAccount");
    assert_eq!(sa["metadata"]["name"], sa_name);
    assert_eq!(sa["metadata"]["namespace"], ds["metadata"]["namespace"]);
    let crb = the("ClusterRoleBinding");
    assert!(seq(&crb["subjects"], "subjects").iter().any(|s| {
        s["kind"] == "ServiceAccount"
            && s["name"] == sa_name
            && s["namespace"] == ds["metadata"]["namespace"]
    }));
    let role = the("ClusterRole");
    assert_eq!(crb["roleRef"]["name"], role["metadata"]["name"]);

    // And the role lets it read what the API source watches.
    let allows = |group: &str, resource: &str, verb: &str| {
        seq(&role["rules"], "rules").iter().any(|r| {
            strings(&r["apiGroups"], "apiGroups")
                .iter()
                .any(|g| g == group)
                && strings(&r["resources"], "resources")
                    .iter()
                    .any(|x| x == resource)
                && strings(&r["verbs"], "verbs").iter().any(|v| v == verb)
        })
    };
    for (group, resource) in [
        ("", "services"),
        ("", "nodes"),
        ("discovery.k8s.io", "endpointslices"),
        ("networking.k8s.io", "servicecidrs"),
    ] {
        for verb in ["get", "list", "watch"] {
            assert!(
                allows(group, resource, verb),
                "cannot {verb} {group}/{resource}"
            );
        }
    }
    for group in ["", "events.k8s.io"] {
        for verb in ["create", "patch"] {
            assert!(
                allows(group, "events", verb),
                "cannot {verb} {group}/events"
            );
        }
    }
}

/// The objects of one of deploy/dns/'s shapes, by kind.
fn dns_shape(shape: &str) -> Vec<Value> {
    let dir = repo().join("deploy/dns").join(shape);
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_stem().is_some_and(|s| s != "kustomization"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap();
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    out
}

/// deploy/dns/node-local and deploy/dns/central: the DNS container's command line
/// starts the real binary (on the example manifests, loopback addresses swapped in)
/// without a warning; probes and ports agree with its flags; the RBAC reads Pods
/// exactly when the server places clients by their Pods (no --dns-node-local).
#[test]
fn dns_shapes_start_and_agree_with_their_rbac_and_probes() {
    for shape in ["node-local", "central"] {
        let objects = dns_shape(shape);
        let workload = objects
            .iter()
            .find(|v| v["kind"] == "DaemonSet" || v["kind"] == "Deployment")
            .unwrap_or_else(|| panic!("{shape}: no workload"));
        let c = container(workload);
        let args: Vec<String> = strings(&c["args"], "args")
            .into_iter()
            .map(|a| a.replace("$(NODE_NAME)", "node-a"))
            .collect();
        assert_eq!(args[0], "dns", "{shape}: runs `svcproxy dns`");
        let node_local = args.iter().any(|a| a == "--dns-node-local");
        assert_eq!(node_local, shape == "node-local", "{shape}");
        // Probes hit the healthz port the flags bind.
        let healthz = flag(c, "healthz-bind-address").expect("--healthz-bind-address");
        let port: u64 = healthz.rsplit(':').next().unwrap().parse().unwrap();
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(
                c[probe]["httpGet"]["port"].as_u64(),
                Some(port),
                "{shape} {probe}"
            );
        }
        let dns_port = flag(c, "dns-bind-address").expect("--dns-bind-address");
        assert!(dns_port.ends_with(":53"), "{shape}: {dns_port}");
        let ports: Vec<(u64, String)> = seq(&c["ports"], "ports")
            .iter()
            .map(|p| {
                (
                    p["containerPort"].as_u64().unwrap(),
                    str_of(&p["protocol"], "protocol").to_string(),
                )
            })
            .collect();
        assert!(ports.contains(&(53, "UDP".into())) && ports.contains(&(53, "TCP".into())));
        // RBAC: Pods read exactly by the central shape.
        let role = objects.iter().find(|v| v["kind"] == "ClusterRole").unwrap();
        let reads_pods = seq(&role["rules"], "rules").iter().any(|r| {
            seq(&r["resources"], "resources")
                .iter()
                .any(|x| x.as_str() == Some("pods"))
        });
        assert_eq!(reads_pods, !node_local, "{shape}: pods in the ClusterRole");

        // The real binary takes the command line (loopback addresses swapped in).
        // A free port for healthz (0 is refused there, as by kube-proxy).
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let healthz_local = free.local_addr().unwrap().to_string();
        drop(free);
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut child = svcproxy_testkit::process::die_with_test(&mut Command::new(env!(
            "CARGO_BIN_EXE_svcproxy"
        )))
        .current_dir(repo())
        .args(&args)
        .args(["--manifests", "examples/cluster"])
        .args(["--dns-bind-address", "127.0.0.1:0"])
        .args(["--healthz-bind-address", &healthz_local])
        .args(["--dns-upstream", "none"])
        .env_remove("RUST_LOG")
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
        let start = std::time::Instant::now();
        let text = loop {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            if text.contains("svcproxy started") || child.try_wait().unwrap().is_some() {
                break text;
            }
            assert!(
                start.elapsed() < std::time::Duration::from_secs(20),
                "{shape}: not started:\n{text}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(text.contains("cluster DNS listening"), "{shape}:\n{text}");
        let complaints: Vec<&str> = text
            .lines()
            .filter(|l| {
                let l = l.to_lowercase();
                l.contains("warn") || l.contains("unknown") || l.contains("error")
            })
            .collect();
        assert!(complaints.is_empty(), "{shape}:\n{}", complaints.join("\n"));
    }
}

/// The eBPF data plane's shapes (deploy/ebpf, deploy/ipvs): `base`'s DaemonSet with
/// the BPF capability and nothing else (what operations.rs's least-privilege run of
/// the ebpf and ipvs modes grants: `Mode::capabilities`), the host's bpffs holding
/// `--ebpf-bpffs`, the host's cgroup v2 hierarchy at `--ebpf-cgroup` (read-only),
/// and no XDP unless asked for.
fn ebpf_shapes_add_only_what_the_data_plane_needs(base: &Value) {
    for (shape, _) in &SHAPES[1..] {
        let ds = the_in(shape, "DaemonSet");
        let c = container(&ds);
        let sc = &c["securityContext"];
        let mut add = strings(&sc["capabilities"]["add"], "capabilities.add");
        add.sort();
        assert_eq!(add, ["BPF", "NET_ADMIN", "NET_RAW"], "{shape}");
        for key in [
            "privileged",
            "readOnlyRootFilesystem",
            "allowPrivilegeEscalation",
            "seccompProfile",
            "runAsUser",
        ] {
            assert_eq!(
                sc[key],
                container(base)["securityContext"][key],
                "{shape}: securityContext.{key}"
            );
        }
        let pod = &ds["spec"]["template"]["spec"];
        let host_mount = |flag_value: &str, host: &str| -> Value {
            let m = seq(&c["volumeMounts"], "volumeMounts")
                .iter()
                .find(|m| {
                    Path::new(flag_value).starts_with(str_of(&m["mountPath"], "mountPath"))
                        && m["mountPath"] != "/etc/svcproxy"
                })
                .unwrap_or_else(|| panic!("{shape}: {flag_value} is not inside a volumeMount"));
            let v = seq(&pod["volumes"], "volumes")
                .iter()
                .find(|v| v["name"] == m["name"])
                .unwrap_or_else(|| panic!("{shape}: no volume {:?}", m["name"]));
            assert_eq!(
                v["hostPath"]["path"], host,
                "{shape}: {flag_value}'s volume"
            );
            m.clone()
        };
        let bpffs = flag(c, "ebpf-bpffs").expect("--ebpf-bpffs");
        let m = host_mount(&bpffs, "/sys/fs/bpf");
        assert_ne!(m["readOnly"], true, "{shape}: the pins are written");
        assert_ne!(
            Path::new(&bpffs),
            Path::new(str_of(&m["mountPath"], "mountPath")),
            "{shape}: svcproxy pins into a directory of its own"
        );
        let cgroup = flag(c, "ebpf-cgroup").expect("--ebpf-cgroup");
        let m = host_mount(&cgroup, "/sys/fs/cgroup");
        assert_eq!(
            m["readOnly"], true,
            "{shape}: the cgroup hierarchy is only attached to"
        );
        assert_eq!(
            cgroup,
            str_of(&m["mountPath"], "mountPath"),
            "{shape}: the root of the host's hierarchy"
        );
        assert_eq!(
            flag(c, "ebpf-xdp"),
            None,
            "{shape}: XDP is off unless asked for"
        );
        let host_paths = seq(&pod["volumes"], "volumes")
            .iter()
            .filter(|v| !v["hostPath"].is_null())
            .count();
        assert_eq!(
            host_paths, 2,
            "{shape}: the bpffs and the cgroup hierarchy only"
        );
    }
}

/// components/ebpf-pod-sockets, added to an ebpf shape, adds `SYS_ADMIN` and the
/// host's `/run/netns` (read-only, the runtime's later mounts propagated), and
/// nothing else.
#[test]
fn the_pod_sockets_component_adds_sys_admin_and_the_named_namespaces_only() {
    let mut objects = objects_of("deploy/ebpf");
    let before = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .cloned()
        .expect("a DaemonSet");
    apply_patches(
        &repo().join("deploy/components/ebpf-pod-sockets"),
        &mut objects,
    );
    let ds = objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let c = container(ds);
    let mut add = strings(&c["securityContext"]["capabilities"]["add"], "add");
    add.sort();
    assert_eq!(add, ["BPF", "NET_ADMIN", "NET_RAW", "SYS_ADMIN"]);
    let mounts = seq(&c["volumeMounts"], "volumeMounts");
    assert_eq!(
        mounts.len(),
        seq(&container(&before)["volumeMounts"], "m").len() + 1
    );
    let m = mounts
        .iter()
        .find(|m| m["mountPath"] == "/run/netns")
        .expect("/run/netns mounted");
    assert_eq!(m["readOnly"], true);
    assert_eq!(m["mountPropagation"], "HostToContainer");
    let pod = &ds["spec"]["template"]["spec"];
    let v = seq(&pod["volumes"], "volumes")
        .iter()
        .find(|v| v["name"] == m["name"])
        .expect("its volume");
    assert_eq!(v["hostPath"]["path"], "/run/netns");
    let mut rest = ds.clone();
    let mut was = before.clone();
    for o in [&mut rest, &mut was] {
        let spec = &mut o["spec"]["template"]["spec"];
        spec["volumes"] = Value::Null;
        spec["containers"][0]["volumeMounts"] = Value::Null;
        spec["containers"][0]["securityContext"]["capabilities"]["add"] = Value::Null;
    }
    assert_eq!(rest, was, "nothing else changes");
}
