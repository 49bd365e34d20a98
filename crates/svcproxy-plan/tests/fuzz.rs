//! Generator-based fuzzing of the whole pure pipeline (issue 15, "Fuzz"): manifests
//! text → objects → cluster state → node snapshot → intent → each backend's rules, and
//! the kernel's own check of every ruleset, in a throwaway network namespace.
//!
//! Each case is two clusters, A then B, built from pools of valid, edge and hostile
//! values (names with quotes, braces and newlines; addresses with leading zeros,
//! loopback, multicast, of the wrong family; ports 0 and 65536; policies and
//! annotations misspelt; conditions missing), under a random proxy configuration. For
//! each case:
//! - nothing panics, and each cluster goes from text to both backends' rules within
//!   [`TIME_BOUND`];
//! - every quoted string of the nftables script is a sanitized comment (no user
//!   string reaches the rules' syntax);
//! - `nft -f` loads A's full script for real; the planner's partial script from A to
//!   B loads too and leaves exactly what a full load of B leaves;
//! - `iptables-restore --test` / `ip6tables-restore --test` accept A's and B's
//!   iptables-mode rules of each family;
//! - the eBPF mode's map contents brought from A to B by the delta equal B's
//!   built afresh.
//!
//! CI runs [`CI_CASES`] cases with a fixed seed; `scripts/fuzz.sh` runs many more
//! with a seed of its choosing (`SVCPROXY_FUZZ_CASES`, `SVCPROXY_FUZZ_SEED`). A failing
//! case is shrunk and printed as its manifests.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use common::Netns;
use ipnet::IpNet;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{json, Map, Value};
use svcproxy_core::manifest::{parse, Format};
use svcproxy_core::model::IpFamily;
use svcproxy_core::objects::{ObjectKey, SourceUpdate};
use svcproxy_core::state::{ClusterState, StateConfig};
use svcproxy_plan::names::is_sanitized_comment;
use svcproxy_plan::{
    iptables, nft, IntentBuilder, InterfaceName, LocalDetection, NodePortAddresses, PlanConfig,
};

/// Cases a CI run checks (each loads about a dozen rulesets into the kernel).
const CI_CASES: u32 = 48;
/// The seed of the CI run.
const CI_SEED: u64 = 0x5eed_2026_1124;
/// The longest one cluster may take from manifests text to both backends' rules
/// (a debug build on a loaded 2-core machine takes milliseconds).
const TIME_BOUND: Duration = Duration::from_secs(5);
const NODE: &str = "node-a";

// ---------------------------------------------------------------------------
// Pools of values: valid ones weighted in, edge and hostile ones mixed through.

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        30 => select(vec!["web", "db", "dns", "api", "a", "kube-dns", "x-1"]).prop_map(String::from),
        1 => select(vec![
            "",
            "UPPER",
            "a_b",
            "x;drop",
            "q\"uote",
            "}{",
            "new\nline",
            "é",
            "-lead",
            "a.b",
        ])
        .prop_map(String::from),
        1 => Just("l".repeat(300)),
    ]
}

fn port_name() -> impl Strategy<Value = Value> {
    prop_oneof![
        12 => select(vec!["http", "dns", "metrics", ""]).prop_map(|s| json!(s)),
        1 => select(vec!["HTTP", "a b", "\"}", "x".repeat(70).leak() as &str]).prop_map(|s| json!(s)),
        1 => Just(Value::Null),
    ]
}

/// Mostly `valid`, sometimes `odd`.
fn mostly(valid: Vec<&'static str>, odd: Vec<&'static str>) -> impl Strategy<Value = String> {
    prop_oneof![6 => select(valid), 1 => select(odd)].prop_map(String::from)
}

