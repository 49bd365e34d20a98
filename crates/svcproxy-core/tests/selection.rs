//! Endpoint selection tables: traffic policies, terminating fallback, topology keys
//! (the topology-aware service routing proposal's own test plan) and topology hints.
//!
//! The plan, stated once: this node is `node-a`. Nodes and their labels:
//!
//! | node   | zone   | rack |
//! |--------|--------|------|
//! | node-a | zone-1 | r1   |
//! | node-b | zone-1 | r2   |
//! | node-c | zone-2 | r1   |
//!
//! Endpoints are named after where they run: `local` (node-a), `zone` (node-b, same
//! zone), `far` (node-c, other zone), `nonode` (no nodeName), `unknown` (a node we
//! have no Node object for).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use svcproxy_core::model::*;
use svcproxy_core::selection::{select_endpoints, NodeContext, Selection};

const THIS_NODE: &str = "node-a";
const HOSTNAME: &str = "kubernetes.io/hostname";
const RACK: &str = "example.com/rack";

fn labels(node: &str, zone: &str, rack: &str) -> Labels {
    BTreeMap::from([
        (HOSTNAME.into(), node.into()),
        (LABEL_ZONE.into(), zone.into()),
        (RACK.into(), rack.into()),
    ])
}

fn nodes() -> BTreeMap<String, Labels> {
    BTreeMap::from([
        ("node-a".to_string(), labels("node-a", "zone-1", "r1")),
        ("node-b".to_string(), labels("node-b", "zone-1", "r2")),
        ("node-c".to_string(), labels("node-c", "zone-2", "r1")),
    ])
}

/// The endpoint called `name` in the plan, ready unless made otherwise.
fn ep(name: &str) -> Endpoint {
    let (ip, node, zone) = match name {
        "local" => ("10.0.1.1", Some("node-a"), Some("zone-1")),
        "local2" => ("10.0.1.2", Some("node-a"), Some("zone-1")),
        "zone" => ("10.0.2.1", Some("node-b"), Some("zone-1")),
        "far" => ("10.0.3.1", Some("node-c"), Some("zone-2")),
        "nonode" => ("10.0.4.1", None, None),
        "unknown" => ("10.0.5.1", Some("node-z"), None),
        other => panic!("no endpoint {other} in the plan"),
    };
    Endpoint {
        ip: ip.parse().unwrap(),
        port: 8080,
        info: Arc::new(EndpointInfo {
            node_name: node.map(Arc::from),
            zone: zone.map(Arc::from),
            ready: true,
            serving: true,
            terminating: false,
            zone_hints: Box::default(),
            node_hints: Box::default(),
        }),
    }
}

fn terminating(mut e: Endpoint) -> Endpoint {
    let info = Arc::make_mut(&mut e.info);
    info.ready = false;
    info.serving = true;
    info.terminating = true;
    e
}

fn not_serving(mut e: Endpoint) -> Endpoint {
    let info = Arc::make_mut(&mut e.info);
    info.ready = false;
    info.serving = false;
    info.terminating = true;
    e
}

fn not_ready(mut e: Endpoint) -> Endpoint {
    let info = Arc::make_mut(&mut e.info);
    info.ready = false;
    info.serving = false;
    e
}

fn zone_hints(mut e: Endpoint, zones: &[&str]) -> Endpoint {
    Arc::make_mut(&mut e.info).zone_hints = zones.iter().map(|&z| Arc::from(z)).collect();
    e
}

fn node_hints(mut e: Endpoint, nodes: &[&str]) -> Endpoint {
    Arc::make_mut(&mut e.info).node_hints = nodes.iter().map(|&n| Arc::from(n)).collect();
    e
}

fn name_of(e: &Endpoint) -> &'static str {
    for n in ["local", "local2", "zone", "far", "nonode", "unknown"] {
        if ep(n).ip == e.ip {
            return n;
        }
    }
    panic!("unplanned endpoint {e}")
}

fn names(eps: &Option<Arc<[Endpoint]>>) -> Option<Vec<&'static str>> {
    eps.as_ref().map(|v| {
        let mut n: Vec<_> = v.iter().map(|e| name_of(e)).collect();
        n.sort();
        n
    })
}

