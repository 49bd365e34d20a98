//! Helpers shared by the svcproxy-core integration tests: build objects from YAML,
//! feed them to a [`ClusterState`], and read snapshots and problems back.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Endpoints, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use svcproxy_core::model::{IpFamily, Protocol, ServiceName, ServicePortName};
use svcproxy_core::objects::{Kind, KubeObject, ObjectKey, SourceUpdate};
use svcproxy_core::problem::{Problem, Severity};
use svcproxy_core::snapshot::{NodeSnapshot, ServicePortView};
use svcproxy_core::state::{ClusterState, SnapshotUpdate, StateConfig};

/// The node every test state runs as.
pub const THIS_NODE: &str = "node-a";
/// The origin every upsert claims.
pub const ORIGIN: &str = "test.yaml";

fn parse<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    yaml_serde::from_str(yaml).unwrap_or_else(|e| panic!("bad test YAML: {e}\n{yaml}"))
}

pub fn service(yaml: &str) -> KubeObject {
    KubeObject::Service(parse::<Service>(yaml))
}
pub fn slice(yaml: &str) -> KubeObject {
    KubeObject::EndpointSlice(parse::<EndpointSlice>(yaml))
}
pub fn node(yaml: &str) -> KubeObject {
    KubeObject::Node(Box::new(parse::<Node>(yaml)))
}
pub fn service_cidr(yaml: &str) -> KubeObject {
    KubeObject::ServiceCidr(parse::<ServiceCIDR>(yaml))
}
pub fn endpoints(yaml: &str) -> KubeObject {
    KubeObject::Endpoints(parse::<Endpoints>(yaml))
}

/// A state running as [`THIS_NODE`] with no `--service-proxy-name`.
pub fn new_state() -> ClusterState {
    ClusterState::new(StateConfig {
        node_name: THIS_NODE.to_string(),
        service_proxy_name: None,
        ignore_external_ips: false,
        dns: false,
        without_snapshots: false,
    })
}

pub fn upsert(state: &mut ClusterState, object: KubeObject) {
    state.apply(SourceUpdate::Upsert {
        object,
        origin: ORIGIN.to_string(),
    });
}

pub fn delete(state: &mut ClusterState, kind: Kind, namespace: &str, name: &str) {
    state.apply(SourceUpdate::Delete(ObjectKey::new(kind, namespace, name)));
}

pub fn key(kind: Kind, namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(kind, namespace, name)
}

/// `ns/svc:port` over TCP.
pub fn tcp(namespace: &str, service: &str, port: &str) -> ServicePortName {
    port_name(namespace, service, port, Protocol::Tcp)
}

pub fn port_name(
    namespace: &str,
    service: &str,
    port: &str,
    protocol: Protocol,
) -> ServicePortName {
    ServicePortName::new(ServiceName::new(namespace, service), port, protocol)
}

/// The view of one service port in one family's snapshot, if proxied.
pub fn view<'a>(
    snap: &'a NodeSnapshot,
    name: &ServicePortName,
) -> Option<&'a Arc<ServicePortView>> {
    snap.service_ports.get(name)
}

/// The view of one service port, which must be proxied in that family.
pub fn must_view<'a>(snap: &'a NodeSnapshot, name: &ServicePortName) -> &'a Arc<ServicePortView> {
    view(snap, name).unwrap_or_else(|| {
        panic!(
            "{name} missing from the {} snapshot; it has {:?}",
            snap.family,
            snap.service_ports
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        )
    })
}

/// Every endpoint the slices list for the port, as `ip:port`.
pub fn all_endpoints(view: &ServicePortView) -> Vec<String> {
    view.endpoints.iter().map(ToString::to_string).collect()
}

/// The endpoints cluster-policy traffic may reach, as `ip:port`.
pub fn cluster_endpoints(view: &ServicePortView) -> Option<Vec<String>> {
    view.selection
        .cluster_endpoints
        .as_ref()
        .map(|v| v.iter().map(ToString::to_string).collect())
}

/// The service port names of one family's snapshot, printed.
pub fn port_names(snap: &NodeSnapshot) -> Vec<String> {
    snap.service_ports.keys().map(ToString::to_string).collect()
}

pub fn snapshot_of(state: &mut ClusterState, family: IpFamily) -> Arc<NodeSnapshot> {
    state.snapshot().family(family).clone()
}

/// The problems currently recorded for an object (empty when none).
pub fn problems_of(state: &ClusterState, key: &ObjectKey) -> Vec<Problem> {
    state.problems().get(key).cloned().unwrap_or_default()
}

/// The one problem recorded for `key` at `field`; checks its severity and that its
/// message is bounded and single-line. Panics, listing what was recorded, otherwise.
pub fn expect_problem(
    state: &ClusterState,
    key: &ObjectKey,
    field: &str,
    severity: Severity,
) -> Problem {
    let all = problems_of(state, key);
    let found: Vec<&Problem> = all.iter().filter(|p| p.field == field).collect();
    assert!(
        found.len() == 1,
        "expected exactly one problem for {key} at {field:?}; recorded: {:#?}",
        state.problems()
    );
    let p = found[0].clone();
    assert_eq!(p.severity, severity, "severity of {p}");
    assert_eq!(p.origin.as_deref(), Some(ORIGIN), "origin of {p}");
    assert_clean_message(&p);
    p
}