fn svc_ip() -> impl Strategy<Value = String> {
    mostly(
        vec![
            "10.96.0.10",
            "10.96.0.11",
            "10.96.0.12",
            "10.96.255.254",
            "203.0.113.7",
            "fd00:96::a",
            "fd00:96::b",
            "2001:db8::7",
        ],
        vec![
            "10.96.0.010",
            "172.30.0.041",
            "None",
            "",
            "0.0.0.0",
            "127.0.0.1",
            "169.254.1.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "ff02::1",
            "::ffff:10.96.0.5",
            "10.96.0.1.5",
            "not-an-ip",
            " 10.96.0.13",
        ],
    )
}

fn endpoint_ip() -> impl Strategy<Value = String> {
    mostly(
        vec![
            "10.244.0.5",
            "10.244.0.6",
            "10.244.1.5",
            "10.244.1.6",
            "10.0.0.2",
            "fd00:244::5",
            "fd00:244::6",
            "fd00:244:1::5",
        ],
        vec![
            "10.244.0.005",
            "127.0.0.1",
            "0.0.0.0",
            "::",
            "10.96.0.10",
            "garbage",
            "224.0.0.9",
        ],
    )
}

fn port() -> impl Strategy<Value = Value> {
    prop_oneof![
        30 => select(vec![53i64, 80, 443, 8080, 9000]).prop_map(|p| json!(p)),
        1 => select(vec![0i64, 1, 65535, 65536, -1]).prop_map(|p| json!(p)),
        1 => Just(json!("80")),
    ]
}

fn protocol() -> impl Strategy<Value = Value> {
    prop_oneof![
        20 => select(vec!["TCP", "UDP", "SCTP"]).prop_map(|p| json!(p)),
        1 => select(vec!["tcp", "ICMP", ""]).prop_map(|p| json!(p)),
        1 => Just(Value::Null),
    ]
}

fn cidr() -> impl Strategy<Value = String> {
    select(vec![
        "10.0.0.0/8",
        "203.0.113.0/24",
        " 198.51.100.0/24 ",
        "0.0.0.0/0",
        "10.0.0.1/32",
        "2001:db8::/32",
        "::/0",
        "203.0.113.000/025",
        "10.0.0.0/33",
        "nonsense",
    ])
    .prop_map(String::from)
}

/// Whether to set a field at all, weighted towards leaving it out.
fn maybe<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![2 => Just(None), 1 => s.prop_map(Some)]
}

/// A field set now and then.
fn rarely<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    prop_oneof![10 => Just(None), 1 => s.prop_map(Some)]
}

// ---------------------------------------------------------------------------
// Objects.

fn service_port() -> impl Strategy<Value = Value> {
    (
        port_name(),
        protocol(),
        port(),
        prop_oneof![
            port(),
            select(vec!["http", "dns", "nope"]).prop_map(|s| json!(s))
        ],
        maybe(prop_oneof![
            4 => (30000i64..=32767).prop_map(|p| json!(p)),
            1 => select(vec![0i64, 80, 70000]).prop_map(|p| json!(p)),
        ]),
    )
        .prop_map(|(name, protocol, port, target, node_port)| {
            let mut p = Map::new();
            p.insert("name".into(), name);
            p.insert("protocol".into(), protocol);
            p.insert("port".into(), port);
            p.insert("targetPort".into(), target);
            if let Some(np) = node_port {
                p.insert("nodePort".into(), np);
            }
            Value::Object(p)
        })
}

#[derive(Clone, Debug)]
struct ServiceShape {
    ns: String,
    name: String,
    spec: Value,
    annotations: Value,
    labels: Value,
    status: Value,
}