fn cluster_ip_port() -> ServicePort {
    ServicePort {
        name: ServicePortName::new(ServiceName::new("ns", "svc"), "http", Protocol::Tcp),
        service_type: ServiceType::ClusterIP,
        cluster_ips: vec!["10.96.0.10".parse::<IpAddr>().unwrap()].into(),
        port: 80,
        node_port: None,
        external_ips: vec![].into(),
        load_balancer_ingress: vec![].into(),
        load_balancer_source_ranges: None,
        external_traffic_policy: TrafficPolicy::Cluster,
        internal_traffic_policy: TrafficPolicy::Cluster,
        session_affinity_timeout: None,
        health_check_node_port: None,
        traffic_distribution: None,
        topology_mode: None,
        topology_keys: None,
        scheduler: None,
        endpoint_weights: None,
        maglev_table_size: None,
    }
}

fn node_port() -> ServicePort {
    ServicePort {
        service_type: ServiceType::NodePort,
        node_port: Some(30080),
        ..cluster_ip_port()
    }
}

fn keys(spec: &[&str]) -> Option<Arc<[TopologyKey]>> {
    Some(
        spec.iter()
            .map(|k| match *k {
                "*" => TopologyKey::Any,
                "hostname" => TopologyKey::Label(HOSTNAME.into()),
                "zone" => TopologyKey::Label(LABEL_ZONE.into()),
                "rack" => TopologyKey::Label(RACK.into()),
                other => TopologyKey::Label(other.into()),
            })
            .collect(),
    )
}

fn select_on(
    this_node: &str,
    all_nodes: &BTreeMap<String, Labels>,
    port: &ServicePort,
    eps: &[Endpoint],
) -> Selection {
    let empty = BTreeMap::new();
    let lookup = |n: &str| all_nodes.get(n);
    let ctx = NodeContext {
        node_name: this_node,
        labels: all_nodes.get(this_node).unwrap_or(&empty),
        node_labels: &lookup,
    };
    // The state hands selection each port's list sorted by address and port.
    let mut eps = eps.to_vec();
    eps.sort_by_key(|e| (e.ip, e.port));
    select_endpoints(port, &Arc::from(eps), &ctx)
}

fn select(port: &ServicePort, eps: &[Endpoint]) -> Selection {
    select_on(THIS_NODE, &nodes(), port, eps)
}

// ---------------------------------------------------------------------------
// The proposal's test plan: key sets × topologies.

/// The topologies each key set is tried against.
fn topology(name: &str) -> Vec<Endpoint> {
    match name {
        "on this node" => vec![ep("local"), ep("zone"), ep("far")],
        "same zone only" => vec![ep("zone"), ep("far")],
        "elsewhere only" => vec![ep("far")],
        "none" => vec![],
        "only terminating" => vec![terminating(ep("local")), terminating(ep("far"))],
        "terminating here, ready elsewhere" => vec![terminating(ep("local")), ep("far")],
        other => panic!("no topology {other}"),
    }
}