/// Asserts that the recorded problems of `key` are exactly these (field, severity)
/// pairs, in order.
pub fn expect_problems(state: &ClusterState, key: &ObjectKey, expected: &[(&str, Severity)]) {
    let got: Vec<(String, Severity)> = problems_of(state, key)
        .iter()
        .map(|p| (p.field.clone(), p.severity))
        .collect();
    let want: Vec<(String, Severity)> = expected.iter().map(|(f, s)| (f.to_string(), *s)).collect();
    assert_eq!(got, want, "problems of {key}: {:#?}", state.problems());
    for p in problems_of(state, key) {
        assert_clean_message(&p);
    }
}

pub fn expect_no_problems(state: &ClusterState) {
    assert!(
        state.problems().is_empty(),
        "expected no problems, got {:#?}",
        state.problems()
    );
    assert!(
        state.invalid_counts().is_empty(),
        "expected no invalid counts, got {:?}",
        state.invalid_counts()
    );
}

/// A problem's message and field are bounded and cannot forge a log line.
pub fn assert_clean_message(p: &Problem) {
    for (what, text) in [("message", &p.message), ("field", &p.field)] {
        assert!(
            text.chars().count() <= 1024,
            "{what} of a problem about {} is {} characters long",
            p.object.kind,
            text.chars().count()
        );
        assert!(
            !text.chars().any(char::is_control),
            "{what} contains a control character: {text:?}"
        );
    }
}

pub fn count(state: &ClusterState, kind: Kind) -> u64 {
    state.invalid_counts().get(&kind).copied().unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The healthy baseline every bad-input test keeps next to its bad object.

/// Nodes node-a and node-b (zone-a), node-c (zone-b), ServiceCIDR `cluster`, and the
/// Service default/web (10.96.0.10, port http 80 → 8080) with one IPv4 slice holding
/// 10.244.1.5 (node-a) and 10.244.2.5 (node-b).
pub fn add_baseline(state: &mut ClusterState) {
    for (name, v4, v6, zone, cidr) in [
        (
            "node-a",
            "192.168.0.1",
            "fd00::1",
            "zone-a",
            "10.244.1.0/24",
        ),
        (
            "node-b",
            "192.168.0.2",
            "fd00::2",
            "zone-a",
            "10.244.2.0/24",
        ),
        (
            "node-c",
            "192.168.0.3",
            "fd00::3",
            "zone-b",
            "10.244.3.0/24",
        ),
    ] {
        upsert(state, node(&node_yaml(name, v4, v6, zone, cidr)));
    }
    upsert(
        state,
        service_cidr(
            r#"
metadata: {name: cluster}
spec:
  cidrs: ["10.96.0.0/16", "fd00:96::/112"]
"#,
        ),
    );
    upsert(state, service(WEB_SERVICE));
    upsert(state, slice(WEB_SLICE));
}

pub fn node_yaml(name: &str, v4: &str, v6: &str, zone: &str, pod_cidr: &str) -> String {
    format!(
        r#"
metadata:
  name: {name}
  labels:
    kubernetes.io/hostname: {name}
    topology.kubernetes.io/zone: {zone}
spec:
  podCIDRs: ["{pod_cidr}"]
status:
  addresses:
  - {{type: InternalIP, address: "{v4}"}}
  - {{type: InternalIP, address: "{v6}"}}
"#
    )
}

pub const WEB_SERVICE: &str = r#"
metadata: {name: web, namespace: default}
spec:
  type: ClusterIP
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports:
  - {name: http, port: 80, targetPort: 8080, protocol: TCP}
"#;

pub const WEB_SLICE: &str = r#"
metadata:
  name: web-abc
  namespace: default
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.244.1.5]
  nodeName: node-a
  conditions: {ready: true}
- addresses: [10.244.2.5]
  nodeName: node-b
  conditions: {ready: true}
"#;

/// Asserts the baseline service still works: both its endpoints, cluster-wide.
pub fn assert_baseline_works(update: &SnapshotUpdate) {
    let web = must_view(&update.v4, &tcp("default", "web", "http"));
    assert_eq!(
        web.port.cluster_ips,
        vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()].into()
    );
    assert_eq!(
        cluster_endpoints(web),
        Some(vec![
            "10.244.1.5:8080".to_string(),
            "10.244.2.5:8080".to_string()
        ]),
        "the baseline service lost its endpoints"
    );
    assert!(update.v4.node.is_some(), "this node's Node object is known");
    assert!(update
        .v4
        .service_cidrs
        .contains(&"10.96.0.0/16".parse::<ipnet::IpNet>().unwrap()));
}