fn service() -> impl Strategy<Value = ServiceShape> {
    let spec = (
        mostly(
            vec!["ClusterIP", "NodePort", "LoadBalancer"],
            vec!["ExternalName", "Bogus"],
        ),
        prop::collection::vec(svc_ip(), 1..3),
        prop::collection::vec(service_port(), 1..4),
        prop::collection::vec(svc_ip(), 0..3),
        prop::collection::vec(cidr(), 0..3),
        (
            maybe(select(vec!["Local", "Cluster", "Bogus"])),
            maybe(select(vec!["Local", "Cluster"])),
            maybe(select(vec!["ClientIP", "None", "Sticky"])),
            maybe(select(vec![0i64, 1, 10800, 86400, 86401, -5])),
            maybe(prop_oneof![
                (30000i64..=32767).prop_map(|p| json!(p)),
                Just(json!(0))
            ]),
            maybe(select(vec![
                "PreferClose",
                "PreferSameZone",
                "PreferSameNode",
                "Nearby",
            ])),
            any::<bool>(),
        ),
    );
    let meta = (
        name(),
        name(),
        maybe(select(vec![
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone, *",
            "kubernetes.io/hostname, topology.kubernetes.io/zone, *",
            "*",
            ",,",
            "a\"b",
        ])),
        maybe(select(vec!["Auto", "auto", "Disabled", "garbage"])),
        rarely(select(vec!["svcproxy", "other", ""])),
        prop::bool::weighted(0.1),
    );
    let status = prop::collection::vec(
        (svc_ip(), maybe(select(vec!["VIP", "Proxy", "Bogus"]))),
        0..3,
    );
    (spec, meta, status).prop_map(|(spec, meta, status)| {
        let (ty, cluster_ips, ports, external_ips, ranges, more) = spec;
        let (etp, itp, affinity, timeout, hc_port, distribution, pnra) = more;
        let (name, ns, topology_keys, hints, proxy_name, headless) = meta;
        let mut s = Map::new();
        s.insert("type".into(), json!(ty));
        if let Some(first) = cluster_ips.first() {
            s.insert("clusterIP".into(), json!(first));
            s.insert("clusterIPs".into(), json!(cluster_ips));
        }
        s.insert("ports".into(), json!(ports));
        if !external_ips.is_empty() {
            s.insert("externalIPs".into(), json!(external_ips));
        }
        if !ranges.is_empty() {
            s.insert("loadBalancerSourceRanges".into(), json!(ranges));
        }
        if ty == "ExternalName" {
            s.insert("externalName".into(), json!("example.com"));
        }
        if let Some(v) = etp {
            s.insert("externalTrafficPolicy".into(), json!(v));
        }
        if let Some(v) = itp {
            s.insert("internalTrafficPolicy".into(), json!(v));
        }
        if let Some(v) = affinity {
            s.insert("sessionAffinity".into(), json!(v));
        }
        if let Some(t) = timeout {
            s.insert(
                "sessionAffinityConfig".into(),
                json!({"clientIP": {"timeoutSeconds": t}}),
            );
        }
        if let Some(p) = hc_port {
            s.insert("healthCheckNodePort".into(), p);
        }
        if let Some(d) = distribution {
            s.insert("trafficDistribution".into(), json!(d));
        }
        s.insert("publishNotReadyAddresses".into(), json!(pnra));
        let mut annotations = Map::new();
        if let Some(k) = topology_keys {
            annotations.insert("svcproxy.io/topology-keys".into(), json!(k));
        }
        if let Some(h) = hints {
            annotations.insert("service.kubernetes.io/topology-mode".into(), json!(h));
        }
        let mut labels = Map::new();
        if let Some(p) = proxy_name {
            labels.insert("service.kubernetes.io/service-proxy-name".into(), json!(p));
        }
        if headless {
            labels.insert("service.kubernetes.io/headless".into(), json!(""));
        }
        let ingress: Vec<Value> = status
            .into_iter()
            .map(|(ip, mode)| match mode {
                Some(m) => json!({"ip": ip, "ipMode": m}),
                None => json!({"ip": ip}),
            })
            .collect();
        ServiceShape {
            ns,
            name,
            spec: Value::Object(s),
            annotations: Value::Object(annotations),
            labels: Value::Object(labels),
            status: json!({"loadBalancer": {"ingress": ingress}}),
        }
    })
}