#[test]
fn topology_keys_follow_the_proposal_test_plan() {
    // (key set, topology, expected cluster endpoints)
    #[rustfmt::skip]
    let table: &[(&[&str], &str, &[&str])] = &[
        // No topology constraints: every usable endpoint.
        (&[], "on this node", &["far", "local", "zone"]),
        (&[], "same zone only", &["far", "zone"]),
        (&[], "elsewhere only", &["far"]),
        (&[], "none", &[]),
        (&[], "only terminating", &["far", "local"]),
        // A single hard constraint.
        (&["hostname"], "on this node", &["local"]),
        (&["hostname"], "same zone only", &[]),
        (&["hostname"], "elsewhere only", &[]),
        (&["hostname"], "none", &[]),
        (&["hostname"], "only terminating", &["local"]),
        (&["hostname"], "terminating here, ready elsewhere", &["local"]),
        // A lone "*": matches everything.
        (&["*"], "on this node", &["far", "local", "zone"]),
        (&["*"], "same zone only", &["far", "zone"]),
        (&["*"], "elsewhere only", &["far"]),
        (&["*"], "none", &[]),
        (&["*"], "only terminating", &["far", "local"]),
        // Several hard constraints, no final "*".
        (&["hostname", "zone"], "on this node", &["local"]),
        (&["hostname", "zone"], "same zone only", &["zone"]),
        (&["hostname", "zone"], "elsewhere only", &[]),
        (&["hostname", "zone"], "none", &[]),
        (&["hostname", "zone"], "only terminating", &["local"]),
        // Several constraints plus a final "*".
        (&["hostname", "zone", "*"], "on this node", &["local"]),
        (&["hostname", "zone", "*"], "same zone only", &["zone"]),
        (&["hostname", "zone", "*"], "elsewhere only", &["far"]),
        (&["hostname", "zone", "*"], "none", &[]),
        (&["hostname", "zone", "*"], "only terminating", &["local"]),
        // A ready endpoint under a later key beats a terminating one under an earlier key.
        (&["hostname", "*"], "terminating here, ready elsewhere", &["far"]),
        // A zone key takes every endpoint of the zone, this node's included.
        (&["zone"], "on this node", &["local", "zone"]),
        // Any label works as a key: rack r1 holds node-a and node-c.
        (&["rack"], "on this node", &["far", "local"]),
        (&["rack", "*"], "same zone only", &["far"]),
    ];
    let mut failures = Vec::new();
    for (key_set, topo, want) in table {
        let mut port = cluster_ip_port();
        port.topology_keys = if key_set.is_empty() {
            None
        } else {
            keys(key_set)
        };
        let got = select(&port, &topology(topo));
        let got_names = names(&got.cluster_endpoints).unwrap();
        if got_names != *want {
            failures.push(format!(
                "keys {key_set:?} / {topo}: want {want:?}, got {got_names:?} ({})",
                got.reason
            ));
        }
        // Local-policy traffic is not in play for a plain ClusterIP service.
        assert_eq!(got.local_endpoints, None);
        // REJECT vs DROP is about the whole cluster, not the topology.
        let topo_has_any = !topology(topo).is_empty();
        assert_eq!(got.has_any_endpoints, topo_has_any, "{key_set:?} / {topo}");
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn endpoints_without_a_known_node_match_only_the_wildcard() {
    let eps = [ep("nonode"), ep("unknown")];
    let mut port = cluster_ip_port();
    port.topology_keys = keys(&["hostname", "zone"]);
    assert_eq!(names(&select(&port, &eps).cluster_endpoints), Some(vec![]));
    port.topology_keys = keys(&["zone", "*"]);
    assert_eq!(
        names(&select(&port, &eps).cluster_endpoints),
        Some(vec!["nonode", "unknown"])
    );
}

#[test]
fn a_key_this_node_lacks_yields_nothing() {
    let mut all = nodes();
    // node-a has no rack label; node-c and node-b still do.
    all.get_mut("node-a").unwrap().remove(RACK);
    let mut port = cluster_ip_port();
    port.topology_keys = keys(&["rack"]);
    let eps = [ep("local"), ep("zone"), ep("far")];
    let sel = select_on(THIS_NODE, &all, &port, &eps);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec![]));
    assert!(sel.has_any_endpoints, "endpoints exist elsewhere");
    port.topology_keys = keys(&["rack", "zone"]);
    let sel = select_on(THIS_NODE, &all, &port, &eps);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local", "zone"]));
}

#[test]
fn a_node_without_its_node_object_matches_only_the_wildcard() {
    let mut all = nodes();
    all.remove("node-a");
    let mut port = cluster_ip_port();
    port.topology_keys = keys(&["hostname", "*"]);
    let sel = select_on(THIS_NODE, &all, &port, &[ep("local"), ep("far")]);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["far", "local"]));
    assert!(sel.reason.contains("topology key *"), "{}", sel.reason);
}

#[test]
fn two_nodes_with_different_labels_choose_different_endpoints() {
    let mut port = cluster_ip_port();
    port.topology_keys = keys(&["zone", "*"]);
    let eps = [ep("local"), ep("zone"), ep("far")];
    let on_a = select_on("node-a", &nodes(), &port, &eps);
    let on_c = select_on("node-c", &nodes(), &port, &eps);
    assert_eq!(names(&on_a.cluster_endpoints), Some(vec!["local", "zone"]));
    assert_eq!(names(&on_c.cluster_endpoints), Some(vec!["far"]));
}

// ---------------------------------------------------------------------------
// Readiness and the terminating fallback.

#[test]
fn readiness_and_terminating_fallback() {
    #[rustfmt::skip]
    let table: &[(&str, Vec<Endpoint>, &[&str])] = &[
        ("only ready endpoints serve", vec![ep("local"), not_ready(ep("far"))], &["local"]),
        ("ready endpoints win over serving-terminating ones",
            vec![terminating(ep("local")), ep("far")], &["far"]),
        ("with no ready endpoint, serving-terminating ones are used",
            vec![terminating(ep("local")), not_ready(ep("far"))], &["local"]),
        ("terminating endpoints that stopped serving are never used",
            vec![not_serving(ep("local"))], &[]),
        ("not-ready, not-terminating endpoints are never used", vec![not_ready(ep("local"))], &[]),
    ];
    for (case, eps, want) in table {
        let sel = select(&cluster_ip_port(), eps);
        assert_eq!(names(&sel.cluster_endpoints).unwrap(), *want, "{case}");
        assert_eq!(sel.has_any_endpoints, !want.is_empty(), "{case}");
    }
}