fn endpoint() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(endpoint_ip(), 1..3),
        (
            prop_oneof![4 => Just(Some(true)), 1 => maybe(any::<bool>())],
            maybe(any::<bool>()),
            maybe(any::<bool>()),
        ),
        maybe(select(vec!["node-a", "node-b", "node-x", ""])),
        maybe(select(vec!["zone-1", "zone-2", "z\"one"])),
        maybe(prop::collection::vec(
            select(vec!["zone-1", "zone-2"]),
            0..3,
        )),
        maybe(prop::collection::vec(
            select(vec!["node-a", "node-b"]),
            0..2,
        )),
        maybe(select(vec!["host-1", "UPPER"])),
    )
        .prop_map(
            |(addresses, (ready, serving, terminating), node, zone, zones, nodes, hostname)| {
                let mut e = Map::new();
                e.insert("addresses".into(), json!(addresses));
                let mut c = Map::new();
                for (k, v) in [
                    ("ready", ready),
                    ("serving", serving),
                    ("terminating", terminating),
                ] {
                    if let Some(v) = v {
                        c.insert(k.into(), json!(v));
                    }
                }
                e.insert("conditions".into(), Value::Object(c));
                if let Some(n) = node {
                    e.insert("nodeName".into(), json!(n));
                }
                if let Some(z) = zone {
                    e.insert("zone".into(), json!(z));
                }
                if let Some(h) = hostname {
                    e.insert("hostname".into(), json!(h));
                }
                let mut hints = Map::new();
                if let Some(z) = zones {
                    let z: Vec<Value> = z.into_iter().map(|n| json!({"name": n})).collect();
                    hints.insert("forZones".into(), json!(z));
                }
                if let Some(n) = nodes {
                    let n: Vec<Value> = n.into_iter().map(|n| json!({"name": n})).collect();
                    hints.insert("forNodes".into(), json!(n));
                }
                if !hints.is_empty() {
                    e.insert("hints".into(), Value::Object(hints));
                }
                Value::Object(e)
            },
        )
}

fn slice_port() -> impl Strategy<Value = Value> {
    (port_name(), protocol(), rarely(Just(())), port()).prop_map(|(name, protocol, unset, port)| {
        let port = unset.is_none().then_some(port);
        let mut p = Map::new();
        p.insert("name".into(), name);
        p.insert("protocol".into(), protocol);
        if let Some(port) = port {
            p.insert("port".into(), port);
        }
        Value::Object(p)
    })
}

/// An EndpointSlice: address type, endpoints, ports.
type SliceShape = (String, Vec<Value>, Vec<Value>);

/// Slices for a service.
fn slices() -> impl Strategy<Value = Vec<SliceShape>> {
    prop::collection::vec(
        (
            mostly(vec!["IPv4", "IPv6"], vec!["FQDN", "IPv7"]),
            prop::collection::vec(endpoint(), 0..5),
            prop::collection::vec(slice_port(), 1..3),
        ),
        0..3,
    )
}

#[derive(Clone, Debug)]
struct Cluster {
    services: Vec<(ServiceShape, Vec<SliceShape>)>,
    service_cidrs: Vec<String>,
    node_labels_zone: &'static str,
}

fn cluster() -> impl Strategy<Value = Cluster> {
    (
        prop::collection::vec((service(), slices()), 0..6),
        prop::collection::vec(
            mostly(
                vec!["10.96.0.0/16", "fd00:96::/108"],
                vec!["0.0.0.0/0", "10.0.0.0/24", "bad"],
            ),
            0..3,
        ),
        select(vec!["zone-1", "zone-2"]),
    )
        .prop_map(|(services, service_cidrs, node_labels_zone)| Cluster {
            services,
            service_cidrs,
            node_labels_zone,
        })
}