// ---------------------------------------------------------------------------
// Traffic policies.

#[test]
fn internal_local_policy_uses_only_this_nodes_endpoints() {
    let mut port = cluster_ip_port();
    port.internal_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("local"), ep("local2"), ep("far")]);
    assert_eq!(
        sel.cluster_endpoints, None,
        "no traffic uses the cluster policy"
    );
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local", "local2"]));
}

#[test]
fn internal_local_policy_with_endpoints_only_elsewhere_has_none_but_some_exist() {
    let mut port = cluster_ip_port();
    port.internal_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("far")]);
    assert_eq!(names(&sel.local_endpoints), Some(vec![]));
    assert!(sel.has_any_endpoints, "DROP, not REJECT");
}

#[test]
fn internal_local_policy_on_a_node_port_still_serves_external_traffic_cluster_wide() {
    let mut port = node_port();
    port.internal_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("local"), ep("far")]);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["far", "local"]));
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local"]));
}

#[test]
fn external_local_policy_keeps_cluster_endpoints_for_short_circuited_pod_traffic() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("local"), ep("far")]);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["far", "local"]));
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local"]));
}

#[test]
fn external_local_policy_only_matters_for_externally_reachable_ports() {
    let mut port = cluster_ip_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("local"), ep("far")]);
    assert_eq!(sel.local_endpoints, None);
}

#[test]
fn local_policy_with_only_terminating_local_endpoints_uses_them() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[terminating(ep("local")), ep("far")]);
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local"]));
    assert!(sel.reason.contains("serving-terminating"), "{}", sel.reason);
    // Cluster traffic still prefers the ready remote endpoint.
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["far"]));
}

#[test]
fn local_policy_prefers_ready_local_endpoints_over_terminating_local_ones() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[terminating(ep("local")), ep("local2")]);
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local2"]));
}

#[test]
fn local_policy_with_no_endpoints_anywhere_rejects() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[not_ready(ep("far"))]);
    assert_eq!(names(&sel.local_endpoints), Some(vec![]));
    assert!(!sel.has_any_endpoints);
}

#[test]
fn local_policies_take_precedence_over_topology_keys() {
    let mut port = node_port();
    port.internal_traffic_policy = TrafficPolicy::Local;
    port.topology_keys = keys(&["zone"]);
    let sel = select(&port, &[ep("local"), ep("zone"), ep("far")]);
    // Internal traffic: this node only. External (eTP Cluster) traffic: the keys.
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local"]));
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local", "zone"]));
}

// ---------------------------------------------------------------------------
// Topology hints and trafficDistribution.

fn hinted() -> Vec<Endpoint> {
    vec![
        zone_hints(ep("local"), &["zone-1"]),
        zone_hints(ep("zone"), &["zone-1"]),
        zone_hints(ep("far"), &["zone-2"]),
    ]
}

#[test]
fn zone_hints_are_used_when_the_service_opts_in() {
    for (case, td, mode) in [
        (
            "PreferSameZone",
            Some(TrafficDistribution::PreferSameZone),
            None,
        ),
        ("PreferClose", Some(TrafficDistribution::PreferClose), None),
        ("topology-mode Auto", None, Some("Auto")),
        ("topology-mode auto", None, Some("auto")),
    ] {
        let mut port = cluster_ip_port();
        port.traffic_distribution = td;
        port.topology_mode = mode.map(Into::into);
        let sel = select(&port, &hinted());
        assert_eq!(
            names(&sel.cluster_endpoints),
            Some(vec!["local", "zone"]),
            "{case}"
        );
        assert!(
            sel.reason.contains("zone hints for zone-1"),
            "{case}: {}",
            sel.reason
        );
    }
}