impl Cluster {
    /// The manifests, as one multi-document YAML file.
    fn yaml(&self) -> String {
        let mut docs = vec![
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-a", "labels": {
                    "kubernetes.io/hostname": "node-a",
                    "topology.kubernetes.io/zone": self.node_labels_zone}},
                "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24", "fd00:244::/64"]},
                "status": {"addresses": [
                    {"type": "InternalIP", "address": "10.0.0.1"},
                    {"type": "InternalIP", "address": "fd00::1"}]}
            }),
            json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "zone-2"}},
                "spec": {"podCIDRs": ["10.244.1.0/24", "fd00:244:1::/64"]}
            }),
        ];
        for (i, c) in self.service_cidrs.iter().enumerate() {
            docs.push(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
                "metadata": {"name": format!("cidr-{i}")},
                "spec": {"cidrs": [c]}
            }));
        }
        for (svc, slices) in &self.services {
            docs.push(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": svc.name, "namespace": svc.ns,
                    "annotations": svc.annotations, "labels": svc.labels},
                "spec": svc.spec,
                "status": svc.status,
            }));
            for (i, (address_type, endpoints, ports)) in slices.iter().enumerate() {
                docs.push(json!({
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": format!("{}-{i}", svc.name), "namespace": svc.ns,
                        "labels": {"kubernetes.io/service-name": svc.name}},
                    "addressType": address_type,
                    "endpoints": endpoints,
                    "ports": ports,
                }));
            }
        }
        docs.iter()
            .map(|d| yaml_serde::to_string(d).expect("yaml"))
            .collect::<Vec<_>>()
            .join("---\n")
    }
}

fn plan_config() -> impl Strategy<Value = PlanConfig> {
    (
        any::<bool>(),
        0usize..5,
        0usize..3,
        any::<bool>(),
        any::<bool>(),
        0usize..3,
    )
        .prop_map(
            |(masquerade_all, detect, node_ports, localhost, liberal, gate)| PlanConfig {
                masquerade_all,
                local_detection: match detect {
                    0 => LocalDetection::None,
                    1 => LocalDetection::ClusterCidr(vec![
                        "10.244.0.0/16".parse().unwrap(),
                        "fd00:244::/48".parse().unwrap(),
                    ]),
                    2 => LocalDetection::NodeCidr(Vec::new()),
                    3 => LocalDetection::BridgeInterface(InterfaceName::parse("cbr0").unwrap()),
                    _ => LocalDetection::InterfaceNamePrefix(InterfaceName::parse("veth").unwrap()),
                },
                node_ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
                nodeport_addresses: match node_ports {
                    0 => NodePortAddresses::Primary,
                    1 => NodePortAddresses::AllLocal,
                    _ => NodePortAddresses::Cidrs(vec![
                        "10.0.0.0/24".parse::<IpNet>().unwrap(),
                        "127.0.0.0/8".parse().unwrap(),
                    ]),
                },
                localhost_nodeports: localhost,
                conntrack_tcp_be_liberal: liberal,
                // KEP-6032's reject map, kept up to date by partial syncs too.
                localhost_gate: match gate {
                    0 => None,
                    g => Some(svcproxy_plan::LocalhostGate { tcp_only: g == 1 }),
                },
                ..PlanConfig::default()
            },
        )
}

// ---------------------------------------------------------------------------
// The pipeline and the checks.

/// Replaces the state's manifests-file objects with those of `yaml` (as the manifests
/// source does when a file changes); returns how long parsing and applying took.
fn load(state: &mut ClusterState, previous: &mut BTreeSet<ObjectKey>, yaml: &str) -> Duration {
    let start = Instant::now();
    let manifest = match parse(yaml, Format::Yaml, "fuzz.yaml") {
        Ok(m) => m,
        Err(_) => return start.elapsed(),
    };
    let keys: BTreeSet<ObjectKey> = manifest.objects.iter().map(|o| o.key.clone()).collect();
    for gone in previous.difference(&keys) {
        state.apply(SourceUpdate::Delete(gone.clone()));
    }
    for o in manifest.objects {
        state.apply(SourceUpdate::Upsert {
            object: (*o.object).clone(),
            origin: o.at.clone(),
        });
    }
    state.apply(SourceUpdate::HostAddresses(vec![
        "10.0.0.1".parse().unwrap(),
        "fd00::1".parse().unwrap(),
        "127.0.0.1".parse().unwrap(),
    ]));
    *previous = keys;
    start.elapsed()
}

/// Every quoted string of an nftables script is a sanitized comment, or one of the
/// configuration's interface names (the operator's, not the cluster's users').
fn quoted_strings_are_comments(script: &str) -> Result<(), String> {
    for line in script.lines() {
        let mut rest = line;
        while let Some(at) = rest.find('"') {
            let before = &rest[..at];
            let after = &rest[at + 1..];
            let end = after
                .find('"')
                .ok_or_else(|| format!("unbalanced quote: {line}"))?;
            let text = &after[..end];
            let before = before.trim_end().trim_end_matches("!=").trim_end();
            let interface = (before.ends_with("iifname") || before.ends_with("oifname"))
                && ["cbr0", "veth*"].contains(&text);
            let comment = before.ends_with("comment") && is_sanitized_comment(text);
            if !interface && !comment {
                return Err(format!(
                    "a quoted string that is not a sanitized comment: {line}"
                ));
            }
            rest = &after[end + 1..];
        }
    }
    Ok(())
}

fn restore_test(
    ns: &svcproxy_testkit::netns::Netns,
    family: IpFamily,
    input: &str,
) -> Result<(), String> {
    let cmd = iptables::restore_command(family);
    let out = svcproxy_testkit::netns::run(
        &mut ns.command(&[cmd, "-w", "--noflush", "--test"]),
        Some(input),
        Duration::from_secs(60),
    )
    .map_err(|e| format!("{cmd}: {e:#}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} --test rejected:\n{}\n{input}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

struct Kernel {
    nft: Netns,
    ipt: svcproxy_testkit::netns::Netns,
}

/// What the cases exercised, so that a generator that stops producing programmable
/// services fails the test rather than passing vacuously.
#[derive(Debug, Default)]
struct Coverage {
    rounds: u32,
    /// Rounds whose intent programs at least one service port.
    with_service_ports: u32,
    service_ports: usize,
    partial_plans: u32,
    rejected_objects: usize,
}

fn check_case(
    kernel: &Kernel,
    cov: &mut Coverage,
    a: &Cluster,
    b: &Cluster,
    cfg: &PlanConfig,
) -> Result<(), String> {
    let mut state = ClusterState::new(StateConfig {
        node_name: NODE.into(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    });
    let mut keys = BTreeSet::new();
    let nft_cfg = nft::SEMANTICS.apply(cfg.clone());
    let ipt_cfg = iptables::SEMANTICS.apply(cfg.clone());
    let mut builder = IntentBuilder::new();
    let mut planner = nft::Planner::new();
    let mut full_b = String::new();
    // eBPF: the map contents brought forward by each delta.
    let host = ["198.18.0.1".parse().unwrap(), "10.9.9.9".parse().unwrap()];
    let mut table: Option<svcproxy_plan::ebpf::Table> = None;
    for (round, cluster) in [a, b].into_iter().enumerate() {
        let started = Instant::now();
        let yaml = cluster.yaml();
        load(&mut state, &mut keys, &yaml);
        let up = state.snapshot();
        // nftables: the incremental pipeline the data plane runs.
        let delta = builder.update(&up.v4, &up.v6, &nft_cfg, &up.changed);
        let plan = planner.plan(builder.intent(), &delta, false);
        let full = planner.render(builder.intent());
        let fresh = svcproxy_plan::ebpf::Table::build(builder.intent(), &host);
        match table.as_mut() {
            None => table = Some(fresh),
            Some(t) => {
                t.update(builder.intent(), &delta, &host);
                if *t != fresh {
                    return Err(format!(
                        "round {round}: the eBPF table brought forward differs from a fresh one:\nforward:\n{}\nfresh:\n{}",
                        t.render(),
                        fresh.render()
                    ));
                }
            }
        }
        cov.rounds += 1;
        cov.service_ports += plan.stats.service_ports;
        cov.with_service_ports += u32::from(plan.stats.service_ports > 0);
        cov.partial_plans += u32::from(plan.kind == nft::PlanKind::Partial);
        cov.rejected_objects += state.problems().values().flatten().count();
        // iptables: a fresh intent under its semantics.
        let ipt_intent = svcproxy_plan::build_intent(&up.v4, &up.v6, &ipt_cfg);
        let ipt_inputs: Vec<(IpFamily, String)> = IpFamily::BOTH
            .into_iter()
            .filter_map(|f| {
                iptables::rules(&ipt_intent, f).map(|r| (f, r.restore(&HashMap::new())))
            })
            .collect();
        let took = started.elapsed();
        if took > TIME_BOUND {
            return Err(format!("round {round}: {took:?} from manifests to rules"));
        }
        quoted_strings_are_comments(&plan.script)?;
        quoted_strings_are_comments(&full)?;
        kernel.nft.nft_apply(&plan.script).map_err(|e| {
            format!(
                "round {round}: nft rejected the {:?} plan: {e}\n{}",
                plan.kind, plan.script
            )
        })?;
        planner.commit(&plan);
        for (family, input) in &ipt_inputs {
            restore_test(&kernel.ipt, *family, input).map_err(|e| format!("round {round}: {e}"))?;
        }
        full_b = full;
    }
    // The partial path left what a full load of B leaves.
    let after_partial = kernel.nft.ruleset_normalized();
    kernel
        .nft
        .nft_apply(&full_b)
        .map_err(|e| format!("nft rejected B's full script: {e}\n{full_b}"))?;
    let after_full = kernel.nft.ruleset_normalized();
    if after_partial != after_full {
        let only_partial: Vec<_> = after_partial
            .iter()
            .filter(|l| !after_full.contains(l))
            .collect();
        let only_full: Vec<_> = after_full
            .iter()
            .filter(|l| !after_partial.contains(l))
            .collect();
        return Err(format!(
            "the partial sync from A to B differs from a full load of B:\nonly after the partial: {only_partial:#?}\nonly after the full: {only_full:#?}"
        ));
    }
    // The next case starts from an empty namespace.
    kernel
        .nft
        .nft_apply(&nft::cleanup_script())
        .map_err(|e| format!("cleanup: {e}"))?;
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn manifests_to_rules_never_panic_stay_fast_and_load_into_the_kernel() {
    let Some(nft) = Netns::create("fuzz_nft") else {
        return;
    };
    let tools = ["iptables-restore", "ip6tables-restore"];
    let Some(ipt) = svcproxy_testkit::netns::Netns::create("fuzz_ipt", "fuzz", &tools) else {
        return;
    };
    let kernel = Kernel { nft, ipt };
    let cases = env_u64("SVCPROXY_FUZZ_CASES").map_or(CI_CASES, |n| n as u32);
    let seed = env_u64("SVCPROXY_FUZZ_SEED").unwrap_or(CI_SEED);
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes(seed)),
    );
    let started = Instant::now();
    let cov = std::cell::RefCell::new(Coverage::default());
    let result = runner.run(&(cluster(), cluster(), plan_config()), |(a, b, cfg)| {
        check_case(&kernel, &mut cov.borrow_mut(), &a, &b, &cfg).map_err(|e| {
            TestCaseError::fail(format!(
                "{e}\n--- cluster A ---\n{}\n--- cluster B ---\n{}\n--- config ---\n{cfg:#?}",
                a.yaml(),
                b.yaml()
            ))
        })
    });
    let cov = cov.into_inner();
    eprintln!(
        "[fuzz] {cases} cases (seed {seed:#x}) in {:?}: {cov:?}",
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("fuzz case failed (seed {seed:#x}):\n{e}");
    }
    // The generator reaches the rules: most rounds program services, partial plans
    // happen, and hostile values are rejected as well.
    assert!(cov.with_service_ports * 2 >= cov.rounds, "{cov:?}");
    assert!(cov.partial_plans * 4 >= cases, "{cov:?}");
    assert!(cov.rejected_objects > 0, "{cov:?}");
}

/// ChaCha's 32-byte seed from a `u64`.
fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(seed.wrapping_add(i as u64)).to_le_bytes());
    }
    bytes
}