/// As upstream's `CategorizeEndpoints`: the hints are used whenever every ready endpoint
/// carries them, whatever the service says (the EndpointSlice controller only writes
/// them for services that asked, so a cluster whose controller wrote them routes the
/// same under svcproxy as under kube-proxy).
#[test]
fn hints_are_used_whenever_every_ready_endpoint_carries_them() {
    let sel = select(&cluster_ip_port(), &hinted());
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local", "zone"]));
    assert!(
        sel.reason.contains("zone hints for zone-1"),
        "{}",
        sel.reason
    );
    let mut port = cluster_ip_port();
    port.topology_mode = Some("Disabled".into());
    let sel = select(&port, &hinted());
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local", "zone"]));
    // Without hints, every endpoint.
    let plain = vec![ep("local"), ep("zone"), ep("far")];
    assert_eq!(
        names(&select(&cluster_ip_port(), &plain).cluster_endpoints),
        Some(vec!["far", "local", "zone"])
    );
}

#[test]
fn hints_are_ignored_when_some_ready_endpoint_has_none() {
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    let mut eps = hinted();
    eps.push(ep("nonode"));
    assert_eq!(
        names(&select(&port, &eps).cluster_endpoints),
        Some(vec!["far", "local", "nonode", "zone"])
    );
    // ...but a not-ready endpoint without hints does not spoil them.
    let mut eps = hinted();
    eps.push(not_ready(ep("nonode")));
    assert_eq!(
        names(&select(&port, &eps).cluster_endpoints),
        Some(vec!["local", "zone"])
    );
}

#[test]
fn hints_are_ignored_when_none_is_for_this_zone() {
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    let eps = vec![
        zone_hints(ep("zone"), &["zone-2"]),
        zone_hints(ep("far"), &["zone-2"]),
    ];
    assert_eq!(
        names(&select(&port, &eps).cluster_endpoints),
        Some(vec!["far", "zone"])
    );
}

#[test]
fn hints_are_ignored_on_a_node_without_a_zone_label() {
    let mut all = nodes();
    all.get_mut("node-a").unwrap().remove(LABEL_ZONE);
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    let sel = select_on(THIS_NODE, &all, &port, &hinted());
    assert_eq!(
        names(&sel.cluster_endpoints),
        Some(vec!["far", "local", "zone"])
    );
}

#[test]
fn node_hints_win_over_zone_hints() {
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameNode);
    let eps = vec![
        node_hints(zone_hints(ep("local"), &["zone-1"]), &["node-a"]),
        node_hints(zone_hints(ep("zone"), &["zone-1"]), &["node-b"]),
        node_hints(zone_hints(ep("far"), &["zone-2"]), &["node-c"]),
    ];
    let sel = select(&port, &eps);
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local"]));
    // node-b sees its own node hint.
    let on_b = select_on("node-b", &nodes(), &port, &eps[1..]);
    assert_eq!(names(&on_b.cluster_endpoints), Some(vec!["zone"]));
    let eps_without_b = [eps[0].clone(), eps[2].clone()];
    let on_b = select_on("node-b", &nodes(), &port, &eps_without_b);
    // With no endpoint hinted for node-b, node-b falls back to its zone's hints.
    assert_eq!(
        names(&on_b.cluster_endpoints),
        Some(vec!["local"]),
        "zone-1 hints"
    );
}

#[test]
fn hints_are_read_from_ready_endpoints_so_the_terminating_fallback_spans_all() {
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    let eps = vec![
        zone_hints(terminating(ep("local")), &["zone-1"]),
        zone_hints(terminating(ep("far")), &["zone-2"]),
    ];
    // No ready endpoint: hints are not chosen (they are read from ready endpoints),
    // so the fallback spans every serving-terminating endpoint, as upstream.
    assert_eq!(
        names(&select(&port, &eps).cluster_endpoints),
        Some(vec!["far", "local"])
    );
}

#[test]
fn hints_apply_to_cluster_traffic_only() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    let sel = select(&port, &hinted());
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local", "zone"]));
    assert_eq!(names(&sel.local_endpoints), Some(vec!["local"]));
}

#[test]
fn topology_keys_take_precedence_over_hints() {
    let mut port = cluster_ip_port();
    port.traffic_distribution = Some(TrafficDistribution::PreferSameZone);
    port.topology_keys = keys(&["hostname"]);
    let sel = select(&port, &hinted());
    assert_eq!(names(&sel.cluster_endpoints), Some(vec!["local"]));
}

#[test]
fn all_reachable_is_the_deduplicated_union() {
    let mut port = node_port();
    port.external_traffic_policy = TrafficPolicy::Local;
    let sel = select(&port, &[ep("local"), ep("far")]);
    let all: Vec<_> = sel.all_reachable().into_iter().map(name_of).collect();
    assert_eq!(all, vec!["local", "far"]);
}
